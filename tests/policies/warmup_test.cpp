// The warmup policy: pre-fill from a byte count or a previous run's report,
// zero backend calls afterwards, and what happens when the profile was too
// small. On the sim backend (accounting mode) over caching and arena.
#include "allocator_policies/warmup/warmup_policy.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "allocator_policies/caching/caching_policy.hpp"
#include "fragctl/adaptors.hpp"
#include "fragctl/error.hpp"
#include "fragctl/oom.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/sim_backend.hpp"
#include "fragctl/stats.hpp"
#include "fragctl/trace.hpp"
#include "nlohmann/json.hpp"

namespace fragctl {
namespace {

using ::testing::HasSubstr;

/// One synthetic training step: a forward pass keeps activations (large and
/// small) and makes short-lived temporaries; the backward pass frees the
/// activations in reverse, each after a gradient of its size.
void training_step(device_allocator& a) {
  static const std::size_t sizes[] = {96 * MiB, 48 * MiB, 24 * MiB + 512, 12 * MiB, 6 * MiB, 3 * MiB,
                                      1536 * KiB, 768 * KiB, 256 * KiB + 7, 64 * KiB, 4 * KiB, 1000};
  std::vector<std::pair<void*, std::size_t>> activations;
  for (int layer = 0; layer < 2; ++layer) {
    for (std::size_t n : sizes) {
      activations.emplace_back(a.allocate(n), n);
      const std::size_t tmp = n / 8 + 512;
      a.deallocate(a.allocate(tmp), tmp);
    }
  }
  while (!activations.empty()) {
    const auto [p, n] = activations.back();
    activations.pop_back();
    void* grad = a.allocate(n);
    a.deallocate(p, n);
    a.deallocate(grad, n);
  }
}

std::string fmt_bytes(const char* key, std::size_t bytes) { return key + std::to_string(bytes); }

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "/" + name; }

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

/// Statistics of `steps` training steps over a fresh upstream from `make`.
template <class Make>
allocator_stats profile_run(Make make, int steps) {
  sim_backend sim;
  statistics_adaptor stats(make(sim));
  for (int i = 0; i < steps; ++i) training_step(stats);
  return stats.stats();
}

std::unique_ptr<device_allocator> make_caching(const config& cfg, sim_backend& sim) {
  return std::make_unique<caching_policy>(cfg, sim);
}

TEST(warmup_plan, a_byte_count_is_one_block_and_small_blocks_and_a_histogram_shapes_the_rest) {
  warmup_profile p;
  EXPECT_TRUE(plan_warmup(p).empty());
  p.bytes = 100 * MiB + 3;
  auto plan = plan_warmup(p);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].bytes, 94 * MiB + 512);  // the rest, one block
  EXPECT_EQ(plan[0].count, 1u);
  EXPECT_EQ(plan[1].bytes, MiB);  // 1/16 of the target in blocks of small_size
  EXPECT_EQ(plan[1].count, 6u);
  p.bytes = 3 * MiB;
  plan = plan_warmup(p);
  ASSERT_EQ(plan.size(), 2u) << "one small block from twice small_size";
  EXPECT_EQ(plan[1].bytes * plan[1].count + plan[0].bytes, 3 * MiB);
  p.bytes = MiB;
  EXPECT_EQ(plan_warmup(p).size(), 1u);

  p.bytes = 512 * MiB;
  p.size_histogram[12] = 20000;  // 4 KiB .. 8 KiB: 19.6% of the bytes asked
  p.size_histogram[26] = 5;      // 64 MiB .. 128 MiB: the rest
  plan = plan_warmup(p);
  std::size_t total = 0;
  std::size_t small = 0;
  for (std::size_t i = 0; i < plan.size(); ++i) {
    if (i > 0) {
      EXPECT_LT(plan[i].bytes, plan[i - 1].bytes) << "largest first";
    }
    total += plan[i].bytes * plan[i].count;
    if (plan[i].bytes < MiB) {
      EXPECT_GT(plan[i].bytes, 4 * KiB);
      EXPECT_LE(plan[i].bytes, 8 * KiB);
      small += plan[i].bytes * plan[i].count;
    }
  }
  EXPECT_EQ(plan.size(), 5u) << "four sizes across the 4 KiB bucket and one large block";
  EXPECT_EQ(plan[0].count, 1u);
  EXPECT_NEAR(static_cast<double>(total), static_cast<double>(p.bytes), 4 * 8 * KiB + 512);
  const double small_traffic = 20000 * 6144.0 / (20000 * 6144.0 + 5 * 96.0 * MiB);
  EXPECT_NEAR(static_cast<double>(small) / static_cast<double>(total), 2 * small_traffic, 0.01)
      << "small requests get twice their share of the traffic";
}

