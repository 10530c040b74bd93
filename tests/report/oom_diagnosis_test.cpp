// OOM verdicts and advice (fragctl/oom.hpp), and the events the statistics
// keep and export.

#include "fragctl/adaptors.hpp"
#include "fragctl/allocator_stack.hpp"
#include "fragctl/oom.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/sim_backend.hpp"
#include "fragctl/stats.hpp"
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <vector>

namespace fragctl {
namespace {

using ::testing::HasSubstr;

oom_details details(std::size_t requested, std::size_t reserved, std::size_t cached_free, std::size_t largest,
                    std::size_t device_free, std::size_t device_total) {
  oom_details d;
  d.requested = requested;
  d.reserved = reserved;
  d.cached_free = cached_free;
  d.largest_free_block = largest;
  d.device_free = device_free;
  d.device_total = device_total;
  return d;
}

TEST(oom_diagnosis, verdicts) {
  // 6 GiB free in the cache in pieces of at most 1 GiB, 1 GiB on the device.
  const oom_details frag = details(4 * GiB, 70 * GiB, 6 * GiB, GiB, GiB, 80 * GiB);
  EXPECT_EQ(diagnose(frag), oom_verdict::fragmentation);
  EXPECT_EQ(memory_used_by_others(frag), 9 * GiB);

  // Nothing free anywhere, nothing held by others.
  const oom_details full = details(4 * GiB, 79 * GiB, GiB, GiB, GiB, 80 * GiB);
  EXPECT_EQ(diagnose(full), oom_verdict::capacity);
  EXPECT_EQ(memory_used_by_others(full), 0u);

  // 30 GiB used by another process; without it the request fits.
  const oom_details shared = details(8 * GiB, 49 * GiB, GiB, GiB, GiB, 80 * GiB);
  EXPECT_EQ(memory_used_by_others(shared), 30 * GiB);
  EXPECT_EQ(diagnose(shared), oom_verdict::other_process);

  // Others hold a little, but not enough to explain it: capacity.
  const oom_details big = details(40 * GiB, 78 * GiB, 0, 0, GiB, 80 * GiB);
  EXPECT_EQ(diagnose(big), oom_verdict::capacity);
}

// Every process holds some memory outside its allocator (the runtime's
// context, workspaces, modules): up to min(2 GiB, 1/32 of the device) of it
// is not blamed on another process.
TEST(oom_diagnosis, the_runtime_allowance_is_not_another_process) {
  // 80 GiB device: allowance 2 GiB. 1.5 GiB held outside, 1 GiB free, a
  // 2 GiB request: without the allowance it would read "another process".
  const oom_details runtime_only = details(2 * GiB, 77 * GiB + GiB / 2, 0, 0, GiB, 80 * GiB);
  EXPECT_EQ(runtime_allowance(runtime_only), 2 * GiB);
  EXPECT_EQ(memory_used_by_others(runtime_only), GiB + GiB / 2);
  EXPECT_EQ(memory_beyond_runtime(runtime_only), 0u);
  EXPECT_EQ(diagnose(runtime_only), oom_verdict::capacity);
  // 30 GiB outside: 28 GiB beyond the allowance, and without them it fits.
  const oom_details shared = details(8 * GiB, 49 * GiB, GiB, GiB, GiB, 80 * GiB);
  EXPECT_EQ(memory_beyond_runtime(shared), 28 * GiB);
  EXPECT_EQ(diagnose(shared), oom_verdict::other_process);
  // A small device: the allowance is 1/32 of it.
  EXPECT_EQ(runtime_allowance(details(MiB, 0, 0, 0, 0, 64 * MiB)), 2 * MiB);
}

// The statistics adaptor records what was held outside when it started; the
// verdict sets the runtime's allowance apart from memory others hold.
TEST(oom_diagnosis, statistics_record_the_memory_held_outside_at_start) {
  sim_backend sim(sim_options{.capacity = 64 * MiB});  // allowance 2 MiB
  void* context = sim.allocate(2 * MiB);                // held before fragctl starts, like a CUDA context
  config cfg;
  cfg.log_level = "off";
  statistics_adaptor a(make_policy("caching", cfg, sim));
  std::vector<void*> live;
  for (int i = 0; i < 3; ++i) live.push_back(a.allocate(20 * MiB));  // 60 of the 62 MiB left
  EXPECT_THROW((void)a.allocate(20 * MiB), out_of_memory);
  allocator_stats s = a.stats();
  ASSERT_EQ(s.oom_events.size(), 1u);
  EXPECT_EQ(s.oom_events[0].details.outside_at_start, 2 * MiB);
  EXPECT_EQ(memory_used_by_others(s.oom_events[0].details), 2 * MiB);
  EXPECT_EQ(s.oom_events[0].verdict, oom_verdict::capacity) << "the runtime's 2 MiB are not another process";
  EXPECT_THAT(describe(s.oom_events[0], "caching"), HasSubstr("used by others 2.00 MiB (2.00 MiB when the allocator started)"));

  // Something else takes 20 MiB: now the request would fit without it.
  a.deallocate(live.back(), 20 * MiB);
  live.pop_back();
  a.release_cached();
  void* intruder = sim.allocate(20 * MiB);
  ASSERT_NE(intruder, nullptr);
  EXPECT_THROW((void)a.allocate(20 * MiB), out_of_memory);
  s = a.stats();
  ASSERT_EQ(s.oom_events.size(), 2u);
  EXPECT_EQ(s.oom_events[1].verdict, oom_verdict::other_process);
  EXPECT_EQ(memory_beyond_runtime(s.oom_events[1].details), 20 * MiB);

  const auto back = stats_from_json(to_json(s));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->oom_events[1].details.outside_at_start, 2 * MiB);

