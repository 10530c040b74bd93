// Live export: FRAGCTL_REPORT_INTERVAL rewrites the JSON report (with the
// memory map) while the allocator lives, FRAGCTL_PROMETHEUS writes merged
// Prometheus text, and durations parse.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "fmt/format.h"
#include "fragctl/allocator_stack.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/run_report.hpp"
#include "fragctl/stats_export.hpp"
#include "nlohmann/json.hpp"
#include "support/test_support.hpp"

namespace fragctl {
namespace {

using fragctl::testing::read_file;
using fragctl::testing::occurrences;

namespace fs = std::filesystem;
using ::testing::HasSubstr;

fs::path temp_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("fragctl_{}_{}", name, ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(live_export, durations) {
  EXPECT_EQ(*parse_duration_ms("10s"), 10000u);
  EXPECT_EQ(*parse_duration_ms("10"), 10000u);
  EXPECT_EQ(*parse_duration_ms("0.5"), 500u);
  EXPECT_EQ(*parse_duration_ms("250ms"), 250u);
  EXPECT_EQ(*parse_duration_ms("2m"), 120000u);
  EXPECT_EQ(*parse_duration_ms("1h"), 3600000u);
  EXPECT_EQ(*parse_duration_ms(" 3 S "), 3000u);
  for (const char* bad : {"", "s", "ten", "-1s", "5 parsecs"}) EXPECT_FALSE(parse_duration_ms(bad).ok()) << bad;
  const auto cfg = parse_config("report_interval:30s,prometheus:/tmp/x.prom,report_map:false");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->report_interval_ms, 30000u);
  EXPECT_EQ(cfg->prometheus_path, "/tmp/x.prom");
  EXPECT_FALSE(cfg->report_map);
  EXPECT_THAT(std::string(parse_config("report_interval:soon").status().message()), HasSubstr("report_interval"));
}

TEST(live_export, environment) {
  ::setenv("FRAGCTL_REPORT_INTERVAL", "250ms", 1);
  ::setenv("FRAGCTL_PROMETHEUS", "/tmp/fragctl.prom", 1);
  const auto cfg = config_from_environment();
  ::setenv("FRAGCTL_REPORT_INTERVAL", "often", 1);
  const auto bad = config_from_environment();
  ::unsetenv("FRAGCTL_REPORT_INTERVAL");
  ::unsetenv("FRAGCTL_PROMETHEUS");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->report_interval_ms, 250u);
  EXPECT_EQ(cfg->prometheus_path, "/tmp/fragctl.prom");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("FRAGCTL_REPORT_INTERVAL"));
}

TEST(live_export, prometheus_text_merges_families) {
  allocator_stats a;
  a.allocator = "caching";
  a.backend = "sim";
  a.reserved = {10, 20};
  allocator_stats b = a;
  b.allocator = "arena";
  b.reserved = {30, 40};
  const std::string text = prometheus_text({a, b});
  EXPECT_EQ(occurrences(text, "# TYPE fragctl_reserved_bytes gauge\n"), 1u);
  EXPECT_EQ(occurrences(text, "# HELP fragctl_reserved_bytes "), 1u);
  EXPECT_THAT(text, HasSubstr("# TYPE fragctl_reserved_bytes gauge\n"
                              "fragctl_reserved_bytes{allocator=\"caching\",backend=\"sim\",device=\"0\"} 10\n"
                              "fragctl_reserved_bytes{allocator=\"arena\",backend=\"sim\",device=\"0\"} 30\n"));
  // Every sample line follows its family's TYPE line.
  EXPECT_EQ(occurrences(text, "# TYPE "), occurrences(to_prometheus(a), "# TYPE "));
}

// Polls until `done` or 20 s pass (the interval is 50 ms; the bound only
// keeps a broken build from hanging).
template <class F>
bool eventually(F done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

TEST(live_export, interval_rewrites_report_and_prometheus_file) {
  const fs::path dir = temp_dir("live_export");
  config cfg;
  cfg.backend = backend_kind::sim;
  cfg.policy = "caching";
  cfg.report_path = (dir / "job.json").string();
  cfg.prometheus_path = (dir / "job.prom").string();
  cfg.report_interval_ms = 50;
  auto stack = make_allocator(cfg);
  void* p = stack->allocator().allocate(3 * MiB);

  // A tick after the allocation has rewritten both files (the JSON document
  // is written first, so the Prometheus text is the one to wait for).
  const std::string live_sample =
      "fragctl_requested_bytes{allocator=\"caching\",backend=\"sim\",device=\"0\"} 3145728\n";
  ASSERT_TRUE(eventually([&] {
    return fs::exists(dir / "job.prom") && read_file(dir / "job.prom").find(live_sample) != std::string::npos;
  }));
  const auto doc = nlohmann::json::parse(read_file(dir / "job.json"));
  EXPECT_EQ(doc["reason"], "interval");
  ASSERT_EQ(doc["allocators"].size(), 1u);
  EXPECT_EQ(doc["allocators"][0]["requested_bytes"]["current"], 3 * MiB);
  const auto& map = doc["allocators"][0]["memory_map"];
  EXPECT_EQ(map["available"], true);
  ASSERT_EQ(map["segments"].size(), 1u);
  EXPECT_EQ(map["segments"][0]["size"], 20 * MiB);
  EXPECT_EQ(map["segments"][0]["blocks"][0]["use"], "live");
  EXPECT_EQ(map["segments"][0]["blocks"][0]["requested"], 3 * MiB);

  const std::string prom = read_file(dir / "job.prom");
  EXPECT_THAT(prom, HasSubstr("fragctl_requested_bytes{allocator=\"caching\",backend=\"sim\",device=\"0\"} 3145728\n"));
  EXPECT_THAT(prom, HasSubstr("fragctl_reserved_bytes{allocator=\"caching\",backend=\"sim\",device=\"0\"} 20971520\n"));
  // No temporary file is left behind for the collector to read.
  for (const auto& entry : fs::directory_iterator(dir))
    EXPECT_THAT(entry.path().filename().string(), ::testing::Not(HasSubstr(".tmp."))) << entry.path();

  // fragctl report reads the map back.
  const auto runs = load_run_reports((dir / "job.json").string());
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), 1u);
  ASSERT_EQ(runs->front().maps.size(), 1u);
  EXPECT_EQ(runs->front().maps.front().label, "when the report was written (interval)");
  EXPECT_EQ(runs->front().maps.front().map.bytes(block_use::live), 3 * MiB);

  stack->allocator().deallocate(p, 3 * MiB);
  stack.reset();
  EXPECT_EQ(nlohmann::json::parse(read_file(dir / "job.json"))["reason"], "destroy");
  EXPECT_THAT(read_file(dir / "job.prom"), HasSubstr("fragctl_requested_bytes{allocator=\"caching\",backend=\"sim\",device=\"0\"} 0\n"));
  fs::remove_all(dir);
}

TEST(live_export, report_map_off_leaves_the_map_out) {
  const fs::path dir = temp_dir("live_export_nomap");
  config cfg;
  cfg.backend = backend_kind::sim;
  cfg.policy = "caching";
  cfg.report_path = (dir / "job.json").string();
  cfg.report_map = false;
  auto stack = make_allocator(cfg);
  stack.reset();
  const auto doc = nlohmann::json::parse(read_file(dir / "job.json"));
  EXPECT_FALSE(doc["allocators"][0].contains("memory_map"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace fragctl