TEST(warmup_profile_loading, errors_name_the_file) {
  config cfg;
  cfg.warmup_profile = temp_path("no-such-profile.json");
  auto missing = load_warmup_profile(cfg);
  EXPECT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("no-such-profile.json"));
  sim_backend sim;
  EXPECT_THROW(warmup_policy(cfg, make_caching(cfg, sim)), invalid_argument);

  cfg.warmup_profile = temp_path("garbage-profile.json");
  write_file(cfg.warmup_profile, "{ not json");
  auto garbage = load_warmup_profile(cfg);
  EXPECT_FALSE(garbage.ok());
  EXPECT_THAT(std::string(garbage.status().message()), HasSubstr("garbage-profile.json"));
}

TEST(warmup_profile_loading, a_report_of_several_allocators_gives_the_one_on_our_device) {
  allocator_stats a;
  a.device = 0;
  a.reserved.peak = 10 * GiB;
  allocator_stats b;
  b.device = 1;
  b.reserved.peak = 3 * GiB;
  b.size_histogram[20] = 5;
  nlohmann::json report = {{"schema_version", stats_schema_version},
                           {"allocators", {nlohmann::json::parse(to_json(a)), nlohmann::json::parse(to_json(b))}}};
  config cfg;
  cfg.device = 1;
  cfg.warmup_profile = temp_path("two-allocators.json");
  write_file(cfg.warmup_profile, report.dump());
  auto p = load_warmup_profile(cfg);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->bytes, 3 * GiB);
  EXPECT_EQ(p->size_histogram[20], 5u);
  EXPECT_EQ(p->source, cfg.warmup_profile);
  cfg.warmup_bytes = 4 * GiB;  // overrides the target, keeps the shape
  p = load_warmup_profile(cfg);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->bytes, 4 * GiB);
  EXPECT_EQ(p->size_histogram[20], 5u);
}

TEST(warmup_policy_test, without_a_profile_it_passes_through) {
  config cfg;
  sim_backend sim;
  warmup_policy w(cfg, make_caching(cfg, sim));
  EXPECT_EQ(w.name(), "warmup:caching");
  EXPECT_EQ(w.warmed_bytes(), 0u);
  EXPECT_EQ(sim.counters().held_bytes, 0u);
  void* p = w.allocate(MiB);
  w.deallocate(p, MiB);
  EXPECT_EQ(w.shortfall(), 0u);
}

TEST(warmup_policy_test, a_byte_count_is_held_by_the_upstream_after_warm_up) {
  config cfg;
  cfg.warmup_bytes = 512 * MiB;
  sim_backend sim;
  warmup_policy w(cfg, make_caching(cfg, sim));
  EXPECT_EQ(w.warmed_bytes(), 512 * MiB);
  EXPECT_GE(w.warmed_reserved(), 512 * MiB);
  EXPECT_EQ(w.state().allocated, 0u);
  EXPECT_GE(w.state().cached_free, 512 * MiB);
  // Large requests carve the pre-filled segment.
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(w.allocate(100 * MiB));
  for (void* p : blocks) w.deallocate(p, 100 * MiB);
  EXPECT_EQ(w.backend_calls_since_warmup(), 0u);
}

TEST(warmup_policy_test, a_profile_from_a_first_run_makes_later_steps_call_no_backend) {
  config cfg;
  const allocator_stats first = profile_run([&](sim_backend& s) { return make_caching(cfg, s); }, 1);
  ASSERT_GT(first.reserved.peak, 0u);
  cfg.warmup_profile = temp_path("caching-profile.json");
  write_file(cfg.warmup_profile, to_json(first));

  sim_backend sim;
  warmup_policy w(cfg, make_caching(cfg, sim));
  EXPECT_EQ(w.profile().bytes, first.reserved.peak);
  EXPECT_GT(w.warmed_bytes(), 0u);
  for (int step = 0; step < 5; ++step) training_step(w);
  EXPECT_EQ(w.backend_calls_since_warmup(), 0u)
      << "profile of " << first.reserved.peak << " bytes; shortfall " << w.shortfall();
}

