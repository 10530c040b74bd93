// util::shared_library and util::symbol_binder: the one dlopen / dlsym helper
// of the GPU backends' loaders and the ZeRO-3 collectives.
#include "util/shared_library.hpp"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fmt/format.h"
#include "fragctl/error.hpp"
#include "gtest/gtest.h"

namespace fragctl::util {
namespace {

using cos_fn = double (*)(double);

TEST(shared_library, opens_the_first_name_that_loads_and_lists_the_others) {
  std::vector<shared_library::attempt> failed;
  const auto lib = shared_library::open({"libfragctl_no_such_library.so", "libm.so.6"}, failed);
  ASSERT_TRUE(lib.has_value());
  EXPECT_EQ(lib->name(), "libm.so.6");
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].name, "libfragctl_no_such_library.so");
  EXPECT_TRUE(failed[0].not_found()) << failed[0].error;

  const auto cos = lib->function<cos_fn>("cos");
  ASSERT_NE(cos, nullptr);
  EXPECT_EQ(cos(0.0), 1.0);
  EXPECT_EQ(lib->symbol("fragctl_no_such_symbol"), nullptr);
}

TEST(shared_library, tells_a_file_that_does_not_load_from_a_missing_one) {
  const std::string bogus =
      (std::filesystem::temp_directory_path() / fmt::format("fragctl_bogus_{}.so", ::getpid())).string();
  { std::ofstream(bogus) << "not an ELF object"; }
  std::vector<shared_library::attempt> failed;
  EXPECT_FALSE(shared_library::open({"libfragctl_no_such_library.so", bogus.c_str()}, failed).has_value());
  std::filesystem::remove(bogus);
  ASSERT_EQ(failed.size(), 2u);
  EXPECT_TRUE(failed[0].not_found()) << failed[0].error;
  EXPECT_FALSE(failed[1].not_found()) << failed[1].error;
  EXPECT_NE(failed[1].error.find(bogus), std::string::npos) << failed[1].error;
}

TEST(shared_library, required_function_names_owner_symbol_and_library) {
  std::vector<shared_library::attempt> failed;
  const auto lib = shared_library::open({"libm.so.6"}, failed);
  ASSERT_TRUE(lib.has_value());
  EXPECT_NE(lib->required_function<cos_fn>("cos", "test"), nullptr);
  try {
    (void)lib->required_function<cos_fn>("fragctl_no_such_symbol", "nccl");
    FAIL() << "a missing symbol was found";
  } catch (const backend_error& e) {
    EXPECT_EQ(std::string(e.what()), "nccl: symbol fragctl_no_such_symbol not found in libm.so.6");
    EXPECT_EQ(e.code_name(), "symbol_not_found");
  }
}

TEST(symbol_binder, remembers_the_first_missing_entry_until_taken) {
  std::vector<shared_library::attempt> failed;
  const auto lib = shared_library::open({"libm.so.6"}, failed);
  ASSERT_TRUE(lib.has_value());
  symbol_binder bind(*lib);
  cos_fn cos = nullptr;
  cos_fn first = nullptr;
  cos_fn second = nullptr;
  bind(cos, "cos");
  EXPECT_EQ(bind.take_missing(), nullptr);
  bind(first, "fragctl_missing_first");
  bind(second, "fragctl_missing_second");
  EXPECT_NE(cos, nullptr);
  EXPECT_EQ(first, nullptr);
  EXPECT_STREQ(bind.take_missing(), "fragctl_missing_first");
  EXPECT_EQ(bind.take_missing(), nullptr);
  bind.set(first, nullptr, "cuMemMap");
  EXPECT_STREQ(bind.take_missing(), "cuMemMap");
}

}  // namespace
}  // namespace fragctl::util
