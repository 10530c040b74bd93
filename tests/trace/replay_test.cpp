// The replay engine on the sim backend with small hand-made traces: peaks,
// operation counts, and the counted irregularities (unknown frees, OOMs and
// their skipped frees, lost frees), and stream mapping.
#include <algorithm>

#include "fragctl/backend.hpp"
#include "fragctl/error.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/replay.hpp"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "support/log_capture.hpp"
#include "support/trace_support.hpp"

namespace fragctl {
namespace {

using action = trace_event::action;
using fragctl::testing::hand_made_trace;

replay_options sim_options(std::size_t capacity = 80 * GiB) {
  replay_options o;
  o.policy = "caching";
  o.cfg.backend = backend_kind::sim;
  o.cfg.sim_capacity = capacity;
  return o;
}

TEST(Replay, PeaksAndCounts) {
  const trace t = hand_made_trace({
      {action::alloc, 0x1000, 1 * MiB, 0, 1},
      {action::alloc, 0x2000, 2 * MiB, 0, 2},
      {action::free, 0x1000, 1 * MiB, 0, 3},
      {action::free, 0x9999, 512, 0, 4},  // never allocated
      {action::alloc, 0x3000, 5 * MiB, 0, 5},
      {action::free, 0x2000, 2 * MiB, 0, 6},
      {action::free, 0x3000, 5 * MiB, 0, 7},
  });
  std::vector<std::pair<std::size_t, std::size_t>> progress;
  replay_options options = sim_options();
  options.progress = [&](std::size_t done, std::size_t total) { progress.emplace_back(done, total); };
  const replay_result r = replay(t, options);

  EXPECT_EQ(r.trace, "hand-made");
  EXPECT_EQ(r.policy, "caching");
  EXPECT_EQ(r.backend, "sim");
  EXPECT_EQ(r.peak_requested, 7 * MiB);  // 2 MiB + 5 MiB live together
  EXPECT_GE(r.peak_reserved, r.peak_requested);
  EXPECT_DOUBLE_EQ(r.reserved_over_requested,
                   static_cast<double>(r.peak_reserved) / static_cast<double>(r.peak_requested));
  EXPECT_EQ(r.operations, 6u);  // 3 allocates + 3 deallocates
  EXPECT_EQ(r.unknown_frees, 1u);
  EXPECT_EQ(r.ooms, 0u);
  EXPECT_EQ(r.skipped_frees, 0u);
  EXPECT_EQ(r.lost_frees, 0u);
  EXPECT_GT(r.backend_memory_calls, 0u);
  EXPECT_GE(r.backend_calls, r.backend_memory_calls);
  EXPECT_EQ(r.stats.requested.current, 0u);
  EXPECT_LE(r.median_ns, r.p99_ns);
  EXPECT_LE(r.median_ns, r.p90_ns);
  EXPECT_LE(r.p90_ns, r.p99_ns);
  EXPECT_LE(r.median_alloc_ns, r.p90_alloc_ns);
  EXPECT_LE(r.median_free_ns, r.p90_free_ns);
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.front(), std::make_pair(std::size_t{0}, t.events.size()));
  EXPECT_EQ(progress.back(), std::make_pair(t.events.size(), t.events.size()));
}

TEST(Replay, OomSkipsTheFreeOfTheFailedBlock) {
  const trace t = hand_made_trace({
      {action::alloc, 0x1000, 16 * MiB, 0, 1},
      {action::alloc, 0x2000, 1 * GiB, 0, 2},  // does not fit in 64 MiB
      {action::free, 0x2000, 1 * GiB, 0, 3},
      {action::free, 0x1000, 16 * MiB, 0, 4},
  });
  const replay_result r = replay(t, sim_options(64 * MiB));
  EXPECT_EQ(r.ooms, 1u);
  EXPECT_EQ(r.skipped_frees, 1u);
  EXPECT_EQ(r.unknown_frees, 0u);
  EXPECT_EQ(r.operations, 2u);  // the failed allocate is not timed
  EXPECT_EQ(r.peak_requested, 16 * MiB);
  EXPECT_LE(r.peak_reserved, 64 * MiB);
}

TEST(Replay, AllocOverALiveAddressFreesTheOldBlockFirst) {
  const trace t = hand_made_trace({
      {action::alloc, 0x1000, 1 * MiB, 0, 1},
      {action::alloc, 0x1000, 2 * MiB, 0, 2},  // the trace lost the free of the first block
      {action::free, 0x1000, 2 * MiB, 0, 3},
  });
  const replay_result r = replay(t, sim_options());
  EXPECT_EQ(r.lost_frees, 1u);
  EXPECT_EQ(r.peak_requested, 2 * MiB);
  EXPECT_EQ(r.operations, 4u);  // 2 allocates, the implied free, the free
  EXPECT_EQ(r.stats.requested.current, 0u);
}

TEST(Replay, BlocksLiveAtTheEndAreInTheStatsAndThenFreed) {
  const trace t = hand_made_trace({
      {action::alloc, 0x1000, 3 * MiB, 0, 1},
      {action::alloc, 0x2000, 1 * MiB, 0, 2},
      {action::free, 0x2000, 1 * MiB, 0, 3},
  });
  const replay_result r = replay(t, sim_options());
  EXPECT_EQ(r.stats.requested.current, 3 * MiB);  // taken after the last event
  EXPECT_EQ(r.peak_requested, 4 * MiB);
  EXPECT_EQ(r.operations, 3u);
}

TEST(Replay, EachNonZeroStreamIdGetsItsOwnStream) {
  const trace t = hand_made_trace({
      {action::alloc, 0x1000, 1 * MiB, 0, 1},
      {action::alloc, 0x2000, 1 * MiB, 77, 2},
      {action::alloc, 0x3000, 1 * MiB, 78, 3},
      {action::free, 0x2000, 1 * MiB, 77, 4},
      {action::alloc, 0x4000, 1 * MiB, 77, 5},
  });
  const replay_result r = replay(t, sim_options());
  EXPECT_EQ(r.stats.backend_calls.of(backend_call::create_stream), 2u);
  EXPECT_EQ(r.peak_requested, 3 * MiB);
}

// Low (red team): the trace's streams were destroyed before the replay's
// allocator, whose teardown still used them: a graph pool hands its kept
// blocks back on their streams, and every replay of a trace with streams
// logged "cannot record an event on stream ... was destroyed". The streams
// are the stack's now (allocator_stack::create_stream), destroyed after it.
TEST(Replay, TheAllocatorsTeardownFindsTheTracesStreamsAlive) {
  const trace t = hand_made_trace({
      {action::alloc, 0x1000, 1 * MiB, 5, 1},
      {action::free, 0x1000, 1 * MiB, 5, 2},
      {action::alloc, 0x2000, 2 * MiB, 7, 3},
      {action::free, 0x2000, 2 * MiB, 7, 4},
      {action::alloc, 0x3000, 3 * MiB, 7, 5},
  });
  for (const char* policy : {"graph_pool", "graph_pool:arena", "caching", "arena"}) {
    replay_options o = sim_options();
    o.policy = policy;
    const fragctl::testing::log_capture log;
    const replay_result r = replay(t, o);
    EXPECT_EQ(r.stats.backend_calls.of(backend_call::create_stream), 2u) << policy;
    EXPECT_EQ(log.text(), "") << policy;
  }
}

TEST(Replay, EmptyTrace) {
  const replay_result r = replay(hand_made_trace({}), sim_options());
  EXPECT_EQ(r.operations, 0u);
  EXPECT_EQ(r.peak_requested, 0u);
  EXPECT_EQ(r.median_ns, 0.0);
  EXPECT_EQ(r.reserved_over_requested, 0.0);
}

TEST(Replay, BadPolicyThrowsInvalidArgument) {
  replay_options o = sim_options();
  o.policy = "no-such-policy";
  EXPECT_THROW((void)replay(hand_made_trace({}), o), invalid_argument);
}

TEST(Replay, PolicySetCoversEveryRegisteredPolicyInADocumentedComposition) {
  const std::vector<std::string> set = replay_policy_set();
  EXPECT_EQ(set, documented_compositions());
  for (const policy_info& p : policies()) {
    const bool covered = std::any_of(set.begin(), set.end(), [&](const std::string& e) {
      return e == p.name || e.starts_with(std::string(p.name) + ":") ||
             e.find(":" + std::string(p.name)) != std::string::npos;
    });
    EXPECT_TRUE(covered) << p.name << " is in no composition --policy all replays";
  }
  for (const std::string& e : set) EXPECT_TRUE(validate_policy(e).ok()) << e;
}

// Issue 18: one row over 2^62 bytes (invalid_argument) aborted the policy's
// whole replay; it is counted as refused and the rest replays.
TEST(Replay, OversizedRowIsRefusedAndTheReplayGoesOn) {
  const trace t = hand_made_trace({
      {action::alloc, 0x1000, 1 * MiB, 0, 1},
      {action::alloc, 0x2000, SIZE_MAX, 0, 2},
      {action::alloc, 0x3000, 2 * MiB, 0, 3},
      {action::free, 0x2000, SIZE_MAX, 0, 4},
      {action::free, 0x1000, 1 * MiB, 0, 5},
      {action::free, 0x3000, 2 * MiB, 0, 6},
  });
  for (const char* policy : {"caching", "arena", "buckets:arena"}) {
    replay_options options = sim_options();
    options.policy = policy;
    const replay_result r = replay(t, options);
    EXPECT_EQ(r.refused, 1u) << policy;
    EXPECT_EQ(r.skipped_frees, 1u) << policy;
    EXPECT_EQ(r.ooms, 0u) << policy;
    EXPECT_EQ(r.peak_requested, 3 * MiB) << policy;
    EXPECT_EQ(r.operations, 4u) << policy;  // the two good allocs and their frees
    EXPECT_EQ(nlohmann::json::parse(to_json(r))["refused"].get<std::uint64_t>(), 1u);
  }
}

TEST(Replay, JsonHasEveryField) {
  const replay_result r = replay(hand_made_trace({{action::alloc, 0x1000, 4096, 0, 1}}), sim_options());
  const auto j = nlohmann::json::parse(to_json(std::vector<replay_result>{r, r}));
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 2u);
  for (const char* key : {"trace", "policy", "backend", "peak_requested", "peak_reserved",
                          "reserved_over_requested", "backend_memory_calls", "backend_calls", "ooms",
                          "refused", "unknown_frees", "skipped_frees", "lost_frees", "operations", "median_ns",
                          "p99_ns", "p90_ns", "median_alloc_ns", "p90_alloc_ns", "median_free_ns", "p90_free_ns",
                          "clock_overhead_ns", "stats"}) {
    EXPECT_TRUE(j[0].contains(key)) << key;
  }
  EXPECT_EQ(j[0]["peak_requested"].get<std::size_t>(), 4096u);
  EXPECT_EQ(j[0]["policy"], "caching");
}

}  // namespace
}  // namespace fragctl
