// Bad inputs of issue 18 (docs/reliability.md, "Bad inputs"): values that used
// to be taken silently or with a wrong result. Each test names the row it
// pins and fails on the code before the fix.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "fragctl/allocator_stack.hpp"
#include "fragctl/config.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/run_report.hpp"
#include "fragctl/stats.hpp"
#include "support/log_capture.hpp"

namespace fragctl {
namespace {

using fragctl::testing::log_capture;

std::string message_of(const absl::Status& s) { return std::string(s.message()); }

std::string stats_json() {
  allocator_stats s;
  s.allocator = "caching";
  s.requested = {1024, 4096};
  s.reserved = {2 * MiB, 2 * MiB};
  return to_json(s);
}

// Rendered an allocator of zeros.
TEST(bad_input_reports, an_allocator_without_statistics_is_an_error_naming_the_file) {
  const auto bare = run_reports_from_json(R"({"schema_version": 1})", "bare.json");
  ASSERT_FALSE(bare.ok());
  EXPECT_NE(message_of(bare.status()).find("bare.json: allocators[0]: no \"requested_bytes\""), std::string::npos)
      << bare.status();
  const auto in_list = run_reports_from_json(R"({"schema_version": 1, "allocators": [{"schema_version": 1}]})",
                                             "listed.json");
  ASSERT_FALSE(in_list.ok());
  EXPECT_NE(message_of(in_list.status()).find("listed.json: allocators[0]"), std::string::npos);
  // Positive control: a whole statistics object reads.
  const auto good = run_reports_from_json(stats_json(), "good.json");
  ASSERT_TRUE(good.ok()) << good.status();
  ASSERT_EQ(good->size(), 1U);
  EXPECT_EQ(good->front().stats.reserved.peak, 2 * MiB);
}

// Printed nothing and exited 0.
TEST(bad_input_reports, an_empty_allocators_list_is_an_error) {
  const auto empty = run_reports_from_json(R"({"schema_version": 1, "reason": "exit", "allocators": []})", "e.json");
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(message_of(empty.status()), "e.json: the report lists no allocators");
  const auto one = run_reports_from_json(R"({"schema_version": 1, "allocators": [)" + stats_json() + "]}", "o.json");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->size(), 1U);
}

// Threw nlohmann's type_error.302 without the file's name.
TEST(bad_input_reports, a_field_of_the_wrong_type_is_an_error_naming_file_and_field) {
  const std::string map = R"("memory_map": {"ranges": []})";
  const std::string stats = stats_json();
  const std::string with_map = stats.substr(0, stats.rfind('}')) + ", " + map + "}";
  const struct {
    std::string json;
    std::string expected;
  } rows[] = {
      {R"({"schema_version": 1, "reason": 5, "allocators": [)" + with_map + "]}",
       "r.json: field \"reason\": expected a string"},
      {R"([{"trace": "t", "policy": 7, "stats": )" + stats + "}]", "r.json: [0]: field \"policy\": expected a string"},
      {R"([{"trace": ["t"], "policy": "caching", "stats": )" + stats + "}]",
       "r.json: [0]: field \"trace\": expected a string"},
      {R"([{"trace": "t", "policy": "caching", "stats": )" + stats + "}, 3]",
       "r.json: [1]: expected a replay result with \"stats\""},
      {R"({"schema_version": 1, "allocators": [{"schema_version": 1, "requested_bytes": 5, "reserved_bytes": {}}]})",
       "r.json: allocators[0]: field \"requested_bytes\": expected an object"},
  };
  for (const auto& row : rows) {
    const auto r = run_reports_from_json(row.json, "r.json");
    ASSERT_FALSE(r.ok()) << row.json;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(message_of(r.status()).find(row.expected), std::string::npos) << row.json << " -> " << r.status();
  }
  const auto good = run_reports_from_json(R"([{"trace": "t", "policy": "caching", "stats": )" + stats + "}]", "r.json");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->front().name, "t / caching");
}