TEST(warmup_policy_test, fail_throws_saying_how_much_the_profile_lacked) {
  config cfg;
  cfg.warmup_bytes = 8 * MiB;
  cfg.warmup_on_exhausted = warmup_exhausted::fail;
  sim_backend sim;
  warmup_policy w(cfg, make_caching(cfg, sim));
  void* fits = w.allocate(4 * MiB);
  w.deallocate(fits, 4 * MiB);
  try {
    (void)w.allocate(64 * MiB);
    FAIL() << "a request beyond the warm-up succeeded under fail";
  } catch (const out_of_memory& e) {
    const std::string what = e.what();
    EXPECT_THAT(what, HasSubstr("too small by 64.00 MiB"));
    EXPECT_THAT(what, HasSubstr("warmup_bytes to at least 72.00 MiB"));
    EXPECT_EQ(e.details().requested, 64 * MiB);
  }
  EXPECT_EQ(w.state().allocated, 0u);
  EXPECT_EQ(w.shortfall(), 64 * MiB);
  // After release_cached the warm-up is gone and nothing is refused.
  w.release_cached();
  void* p = w.allocate(64 * MiB);
  w.deallocate(p, 64 * MiB);
}

// Issue 18: warmup_bytes pre-filled one large block, which caching never
// uses for a small request, so under fail a 4 KiB request failed with the
// whole warm-up free.
TEST(warmup_policy_test, a_byte_count_warms_caching_small_pool_too) {
  config cfg;
  cfg.warmup_bytes = 512 * MiB;
  cfg.warmup_on_exhausted = warmup_exhausted::fail;
  sim_backend sim;
  warmup_policy w(cfg, make_caching(cfg, sim));
  std::vector<void*> small;
  for (const std::size_t n : {std::size_t{4} * KiB, std::size_t{1000}, 300 * KiB, MiB}) small.push_back(w.allocate(n));
  void* large = w.allocate(200 * MiB);
  EXPECT_EQ(w.backend_calls_since_warmup(), 0u);
  w.deallocate(large, 200 * MiB);
  std::size_t i = 0;
  for (const std::size_t n : {std::size_t{4} * KiB, std::size_t{1000}, 300 * KiB, MiB}) w.deallocate(small[i++], n);
  EXPECT_EQ(w.shortfall(), 0u);
}

// Issue 18: a request the warm-up held the bytes for but not the shape was
// told to set warmup_bytes to the value it already had.
TEST(warmup_policy_test, fail_on_a_shape_the_warm_up_lacks_points_to_a_profile_not_more_bytes) {
  config cfg;
  cfg.warmup_bytes = 64 * MiB;  // 4 MiB of it in small blocks: two small segments
  cfg.warmup_on_exhausted = warmup_exhausted::fail;
  sim_backend sim;
  warmup_policy w(cfg, make_caching(cfg, sim));
  std::vector<void*> live;
  std::string what;
  try {
    for (int i = 0; i < 32; ++i) live.push_back(w.allocate(MiB));
    FAIL() << "32 MiB of small blocks fitted a 4 MiB small pool";
  } catch (const out_of_memory& e) {
    what = e.what();
  }
  EXPECT_THAT(what, HasSubstr("enough bytes, but not in a shape that serves a request of 1.00 MiB"));
  EXPECT_THAT(what, HasSubstr("warmup_profile"));
  EXPECT_THAT(what, ::testing::Not(HasSubstr("set warmup_bytes")));
  EXPECT_EQ(w.shortfall(), 0u);
  EXPECT_EQ(w.suggested_bytes(), 64 * MiB);
  for (void* p : live) w.deallocate(p, MiB);
}