  for (void* p : live) a.deallocate(p, 20 * MiB);
  a.release_cached();
  sim.free(intruder, 20 * MiB);
  sim.free(context, 2 * MiB);
}

// Issue 17: one OOM read "caused by fragmentation: no" in what() and
// "verdict: fragmentation" in the log and statistics: what() had its own rule.
TEST(oom_diagnosis, what_and_the_log_print_one_verdict) {
  // 6 GiB free in the cache, one block of 5 GiB that the policy could not use
  // (another stream's), 1 GiB on the device: a 4 GiB request.
  const oom_details d = details(4 * GiB, 70 * GiB, 6 * GiB, 5 * GiB, GiB, 80 * GiB);
  EXPECT_EQ(diagnose(d), oom_verdict::fragmentation);
  EXPECT_TRUE(d.caused_by_fragmentation());
  EXPECT_THAT(std::string(out_of_memory(d, "caching").what()), HasSubstr("caused by fragmentation: yes"));
  EXPECT_THAT(describe(make_oom_event(d, "caching", true), "caching"), HasSubstr("verdict: fragmentation"));
  // Every verdict: caused_by_fragmentation exactly when the verdict says so.
  for (const oom_details& x : {d, details(4 * GiB, 79 * GiB, GiB, GiB, GiB, 80 * GiB),
                               details(8 * GiB, 49 * GiB, GiB, GiB, GiB, 80 * GiB),
                               details(GiB, 10 * GiB, 0, 0, 20 * GiB, 80 * GiB)}) {
    EXPECT_EQ(x.caused_by_fragmentation(), diagnose(x) == oom_verdict::fragmentation);
  }
}

TEST(oom_diagnosis, memory_the_device_had_is_declined_not_fragmentation) {
  // 20 GiB free on the device and a 1 GiB request that failed anyway.
  const oom_details d = details(GiB, 10 * GiB, 0, 0, 20 * GiB, 80 * GiB);
  EXPECT_EQ(diagnose(d), oom_verdict::declined);
  EXPECT_EQ(to_string(oom_verdict::declined), "declined");
  EXPECT_THAT(std::string(out_of_memory(d, "warmup:caching").what()),
              HasSubstr("caused by fragmentation: no: the device has that much free memory"));
  EXPECT_THAT(oom_advice(oom_verdict::declined, d, "warmup:caching", true), HasSubstr("warmup_on_exhausted:grow"));
  EXPECT_THAT(oom_advice(oom_verdict::declined, d, "caching", true), HasSubstr("20.00 GiB was free"));
  EXPECT_THAT(describe(make_oom_event(d, "caching", true), "caching"), HasSubstr("verdict: declined"));
}

TEST(oom_diagnosis, advice_names_one_setting) {
  const oom_details d = details(4 * GiB, 70 * GiB, 6 * GiB, GiB, GiB, 80 * GiB);
  EXPECT_THAT(oom_advice(oom_verdict::fragmentation, d, "caching", true), HasSubstr("FRAGCTL_POLICY=arena"));
  EXPECT_THAT(oom_advice(oom_verdict::fragmentation, d, "caching", false), HasSubstr("max_split_size"));
  EXPECT_THAT(oom_advice(oom_verdict::fragmentation, d, "warmup:arena", true),
              HasSubstr("FRAGCTL_POLICY=buckets:arena"));
  EXPECT_THAT(oom_advice(oom_verdict::capacity, d, "arena", true), HasSubstr("batch size"));
  EXPECT_THAT(oom_advice(oom_verdict::other_process, d, "arena", true), HasSubstr("9.00 GiB"));
}

TEST(oom_diagnosis, describe_states_every_number) {
  oom_event e = make_oom_event(details(4 * GiB, 70 * GiB, 6 * GiB, GiB, GiB, 80 * GiB), "caching", true);
  e.stream = 0x10;
  const std::string line = describe(e, "caching");
  for (const char* part : {"could not allocate 4.00 GiB", "stream 0x10", "reserved 70.00 GiB", "cached free 6.00 GiB",
                           "largest free block 1.00 GiB", "device free 1.00 GiB of 80.00 GiB",
                           "used by others 9.00 GiB", "verdict: fragmentation", "try FRAGCTL_POLICY=arena"}) {
    EXPECT_THAT(line, HasSubstr(part));
  }
}

// A fragmented caching cache on a 64 MiB sim device: the statistics keep the
// event with the verdict, and the JSON report carries it.
TEST(oom_diagnosis, statistics_keep_the_latest_events) {
  config cfg;
  cfg.backend = backend_kind::sim;
  cfg.sim_capacity = 64 * MiB;
  cfg.policy = "caching";
  cfg.log_level = "off";
  const auto stack = make_allocator(cfg);
  device_allocator& a = stack->allocator();
  // Three 20 MiB segments (60 MiB held), each with an 8 MiB hole.
  std::vector<void*> holes;
  std::vector<void*> keep;
  for (int i = 0; i < 3; ++i) {
    holes.push_back(a.allocate(8 * MiB));
    keep.push_back(a.allocate(12 * MiB));
  }
  for (void* p : holes) a.deallocate(p, 8 * MiB);
  // 24 MiB are free in the cache plus 4 MiB on the device, none of it in one
  // 16 MiB piece.
  for (int i = 0; i < 10; ++i) EXPECT_THROW((void)a.allocate(16 * MiB), out_of_memory);

  const allocator_stats s = stack->stats();
  EXPECT_EQ(s.ooms, 10u);
  ASSERT_EQ(s.oom_events.size(), oom_events_kept);
  const oom_event& last = s.oom_events.back();
  EXPECT_EQ(last.sequence, 6u + 10u);
  EXPECT_EQ(last.details.requested, 16 * MiB);
  EXPECT_EQ(last.details.reserved, 60 * MiB);
  EXPECT_EQ(last.details.cached_free, 24 * MiB);
  EXPECT_EQ(last.details.largest_free_block, 8 * MiB);
  EXPECT_EQ(last.verdict, oom_verdict::fragmentation);
  EXPECT_THAT(last.advice, HasSubstr("FRAGCTL_POLICY=arena"));

  const auto back = stats_from_json(to_json(s));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->oom_events.size(), oom_events_kept);
  EXPECT_EQ(back->oom_events.back().sequence, last.sequence);
  EXPECT_EQ(back->oom_events.back().details.largest_free_block, 8 * MiB);
  EXPECT_EQ(back->oom_events.back().verdict, oom_verdict::fragmentation);
  EXPECT_EQ(back->oom_events.back().advice, last.advice);

  for (void* p : keep) a.deallocate(p, 12 * MiB);
}

}  // namespace
}  // namespace fragctl
