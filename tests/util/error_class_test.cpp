// The one exception-to-class table (src/util/error_class.hpp) that the C API,
// the ZeRO-3 C API and the preload shim map to their codes.
#include <new>
#include <stdexcept>
#include <string>

#include "fragctl/error.hpp"
#include "gtest/gtest.h"
#include "util/error_class.hpp"

namespace fragctl {
namespace {

using util::error_class;

template <class E>
util::caught_error classify(const E& thrown, std::string& message) {
  try {
    throw thrown;
  } catch (...) {
    const util::caught_error e = util::classify_current_exception();
    message = std::string(e.message);  // the view lives only as long as the exception
    return e;
  }
}

TEST(error_class, each_exception_has_one_class_and_keeps_its_message) {
  std::string m;
  oom_details d;
  d.requested = 1024;
  EXPECT_EQ(classify(out_of_memory(d, "arena"), m).kind, error_class::out_of_memory);
  EXPECT_NE(m.find("arena: out of memory"), std::string::npos) << m;
  EXPECT_EQ(classify(std::bad_alloc(), m).kind, error_class::out_of_memory);
  EXPECT_EQ(classify(invalid_argument("bad size"), m).kind, error_class::invalid_argument);
  EXPECT_EQ(m, "bad size");
  EXPECT_EQ(classify(state_error("paused"), m).kind, error_class::state);
  EXPECT_EQ(m, "paused");
  EXPECT_EQ(classify(backend_error("driver", 999, "CUDA_ERROR_UNKNOWN"), m).kind, error_class::backend);
  EXPECT_EQ(m, "driver");
  EXPECT_EQ(classify(error("cannot open trace"), m).kind, error_class::other_fragctl);
  EXPECT_EQ(classify(std::runtime_error("boom"), m).kind, error_class::internal);
  EXPECT_EQ(m, "boom");
  EXPECT_EQ(classify(42, m).kind, error_class::unknown);
  EXPECT_EQ(m, "unknown exception");
}

}  // namespace
}  // namespace fragctl