// Issue 17: the same out-of-memory was judged "fragmentation" by the log and
// statistics: the cause is a shape the warm-up lacked, memory the device had.
TEST(warmup_policy_test, fail_on_a_missing_shape_is_declined_everywhere) {
  config cfg;
  cfg.warmup_bytes = 64 * MiB;
  cfg.warmup_on_exhausted = warmup_exhausted::fail;
  sim_backend sim;
  statistics_adaptor s(std::make_unique<warmup_policy>(cfg, make_caching(cfg, sim)));
  std::vector<void*> live;
  std::string what;
  try {
    for (int i = 0; i < 32; ++i) live.push_back(s.allocate(MiB));
    FAIL() << "32 MiB of small blocks fitted a 4 MiB small pool";
  } catch (const out_of_memory& e) {
    what = e.what();
    EXPECT_EQ(diagnose(e.details()), oom_verdict::declined);
  }
  EXPECT_THAT(what, HasSubstr("caused by fragmentation: no: the device has that much free memory"));
  const allocator_stats st = s.stats();
  ASSERT_EQ(st.oom_events.size(), 1u);
  EXPECT_EQ(st.oom_events[0].verdict, oom_verdict::declined);
  EXPECT_THAT(st.oom_events[0].advice, HasSubstr("warmup_on_exhausted:grow"));
  for (void* p : live) s.deallocate(p, MiB);
}

TEST(warmup_policy_test, grow_grows_and_reports_the_figure) {
  config cfg;
  cfg.warmup_bytes = 8 * MiB;
  sim_backend sim;
  warmup_policy w(cfg, make_caching(cfg, sim));
  void* p = w.allocate(64 * MiB);
  EXPECT_NE(p, nullptr);
  EXPECT_GT(w.backend_calls_since_warmup(), 0u);
  EXPECT_EQ(w.shortfall(), 64 * MiB);
  EXPECT_EQ(w.suggested_bytes(), 72 * MiB);
  w.deallocate(p, 64 * MiB);
}

TEST(warmup_policy_test, a_warm_up_larger_than_the_device) {
  config cfg;
  cfg.warmup_bytes = 2 * GiB;
  sim_options small;
  small.capacity = 256 * MiB;
  {
    sim_backend sim(small);
    cfg.warmup_on_exhausted = warmup_exhausted::fail;
    try {
      warmup_policy w(cfg, make_caching(cfg, sim));
      FAIL() << "a 2 GiB warm-up fitted a 256 MiB device";
    } catch (const out_of_memory& e) {
      EXPECT_THAT(e.what(), HasSubstr("does not fit"));
    }
    EXPECT_EQ(sim.counters().held_bytes, 0u);
  }
  sim_backend sim(small);
  cfg.warmup_on_exhausted = warmup_exhausted::grow;
  warmup_policy w(cfg, make_caching(cfg, sim));
  EXPECT_EQ(w.warmed_bytes(), 0u) << "the single block did not fit; the policy still works";
  void* p = w.allocate(MiB);
  w.deallocate(p, MiB);
}

/// Backend memory calls a policy chain makes over `steps` training steps
/// after it was built (warm-up included in the build).
std::uint64_t calls_over_steps(device_allocator& a, sim_backend& sim, int steps) {
  const std::uint64_t before = sim.counters().memory_calls();
  for (int i = 0; i < steps; ++i) training_step(a);
  return sim.counters().memory_calls() - before;
}

TEST(warmup_arena, a_byte_count_makes_every_step_call_no_backend) {
  const allocator_stats first = profile_run(
      [](sim_backend& s) { return make_policy("arena", config{}, s); }, 1);
  auto cfg = parse_config(fmt_bytes("warmup_bytes:", first.reserved.peak));
  ASSERT_TRUE(cfg.ok());
  sim_backend sim;
  auto chain = make_policy("warmup:arena", *cfg, sim);
  auto& w = dynamic_cast<warmup_policy&>(*chain);
  EXPECT_EQ(w.warmed_bytes(), round_up(first.reserved.peak, min_alignment));
  EXPECT_EQ(calls_over_steps(w, sim, 10), 0u);
  EXPECT_EQ(w.backend_calls_since_warmup(), 0u);
  EXPECT_EQ(w.shortfall(), 0u);
}

TEST(warmup_arena, without_warm_up_the_first_step_calls_the_backend) {
  sim_backend sim;
  auto chain = make_policy("arena", config{}, sim);
  EXPECT_GT(calls_over_steps(*chain, sim, 1), 0u);
}

