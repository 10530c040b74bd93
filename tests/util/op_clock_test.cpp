// util::op_clock: the clock that times one replayed operation. Its ticks must
// convert to the nanoseconds steady_clock sees over the same interval (the
// counter's rate is measured when the clock is made).
#include "util/op_clock.hpp"

#include <chrono>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace fragctl::util {
namespace {

using namespace std::chrono;

TEST(op_clock, names_its_source) {
  const op_clock clock;
  const std::string source = clock.source();
  EXPECT_TRUE(source == "tsc" || source == "steady_clock") << source;
}

// The interval between start() and stop() around a 20 ms sleep lies between
// the sleep and the steady_clock interval around both reads (a wrong rate,
// e.g. ticks taken for nanoseconds, is off by a factor of the clock's GHz).
TEST(op_clock, converts_an_interval_to_the_nanoseconds_steady_clock_sees) {
  const op_clock clock;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const auto outer0 = steady_clock::now();
    const op_clock::ticks t0 = clock.start();
    std::this_thread::sleep_for(milliseconds(20));
    const op_clock::ticks t1 = clock.stop();
    const auto outer1 = steady_clock::now();
    const double ns = clock.to_ns(static_cast<double>(t1 - t0));
    const auto outer = static_cast<double>(duration_cast<nanoseconds>(outer1 - outer0).count());
    EXPECT_GE(ns, 0.98 * 20e6) << clock.source();
    if (outer > 40e6) continue;  // preempted between the reads: too loose to judge the upper end
    EXPECT_LE(ns, 1.02 * outer) << clock.source();
    return;
  }
}

}  // namespace
}  // namespace fragctl::util