// Ignored silently before.
TEST(bad_input_environment, a_misspelt_fragctl_variable_warns_naming_the_closest_one) {
  ASSERT_EQ(::setenv("FRAGCTL_POLICYS", "caching", 1), 0);
  ASSERT_EQ(::setenv("FRAGCTL_SCRIPT_KNOB", "1", 1), 0);  // not close to any: a script's, left alone
  const log_capture log;
  const auto cfg = config_from_environment();
  ::unsetenv("FRAGCTL_POLICYS");
  ::unsetenv("FRAGCTL_SCRIPT_KNOB");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_NE(log.text().find("FRAGCTL_POLICYS is not a fragctl variable and is ignored; did you mean FRAGCTL_POLICY?"),
            std::string::npos)
      << log.text();
  EXPECT_EQ(log.text().find("FRAGCTL_SCRIPT_KNOB"), std::string::npos) << log.text();
  EXPECT_EQ(log.text().find("FRAGCTL_TEST_DATA"), std::string::npos) << "set by CTest: " << log.text();
}

// max_split_size under arena was ignored silently.
TEST(bad_input_config, an_option_of_a_policy_not_built_warns_naming_the_policy) {
  const auto build = [](const char* policy, const char* conf) {
    auto cfg = parse_config(conf);
    EXPECT_TRUE(cfg.ok()) << cfg.status();
    cfg->policy = policy;
    cfg->backend = backend_kind::sim;
    const log_capture log;
    (void)make_allocator(*cfg);
    return log.text();
  };
  const std::string arena = build("arena", "sim_capacity:1GiB,max_split_size:512MiB,release_threshold:0");
  EXPECT_NE(arena.find("FRAGCTL_CONF: max_split_size is an option of the caching policy, which policy arena does "
                       "not use; ignored"),
            std::string::npos)
      << arena;
  EXPECT_EQ(arena.find("release_threshold"), std::string::npos) << "an arena option under arena: " << arena;
  const std::string buckets = build("buckets:arena", "slab_size:4MiB,warmup_bytes:1GiB");
  EXPECT_NE(buckets.find("warmup_bytes is an option of the warmup policy, which policy buckets:arena"),
            std::string::npos)
      << buckets;
  EXPECT_EQ(buckets.find("slab_size"), std::string::npos) << buckets;
  // Positive controls: the same option under the policy it belongs to, and
  // one that a second policy uses too (warmup shapes its pre-fill by small_size).
  EXPECT_EQ(build("buckets:caching", "max_split_size:512MiB").find("max_split_size"), std::string::npos);
  EXPECT_EQ(build("warmup:arena", "small_size:512KiB").find("small_size"), std::string::npos);
  EXPECT_NE(build("arena", "small_size:512KiB").find("small_size is an option of the caching policy"),
            std::string::npos);
}

// report_interval:0.4ms became 0, which means off.
TEST(bad_input_config, a_value_below_the_unit_is_an_error_not_zero) {
  const auto interval = parse_config("report_interval:0.4ms");
  ASSERT_FALSE(interval.ok());
  EXPECT_NE(message_of(interval.status()).find("\"0.4ms\" is less than 1 ms"), std::string::npos)
      << interval.status();
  const auto size = parse_config("small_size:0.3B");
  ASSERT_FALSE(size.ok());
  EXPECT_NE(message_of(size.status()).find("less than one byte"), std::string::npos) << size.status();
  // Positive controls: 0 is off, and values at the unit round as before.
  ASSERT_TRUE(parse_config("report_interval:0").ok());
  EXPECT_EQ(parse_config("report_interval:0.6ms")->report_interval_ms, 1U);
  EXPECT_EQ(parse_config("report_interval:0.0015s")->report_interval_ms, 2U);
  EXPECT_EQ(*parse_size("0.5B"), 1U);
  EXPECT_EQ(*parse_size("0"), 0U);
}

}  // namespace
}  // namespace fragctl
