// FRAGCTL_REPORT (fragctl/stats_export.hpp): the report file written when a stack is destroyed, on
// SIGUSR1 and on request, and the report document format.
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "fmt/format.h"
#include "fragctl/allocator_stack.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/process_hooks.hpp"
#include "fragctl/sim_backend.hpp"
#include "fragctl/stats_export.hpp"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "support/stats_export_support.hpp"
#include "support/test_support.hpp"

namespace fragctl {
namespace {

using fragctl::testing::export_entries;
using fragctl::testing::read_file;

std::string temp_path(std::string_view name) {
  return fmt::format("{}/fragctl_{}_{}", ::testing::TempDir(), ::getpid(), name);
}

config report_config(const std::string& path) {
  config cfg;
  cfg.policy = "caching";
  cfg.report_path = path;
  cfg.sim_capacity = 1 * GiB;
  return cfg;
}

std::unique_ptr<allocator_stack> sim_stack(const config& cfg) {
  return std::make_unique<allocator_stack>(std::make_unique<sim_backend>(sim_options{.capacity = cfg.sim_capacity}),
                                           cfg);
}

TEST(stats_export, written_when_the_stack_is_destroyed) {
  const std::string path = temp_path("destroy.json");
  std::remove(path.c_str());
  auto stack = sim_stack(report_config(path));
  device_allocator& a = stack->allocator();
  void* p = a.allocate(3 * MiB);
  a.deallocate(a.allocate(1000), 1000);
  EXPECT_FALSE(std::filesystem::exists(path));
  a.deallocate(p, 3 * MiB);
  stack.reset();

  ASSERT_TRUE(std::filesystem::exists(path));
  const std::string text = read_file(path);
  const nlohmann::json doc = nlohmann::json::parse(text);
  EXPECT_EQ(doc["schema_version"], stats_schema_version);
  EXPECT_EQ(doc["reason"], "destroy");
  EXPECT_EQ(doc["pid"], ::getpid());
  auto report = stats_export_from_json(text);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->size(), 1u);
  const allocator_stats& s = report->front();
  EXPECT_EQ(s.allocator, "caching");
  EXPECT_EQ(s.backend, "sim");
  EXPECT_EQ(s.allocations, 2u);
  EXPECT_EQ(s.frees, 2u);
  EXPECT_EQ(s.requested.current, 0u);
  EXPECT_EQ(s.requested.peak, 3 * MiB + 1000);
  EXPECT_GE(s.reserved.peak, 3 * MiB);
  EXPECT_FALSE(std::filesystem::exists(path + fmt::format(".tmp.{}", ::getpid())));
  std::remove(path.c_str());
}

TEST(stats_export, sigusr1_writes_the_report_of_live_stacks) {
  const std::string path = temp_path("signal.json");
  std::remove(path.c_str());
  auto stack = sim_stack(report_config(path));
  void* p = stack->allocator().allocate(5 * MiB);
  ASSERT_FALSE(std::filesystem::exists(path));

  ASSERT_EQ(std::raise(SIGUSR1), 0);
  // The writer thread wakes on the signal's pipe; wait for the file (bounded).
  // It appears whole or not at all (written beside it, then renamed).
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!std::filesystem::exists(path) && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(std::filesystem::exists(path)) << "no report was written after SIGUSR1";

  const std::string text = read_file(path);
  EXPECT_EQ(nlohmann::json::parse(text)["reason"], "signal");
  auto report = stats_export_from_json(text);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->size(), 1u);
  EXPECT_EQ(report->front().requested.current, 5 * MiB);
  EXPECT_EQ(report->front().allocations, 1u);

  stack->allocator().deallocate(p, 5 * MiB);
  stack.reset();
  std::remove(path.c_str());
}

TEST(stats_export, keeps_destroyed_stacks_and_lists_live_ones) {
  const std::string path = temp_path("two.json");
  auto first = sim_stack(report_config(path));
  auto second = sim_stack(report_config(path));
  first->allocator().deallocate(first->allocator().allocate(1 * MiB), 1 * MiB);
  void* p = second->allocator().allocate(2 * MiB);
  first.reset();

  EXPECT_GE(flush_process_outputs(), 1u);
  auto report = stats_export_from_json(read_file(path));
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->size(), 2u);
  EXPECT_EQ((*report)[0].requested.peak, 1 * MiB);
  EXPECT_EQ((*report)[0].requested.current, 0u);
  EXPECT_EQ((*report)[1].requested.current, 2 * MiB);

  second->allocator().deallocate(p, 2 * MiB);
  second.reset();
  std::remove(path.c_str());
}

// At exit the CUDA runtime can be gone before the exit hook writes, so the
// device memory cannot be measured then: the report keeps the figures of
// the last write that measured them instead of dropping them.
TEST(stats_export, a_write_that_cannot_measure_the_device_keeps_the_last_figures) {
  const std::string path = temp_path("device_memory.json");
  std::remove(path.c_str());
  int reads = 0;
  const int owner = 0;
  register_stats_export(&owner, stats_export_outputs{path, "", std::chrono::milliseconds(0)}, [&reads] {
    allocator_stats s;
    s.allocator = "arena";
    s.allocations = static_cast<std::uint64_t>(++reads);
    if (reads == 1) {  // the runtime answers only the first time
      s.device_memory.measured = true;
      s.device_memory.free = 3 * GiB;
      s.device_memory.total = 8 * GiB;
    }
    return s;
  });
  const auto written = [&] {
    EXPECT_GE(flush_process_outputs(), 1u);
    auto report = stats_export_from_json(read_file(path));
    EXPECT_TRUE(report.ok()) << report.status();
    return report.ok() && report->size() == 1 ? report->front() : allocator_stats{};
  };
  const allocator_stats first = written();
  EXPECT_EQ(first.allocations, 1u);
  ASSERT_TRUE(first.device_memory.measured);
  const allocator_stats second = written();
  EXPECT_EQ(second.allocations, 2u);  // the rest is read anew
  ASSERT_TRUE(second.device_memory.measured) << "the device memory was dropped";
  EXPECT_EQ(second.device_memory.free, 3 * GiB);
  EXPECT_EQ(second.device_memory.total, 8 * GiB);
  retire_stats_export(&owner);
  std::remove(path.c_str());
}

TEST(stats_export, document_round_trips_and_rejects_bad_entries) {
  allocator_stats a;
  a.allocator = "caching";
  a.allocations = 3;
  allocator_stats b;
  b.allocator = "buckets:caching";
  b.device = 1;
  auto back = stats_export_from_json(stats_export_to_json(export_entries({a, b}), "request"));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0].allocations, 3u);
  EXPECT_EQ((*back)[1].allocator, "buckets:caching");
  EXPECT_EQ((*back)[1].device, 1);

  const auto bad =
      stats_export_from_json(R"({"allocators": [{"schema_version": 1}, {"schema_version": 1, "ooms": -2}]})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("allocators[1]"), std::string::npos) << bad.status();
}

TEST(stats_export, unwritable_path_reports_an_error) {
  const absl::Status st = write_stats_export_file("/nonexistent/dir/report.json", {}, "request");
  EXPECT_FALSE(st.ok());
  EXPECT_NE(std::string(st.message()).find("/nonexistent/dir"), std::string::npos);
}

}  // namespace
}  // namespace fragctl
