// The stress benchmarks' JSON (benchmarks/stress/stress_result.hpp, written
// with nlohmann-json): doubles keep every digit (the hand-written "%.6g" it
// replaces rounded 0.123456789 to 0.123457), strings are escaped, a
// non-finite number is null, and the series rows are in their documented order.
#include <limits>
#include <string>

#include "benchmarks/stress/stress_result.hpp"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace fragctl::bench {
namespace {

TEST(stress_result_json, round_trips_doubles_and_strings_exactly) {
  run_result r;
  r.scenario = "zero3 \"quoted\"\n";
  r.scale = 0.123456789012345;
  r.reserved_over_requested = 1.0000001;
  r.median_ns = std::numeric_limits<double>::quiet_NaN();
  r.peak_reserved = (std::size_t{1} << 53) + 1;
  r.series.push_back({3, 10, 20, 5, 15, 1234567});
  const auto j = nlohmann::json::parse(to_json(r, true));
  EXPECT_EQ(j["scenario"], r.scenario);
  EXPECT_EQ(j["scale"].get<double>(), r.scale);
  EXPECT_EQ(j["reserved_over_requested"].get<double>(), r.reserved_over_requested);
  EXPECT_TRUE(j["median_ns"].is_null());
  EXPECT_EQ(j["peak_reserved"].get<std::size_t>(), r.peak_reserved);
  ASSERT_EQ(j["series"].size(), 1u);
  EXPECT_EQ(j["series"][0], nlohmann::json::parse("[3, 10, 20, 5, 15, 1234567]"));
  EXPECT_FALSE(nlohmann::json::parse(to_json(r, false)).contains("series"));
}

}  // namespace
}  // namespace fragctl::bench