TEST(warmup_arena, a_report_from_a_first_run_makes_the_second_call_no_backend_after_warm_up) {
  const allocator_stats first = profile_run(
      [](sim_backend& s) { return make_policy("arena", config{}, s); }, 2);
  config cfg;
  cfg.warmup_profile = temp_path("arena-profile.json");
  nlohmann::json report = {{"schema_version", stats_schema_version},
                           {"allocators", {nlohmann::json::parse(to_json(first))}}};
  write_file(cfg.warmup_profile, report.dump());
  sim_backend sim;
  auto chain = make_policy("warmup:arena", cfg, sim);
  auto& w = dynamic_cast<warmup_policy&>(*chain);
  EXPECT_EQ(w.profile().bytes, first.reserved.peak);
  EXPECT_EQ(calls_over_steps(w, sim, 10), 0u);
}

/// Replays a trace's allocs and frees in order through `a`; returns the
/// backend memory calls made after event `from`.
std::uint64_t replay_calls_after(const trace& t, device_allocator& a, sim_backend& sim, std::size_t from) {
  absl::flat_hash_map<std::uint64_t, std::pair<void*, std::size_t>> live;
  std::uint64_t at_from = sim.counters().memory_calls();
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    if (i == from) at_from = sim.counters().memory_calls();
    const trace_event& e = t.events[i];
    if (e.kind == trace_event::action::alloc) {
      if (auto old = live.find(e.addr); old != live.end()) {
        a.deallocate(old->second.first, old->second.second);
        live.erase(old);
      }
      live[e.addr] = {a.allocate(e.size), e.size};
    } else if (auto it = live.find(e.addr); it != live.end()) {
      a.deallocate(it->second.first, it->second.second);
      live.erase(it);
    }
  }
  const std::uint64_t calls = sim.counters().memory_calls() - at_from;
  for (const auto& [addr, block] : live) a.deallocate(block.first, block.second);
  return calls;
}

/// Index of the first event of the second training step: the first pause of
/// over 10 ms once the live bytes rose to 90% of their peak (forward pass)
/// and fell below half of it again (backward pass).
std::size_t second_step_start(const trace& t) {
  const std::size_t peak = summarize(t).peak_live_bytes;
  absl::flat_hash_map<std::uint64_t, std::size_t> live;
  std::size_t bytes = 0;
  bool forward = false;
  bool backward = false;
  for (std::size_t i = 0; i + 1 < t.events.size(); ++i) {
    const trace_event& e = t.events[i];
    if (e.kind == trace_event::action::alloc) {
      bytes += e.size;
      live[e.addr] = e.size;
    } else if (auto it = live.find(e.addr); it != live.end()) {
      bytes -= it->second;
      live.erase(it);
    }
    forward = forward || 10 * bytes >= 9 * peak;
    backward = backward || (forward && 2 * bytes < peak);
    if (backward && t.events[i + 1].time_us - e.time_us > 10000) return i + 1;
  }
  return t.events.size();
}

TEST(warmup_arena, after_the_first_step_of_a_replayed_trace_no_backend_calls) {
  const char* data = std::getenv("FRAGCTL_TEST_DATA");
  const std::string path = std::string(data != nullptr ? data : "tests/data") + "/resnet50.trace.csv.gz";
  auto t = read_trace(path);
  if (!t.ok()) GTEST_SKIP() << "no trace: " << t.status();
  const std::size_t step2 = second_step_start(*t);
  ASSERT_LT(step2, t->events.size() / 4) << "no step boundary found";

  // First run: the whole trace through arena, with statistics (FRAGCTL_REPORT's content).
  allocator_stats profile;
  {
    sim_backend sim;
    statistics_adaptor stats(make_policy("arena", config{}, sim));
    (void)replay_calls_after(*t, stats, sim, 0);
    profile = stats.stats();
  }
  config cfg;
  cfg.warmup_profile = temp_path("resnet50-profile.json");
  write_file(cfg.warmup_profile, to_json(profile));

  // Second run: warmed up from the first, the whole trace.
  sim_backend sim;
  auto chain = make_policy("warmup:arena", cfg, sim);
  auto& w = dynamic_cast<warmup_policy&>(*chain);
  EXPECT_EQ(replay_calls_after(*t, w, sim, step2), 0u)
      << "warm-up of " << w.warmed_bytes() << " bytes; shortfall " << w.shortfall();
}

}  // namespace
}  // namespace fragctl
