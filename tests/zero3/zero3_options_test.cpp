// ZeRO-3 options: DeepSpeed's names and defaults carry over; errors name the
// key; docs/zero3.md has a row per key.
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "fmt/format.h"
#include "fragctl/zero3/options.hpp"
#include "gtest/gtest.h"

namespace fragctl::zero3 {
namespace {

std::string row_default(std::string_view key) {
  for (const option_row& row : option_rows())
    if (row.key == key) return row.default_value;
  return "(no row)";
}

TEST(zero3_options, defaults_are_deepspeeds) {
  const options o;
  EXPECT_EQ(o.prefetch_bytes, 50'000'000U * 2);
  EXPECT_EQ(o.max_live_bytes, 1'000'000'000U * 2);
  EXPECT_EQ(o.persistence_threshold, 100'000U);
  EXPECT_EQ(o.gradient_type, data_type::bfloat16);
}

// Each documented default is formatted from a default-constructed options:
// parsed back, it gives the defaults (a disagreeing literal would not).
TEST(zero3_options, each_displayed_default_is_the_default_options_value) {
  for (const option_row& row : option_rows()) {
    const std::string text = fmt::format("{}:{}", row.key, row.default_value);
    auto o = parse_options(text);
    ASSERT_TRUE(o.ok()) << text << ": " << o.status();
    EXPECT_TRUE(*o == options{}) << text;
  }
  EXPECT_EQ(row_default("stage3_prefetch_bucket_size"), "5e7");
  EXPECT_EQ(row_default("prefetch_bytes"), "100MB");
  EXPECT_EQ(row_default("max_live_bytes"), "2GB");
}

TEST(zero3_options, deepspeed_counts_convert_with_the_element_size) {
  auto o = parse_options(
      "stage3_prefetch_bucket_size:5e6, stage3_max_live_parameters:3e8,stage3_param_persistence_threshold:1e4");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->prefetch_bytes, 10'000'000U);
  EXPECT_EQ(o->max_live_bytes, 600'000'000U);
  EXPECT_EQ(o->persistence_threshold, 10'000U);
  auto fp32 = parse_options("element_bytes:4,stage3_max_live_parameters:1000,gradient_type:fp32,prefetch:off");
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  EXPECT_EQ(fp32->max_live_bytes, 4000U);
  EXPECT_EQ(fp32->gradient_type, data_type::float32);
  EXPECT_FALSE(fp32->prefetch);
  auto bytes = parse_options("max_live_bytes:2GiB,prefetch_bytes:100MB,alignment:4096");
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(bytes->max_live_bytes, 2U << 30);
  EXPECT_EQ(bytes->prefetch_bytes, 100'000'000U);
  EXPECT_EQ(bytes->alignment, 4096U);
}

TEST(zero3_options, errors_name_the_key) {
  const auto message = [](std::string_view text) {
    auto o = parse_options(text);
    return o.ok() ? std::string("ok") : std::string(o.status().message());
  };
  EXPECT_NE(message("stage3_max_live_parameters:lots").find("stage3_max_live_parameters"), std::string::npos);
  EXPECT_NE(message("stage3_max_live_parameters:1.5").find("whole number"), std::string::npos);
  EXPECT_NE(message("stage3_bogus:1").find("unknown zero3 option \"stage3_bogus\""), std::string::npos);
  EXPECT_NE(message("alignment:300").find("power of two"), std::string::npos);
  EXPECT_NE(message("gradient_type:uint8").find("gradient_type"), std::string::npos);
  EXPECT_NE(message("prefetch").find("expected key:value"), std::string::npos);
}

TEST(zero3_options, docs_have_a_row_per_key) {
  const char* data = std::getenv("FRAGCTL_TEST_DATA");
  ASSERT_NE(data, nullptr) << "FRAGCTL_TEST_DATA is not set (run through ctest)";
  std::ifstream in(fmt::format("{}/../../docs/zero3.md", data));
  ASSERT_TRUE(in.good());
  std::stringstream s;
  s << in.rdbuf();
  const std::string doc = s.str();
  for (const option_row& row : option_rows()) {
    const std::string start = fmt::format("| `{}` |", row.key);
    const std::size_t at = doc.find(start);
    ASSERT_NE(at, std::string::npos) << "docs/zero3.md has no row " << start;
    const std::string line = doc.substr(at, doc.find('\n', at) - at);
    EXPECT_NE(line.find(row.default_value), std::string::npos) << row.key << ": default missing in " << line;
  }
}

}  // namespace
}  // namespace fragctl::zero3
