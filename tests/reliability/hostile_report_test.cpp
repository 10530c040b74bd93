// Hostile reports (issue 27; docs/reliability.md, "Bad inputs"): a report,
// a trace or a file name written to attack whoever reads it with `fragctl
// report`. Each test names what the code before the fix did and keeps a
// positive control.
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/json_io.hpp"
#include "fmt/format.h"
#include "fragctl/error.hpp"
#include "fragctl/memory_map.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/run_report.hpp"
#include "fragctl/sim_backend.hpp"
#include "fragctl/stats.hpp"
#include "fragctl/stats_export.hpp"
#include "nlohmann/json.hpp"
#include "support/test_support.hpp"

namespace fragctl {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string message_of(const absl::Status& s) { return std::string(s.message()); }

// H3: `fragctl report` on 100,000 nested arrays overflowed the stack (the
// copy in load.cpp); the other readers took such documents or crashed later.
TEST(hostile_report, json_nested_deeper_than_256_levels_is_an_error_naming_the_limit) {
  const auto nested = [](std::size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); };
  const std::string deep_report = R"({"schema_version": 1, "allocators": )" + nested(100000) + "}";
  const auto runs = run_reports_from_json(deep_report, "deep.json");
  ASSERT_FALSE(runs.ok());
  EXPECT_EQ(message_of(runs.status()),
            "deep.json: JSON nested deeper than 256 levels (byte 291); fragctl reads at most 256");

  const fs::path dir = fs::temp_directory_path() / fmt::format("fragctl_hostile_report_{}", ::getpid());
  fs::create_directories(dir);
  const fs::path file = dir / "deep.json";
  std::ofstream(file) << deep_report;
  const auto loaded = load_run_reports(file.string());
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(message_of(loaded.status()), HasSubstr(file.string() + ": JSON nested deeper than 256 levels"));

  // Statistics, report documents, memory maps: a deep field they would skip.
  const std::string stats = R"({"schema_version": 1, "allocator": "caching", "x": )" + nested(100000) + "}";
  EXPECT_THAT(message_of(stats_from_json(stats).status()), HasSubstr("stats JSON: JSON nested deeper than 256"));
  EXPECT_THAT(message_of(stats_export_from_json(stats).status()),
              HasSubstr("report JSON: JSON nested deeper than 256"));
  EXPECT_THAT(message_of(memory_snapshot_from_json(R"({"x": )" + nested(100000) + "}").status()),
              HasSubstr("memory map JSON: JSON nested deeper than 256"));
  // A PyTorch snapshot, with the line.
  const auto snapshot = parse_trace("{\n\"device_traces\": [" + nested(100000) + "]}", "snap.json");
  EXPECT_THAT(message_of(snapshot.status()),
              HasSubstr("snap.json:2: JSON nested deeper than 256 levels; fragctl reads at most 256"));
  // A warm-up profile stops the warmup policy.
  std::ofstream(dir / "profile.json") << stats;
  config cfg;
  cfg.backend = backend_kind::sim;
  cfg.warmup_profile = (dir / "profile.json").string();
  sim_backend sim;
  try {
    (void)make_policy("warmup:caching", cfg, sim);
    ADD_FAILURE() << "a warm-up profile nested 100,000 levels deep was taken";
  } catch (const invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("JSON nested deeper than 256 levels"));
  }
  fs::remove_all(dir);

  // Positive control: 256 levels in all read, 257 do not; brackets inside
  // strings do not count.
  const std::string at_limit = R"({"schema_version": 1, "allocator": "[[[{{{", "x": )" + nested(255) + "}";
  EXPECT_TRUE(stats_from_json(at_limit).ok()) << stats_from_json(at_limit).status();
  EXPECT_FALSE(stats_from_json(R"({"schema_version": 1, "x": )" + nested(256) + "}").ok());
  EXPECT_EQ(detail::json_too_deep(R"(["\"[[[", [[]]])", 2), 11u);
  EXPECT_FALSE(detail::json_too_deep(R"(["\"[[[", [[]]])", 3).has_value());
}

// A trace name from a file name that is not UTF-8 made every --json fail
// with nlohmann's "[json.exception.type_error.316] invalid UTF-8 byte".
TEST(hostile_report, a_name_that_is_not_utf8_is_written_as_u_fffd) {
  replay_result r;
  r.trace =
      "tr\xff"
      "ace";
  r.policy = "caching";
  r.stats.allocator = "caching\xc3";
  std::string text;
  ASSERT_NO_THROW(text = to_json(r));
  const auto j = nlohmann::json::parse(text);
  EXPECT_EQ(j["trace"],
            "tr\xef\xbf\xbd"
            "ace");
  EXPECT_EQ(j["stats"]["allocator"], "caching\xef\xbf\xbd");
  ASSERT_NO_THROW((void)to_json(std::vector<replay_result>{r}));
  memory_snapshot m;
  m.available = true;
  m.segments.push_back({0x1000, 4096, nullptr, "\xff", {}});
  ASSERT_NO_THROW(text = to_json(m));
  EXPECT_THAT(text, HasSubstr("\"pool\": \"\xef\xbf\xbd\""));
  // Positive control: UTF-8 is written as it is.
  r.trace =
      "tr\xc3\xa4"
      "ce";
  EXPECT_EQ(nlohmann::json::parse(to_json(r))["trace"],
            "tr\xc3\xa4"
            "ce");
}

}  // namespace
}  // namespace fragctl
