// OOM diagnosis and live export on a real CUDA device: the three verdicts
// are provoked with the caching policy on the cuda backend (fragmentation:
// the device filled with 20 MiB segments whose 8 MiB holes are freed;
// another process: a second allocator holds most of the device; capacity: a
// request larger than the device), and the Prometheus file is written with
// the cuda backend's labels. Every test skips, saying why, where no CUDA
// device can be opened. Each diagnosis line is printed for the GPU script's
// summary (tools/gpu/report.sh).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "fmt/format.h"
#include "fragctl/allocator_stack.hpp"
#include "fragctl/error.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/process_hooks.hpp"

namespace fragctl {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

config cuda_config(const std::string& policy) {
  config cfg;
  cfg.backend = backend_kind::cuda;
  cfg.policy = policy;
  cfg.log_level = "off";
  return cfg;
}

class oom_cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    try {
      probe_ = make_allocator(cuda_config("caching"));
    } catch (const std::exception& e) {
      GTEST_SKIP() << "no CUDA device: " << e.what();
    }
    info_ = probe_->backend().get_memory_info();
    probe_.reset();
  }

  std::unique_ptr<allocator_stack> probe_;
  memory_info info_;
};

void print(const allocator_stats& s) {
  for (const oom_event& e : s.oom_events) std::printf("[diagnosis] %s\n", describe(e, s.allocator).c_str());
}

TEST_F(oom_cuda, fragmentation) {
  auto stack = make_allocator(cuda_config("caching"));
  device_allocator& a = stack->allocator();
  // 8 MiB + 12 MiB share one 20 MiB segment; fill the device with such pairs.
  std::vector<void*> holes;
  std::vector<void*> keep;
  for (;;) {
    try {
      void* hole = a.allocate(8 * MiB);
      holes.push_back(hole);
      keep.push_back(a.allocate(12 * MiB));
    } catch (const out_of_memory&) {
      break;
    }
  }
  ASSERT_GT(holes.size(), 100u);
  for (void* p : holes) a.deallocate(p, 8 * MiB);
  // 19 MiB needs a 20 MiB segment the device no longer has; the cache holds
  // gigabytes, but in 8 MiB holes.
  EXPECT_THROW((void)a.allocate(19 * MiB), out_of_memory);
  const allocator_stats s = stack->stats();
  ASSERT_FALSE(s.oom_events.empty());
  const oom_event& e = s.oom_events.back();
  print(s);
  EXPECT_EQ(e.verdict, oom_verdict::fragmentation);
  EXPECT_EQ(e.details.largest_free_block, 8 * MiB);
  EXPECT_GE(e.details.cached_free, holes.size() * 8 * MiB);
  EXPECT_THAT(e.advice, HasSubstr("FRAGCTL_POLICY=arena"));
  for (void* p : keep) a.deallocate(p, 12 * MiB);
}

TEST_F(oom_cuda, another_process_holds_the_memory) {
  // The "other process": a second allocator with its own backend takes 60%.
  auto other = make_allocator(cuda_config("caching"));
  const std::size_t taken = round_down(info_.free / 10 * 6, 2 * MiB);
  void* big = other->allocator().allocate(taken);
  auto stack = make_allocator(cuda_config("caching"));
  const std::size_t want = round_down(info_.total / 2, 2 * MiB);
  EXPECT_THROW((void)stack->allocator().allocate(want), out_of_memory);
  const allocator_stats s = stack->stats();
  ASSERT_EQ(s.oom_events.size(), 1u);
  print(s);
  EXPECT_EQ(s.oom_events[0].verdict, oom_verdict::other_process);
  EXPECT_GE(memory_used_by_others(s.oom_events[0].details), taken);
  other->allocator().deallocate(big, taken);
}

TEST_F(oom_cuda, true_capacity) {
  auto stack = make_allocator(cuda_config("caching"));
  EXPECT_THROW((void)stack->allocator().allocate(info_.total + GiB), out_of_memory);
  const allocator_stats s = stack->stats();
  ASSERT_EQ(s.oom_events.size(), 1u);
  print(s);
  EXPECT_EQ(s.oom_events[0].verdict, oom_verdict::capacity);
  EXPECT_EQ(s.oom_events[0].details.device_total, info_.total);
}

TEST_F(oom_cuda, prometheus_file_has_cuda_labels) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("fragctl_oom_cuda_{}", ::getpid());
  fs::create_directories(dir);
  config cfg = cuda_config("caching");
  cfg.prometheus_path = (dir / "gpu.prom").string();
  cfg.report_path = (dir / "gpu.json").string();
  auto stack = make_allocator(cfg);
  void* p = stack->allocator().allocate(64 * MiB);
  ASSERT_EQ(flush_process_outputs("request"), 2u);
  std::ifstream in(dir / "gpu.prom");
  std::ostringstream text;
  text << in.rdbuf();
  EXPECT_THAT(text.str(), HasSubstr("fragctl_requested_bytes{allocator=\"caching\",backend=\"cuda\",device=\"0\"} 67108864\n"));
  stack->allocator().deallocate(p, 64 * MiB);
  stack.reset();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace fragctl
