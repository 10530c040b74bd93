// The stress benchmark's workloads and searches (benchmarks/stress): the
// generated sequences are well-formed and deterministic, grow with the scale,
// and the searches find the threshold of a monotone probe. CI-sized: small
// scales and few steps, on sim. No timings.
#include <map>
#include <string>

#include "benchmarks/stress/search.hpp"
#include "benchmarks/stress/workload_generators.hpp"
#include "fragctl/replay.hpp"
#include "fragctl/trace.hpp"
#include "gtest/gtest.h"

namespace fragctl::bench {
namespace {

using gen::plan;

trace to_trace(const plan& p) {
  trace t;
  t.name = "stress";
  for (const gen::event& e : p.events) {
    trace_event te;
    te.kind = e.alloc ? trace_event::action::alloc : trace_event::action::free;
    te.addr = e.id * 512;
    te.size = e.bytes;
    t.events.push_back(te);
  }
  return t;
}

class workloads : public ::testing::TestWithParam<std::string> {};

TEST_P(workloads, every_block_is_freed_once_with_its_size_and_steps_are_marked) {
  const plan p = gen::generate(GetParam(), 0.25, 3);
  ASSERT_EQ(p.step_end.size(), 3U);
  std::map<std::uint64_t, std::size_t> live;
  std::size_t bytes = 0, peak = 0;
  for (std::size_t i = 0; i < p.events.size(); ++i) {
    const gen::event& e = p.events[i];
    if (e.alloc) {
      EXPECT_GT(e.bytes, 0U);
      EXPECT_TRUE(live.emplace(e.id, e.bytes).second) << "id " << e.id << " allocated twice";
      bytes += e.bytes;
      peak = std::max(peak, bytes);
    } else {
      const auto it = live.find(e.id);
      ASSERT_NE(it, live.end()) << "free of id " << e.id << " that is not live";
      EXPECT_EQ(it->second, e.bytes);
      bytes -= e.bytes;
      live.erase(it);
    }
    const std::size_t step = std::upper_bound(p.step_end.begin(), p.step_end.end(), i) - p.step_end.begin();
    EXPECT_EQ(e.step, step) << "event " << i;
  }
  EXPECT_TRUE(live.empty());
  EXPECT_EQ(p.peak_live, peak);
  EXPECT_TRUE(std::is_sorted(p.step_end.begin(), p.step_end.end()));
}

TEST_P(workloads, are_deterministic_and_grow_with_the_scale) {
  const plan a = gen::generate(GetParam(), 0.5, 2);
  const plan b = gen::generate(GetParam(), 0.5, 2);
  ASSERT_EQ(a.events.size(), b.events.size());
  for (std::size_t i = 0; i < a.events.size(); ++i) {
    EXPECT_EQ(a.events[i].id, b.events[i].id);
    EXPECT_EQ(a.events[i].bytes, b.events[i].bytes);
  }
  EXPECT_GT(gen::generate(GetParam(), 1.0, 2).peak_live, a.peak_live);
}

TEST_P(workloads, run_out_of_memory_below_their_peak_and_complete_with_room_on_sim) {
  const plan p = gen::generate(GetParam(), 0.25, 2);
  const trace t = to_trace(p);
  for (const char* policy : {"caching", "arena"}) {
    replay_options tight{policy, {}, {}};
    tight.cfg.backend = backend_kind::sim;
    tight.cfg.log_level = "error";  // the out-of-memory warnings are expected here
    tight.cfg.sim_capacity = p.peak_live / 10 * 9;
    EXPECT_GT(replay(t, tight).ooms, 0U) << policy << " held less than the live bytes";
    replay_options roomy = tight;
    roomy.cfg.sim_capacity = 2 * p.peak_live + 64 * MiB;
    const replay_result r = replay(t, roomy);
    EXPECT_EQ(r.ooms, 0U) << policy;
    EXPECT_EQ(r.peak_requested, p.peak_live) << policy;
  }
}

INSTANTIATE_TEST_SUITE_P(stress, workloads, ::testing::ValuesIn(gen::scenario_names()));

TEST(stress_workloads, unknown_scenario_or_bad_scale_is_rejected) {
  EXPECT_THROW((void)gen::generate("no_such", 1.0), std::invalid_argument);
  EXPECT_THROW((void)gen::generate("zero3", 0.0), std::invalid_argument);
}

TEST(stress_search, largest_scale_finds_the_threshold_to_the_precision) {
  const auto r = search::largest_scale([](double x) { return x <= 2.5; }, 1.0, 1.0 / 64, 64.0, 0.01);
  ASSERT_TRUE(r.found);
  EXPECT_LE(r.scale, 2.5);
  EXPECT_GE(r.scale, 2.5 / 1.01);
  const auto small = search::largest_scale([](double x) { return x <= 0.3; }, 1.0, 1.0 / 64, 64.0, 0.01);
  ASSERT_TRUE(small.found);
  EXPECT_LE(small.scale, 0.3);
  EXPECT_GE(small.scale, 0.3 / 1.01);
  EXPECT_FALSE(search::largest_scale([](double) { return false; }, 1.0, 1.0 / 64, 64.0).found);
  EXPECT_EQ(search::largest_scale([](double) { return true; }, 1.0, 1.0 / 64, 64.0).scale, 64.0);
}

TEST(stress_search, smallest_cap_is_the_threshold_rounded_up_to_the_step) {
  constexpr std::size_t step = 2 * MiB;
  const std::size_t threshold = 1000 * MiB + 3;
  const auto r = search::smallest_cap([&](std::size_t cap) { return cap >= threshold; }, 900 * MiB,
                                      1200 * MiB, step);
  ASSERT_TRUE(r.found);
  EXPECT_EQ(r.cap, 1002 * MiB);
  // A starting point that fails is raised until it completes.
  const auto raised = search::smallest_cap([&](std::size_t cap) { return cap >= threshold; }, 900 * MiB,
                                           950 * MiB, step);
  ASSERT_TRUE(raised.found);
  EXPECT_EQ(raised.cap, 1002 * MiB);
  EXPECT_FALSE(search::smallest_cap([](std::size_t) { return false; }, 0, 100 * MiB, step).found);
}

}  // namespace
}  // namespace fragctl::bench
