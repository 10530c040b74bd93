// Pause and resume (issue 30, item 5): the arena gives the physical memory
// under its live blocks back to the device while keeping their addresses,
// another owner uses the memory meanwhile, and resume maps fresh memory at
// the same addresses, restoring the contents when they were kept. Both are
// transactions: a failure midway leaves every block mapped or paused, the
// counts exact, and the allocator usable (never pytorch#188008's state).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "allocator_policies/arena/arena_policy.hpp"
#include "allocator_policies/caching/caching_policy.hpp"
#include "fragctl/error.hpp"
#include "fragctl/sim_backend.hpp"
#include "support/arena_world.hpp"

namespace fragctl {
namespace {

using testing_arena::G;
using testing_arena::intact;
using testing_arena::world;

// One granule per span, so that frees while paused can empty whole spans.
config one_granule_spans() {
  config cfg;
  cfg.map_chunk = 0;
  cfg.release_threshold = 0;
  cfg.release_delay = std::uint64_t{1} << 20;  // freed granules stay cached until the pause
  return cfg;
}

// Live blocks over several spans, some granules cached (a freed block).
void build(world& w) {
  w.take(3 * G);
  void* gone = w.take(2 * G);
  w.take(G / 2);
  w.take(5 * G + 4096);
  w.give(gone);
}

// The device holds nothing for the arena while it is paused, and the arena
// says so.
::testing::AssertionResult released(const world& w) {
  if (w.sim->used_bytes() != 0 || w.sim->mapped_bytes() != 0) {
    return ::testing::AssertionFailure() << "the device still holds " << w.sim->used_bytes() << " bytes ("
                                         << w.sim->mapped_bytes() << " mapped)";
  }
  if (w.arena->state().reserved != 0) {
    return ::testing::AssertionFailure() << "reserved " << w.arena->state().reserved << " while paused";
  }
  return ::testing::AssertionSuccess();
}

// A sim device of `granules` granules of G, backed, with or without virtual memory.
sim_options device_of(std::size_t granules, bool virtual_memory = true) {
  sim_options o;
  o.capacity = granules * G;
  o.granularity = G;
  o.backed = true;
  o.virtual_memory = virtual_memory;
  return o;
}

std::vector<void*> addresses(const world& w) {
  std::vector<void*> out;
  for (const auto& b : w.blocks) out.push_back(b.p);
  return out;
}

TEST(ArenaPause, KeepHostGivesEveryByteBackAndRestoresContentsAtTheSameAddresses) {
  world w(one_granule_spans());
  build(w);
  ASSERT_TRUE(w.consistent());
  const std::vector<void*> before = addresses(w);
  ASSERT_GT(w.sim->used_bytes(), 0U);

  ASSERT_TRUE(w.arena->pause(pause_keep::host));
  EXPECT_TRUE(w.arena->paused());
  EXPECT_TRUE(released(w));
  EXPECT_GE(w.arena->paused_bytes(), 9 * G);
  EXPECT_EQ(w.sim->counters().host_bytes, w.arena->paused_bytes()) << "one pinned copy per paused span";
  EXPECT_THROW((void)w.arena->allocate(G), state_error) << "nothing is served while paused";
  // A second pause is a state_error (the C API's STATE), checked under the
  // same call that would pause: a thread that loses a race gets it too.
  EXPECT_THROW((void)w.arena->pause(pause_keep::none), state_error);

  ASSERT_TRUE(w.arena->resume());
  EXPECT_THROW((void)w.arena->resume(), state_error) << "not paused";
  EXPECT_FALSE(w.arena->paused());
  EXPECT_EQ(addresses(w), before);
  EXPECT_TRUE(w.consistent()) << "every block mapped, accessible and holding its pattern";
  EXPECT_EQ(w.sim->counters().host_bytes, 0U) << "the host copies are freed";
  w.take(2 * G);  // serves again
  EXPECT_TRUE(w.consistent());
  w.tear_down();
}

TEST(ArenaPause, AnotherOwnerUsesTheMemoryWhileTheArenaIsPaused) {
  // A device of 16 granules with 12 of them under live blocks: without the
  // pause another 12 granules do not fit (the positive control); paused, they
  // do, and after they are freed the arena resumes.
  sim_backend sim(device_of(16));
  config cfg;
  cfg.arena_size = 16 * G;
  arena_policy arena(cfg, sim);
  void* a = arena.allocate(12 * G);
  EXPECT_EQ(sim.allocate(12 * G), nullptr) << "control: the device is full while the arena holds its memory";

  ASSERT_TRUE(arena.pause(pause_keep::none));
  void* other = sim.allocate(12 * G);
  ASSERT_NE(other, nullptr) << "the paused arena's memory went back to the device";
  EXPECT_FALSE(arena.resume()) << "resume cannot take memory another owner holds";
  EXPECT_TRUE(arena.paused()) << "a refused resume leaves the arena paused";
  EXPECT_EQ(sim.mapped_bytes(), 0U) << "and maps nothing";
  sim.free(other, 12 * G);
  ASSERT_TRUE(arena.resume());
  EXPECT_TRUE(sim.accessible(a, 12 * G));
  arena.deallocate(a, 12 * G);
}

TEST(ArenaPause, WithoutKeptContentsTheBlocksComeBackWithFreshMemory) {
  // The control for the host copies: the same pause without them loses the
  // patterns (the device's fresh memory), with the same addresses.
  world w(one_granule_spans());
  build(w);
  const std::vector<void*> before = addresses(w);
  ASSERT_TRUE(w.arena->pause(pause_keep::none));
  EXPECT_EQ(w.sim->counters().host_bytes, 0U) << "no host memory without kept contents";
  ASSERT_TRUE(w.arena->resume());
  EXPECT_EQ(addresses(w), before);
  std::size_t lost = 0;
  for (const auto& b : w.blocks) {
    EXPECT_TRUE(w.sim->accessible(b.p, b.bytes));
    if (!intact(b.p, b.bytes, b.seed)) ++lost;
  }
  EXPECT_EQ(lost, w.blocks.size());
  for (auto& b : w.blocks) testing_arena::fill(b.p, b.bytes, b.seed);
  w.tear_down();
}

TEST(ArenaPause, BlocksFreedWhilePausedAreNotMappedBack) {
  world w(one_granule_spans());
  void* a = w.take(4 * G);
  w.take(2 * G);
  ASSERT_TRUE(w.arena->pause(pause_keep::host));
  // Freed while paused (give() would read its unmapped pattern).
  w.arena->deallocate(a, 4 * G);
  w.blocks.erase(w.blocks.begin());
  EXPECT_EQ(w.arena->state().allocated, 2 * G);
  ASSERT_TRUE(w.arena->resume());
  EXPECT_EQ(w.sim->mapped_bytes(), 2 * G) << "only the span a live block still touches";
  EXPECT_TRUE(w.consistent());
  w.take(4 * G);
  EXPECT_TRUE(w.consistent());
  w.tear_down();
}

// Failures midway. Each call kind of the pause and of the resume fails at
// every position; afterwards the arena is either unpaused and consistent or
// paused with nothing of it on the device, and it always comes back whole.
TEST(ArenaPause, AFailedPauseMapsBackWhatItReleasedWithTheContents) {
  for (std::uint64_t k = 1; k <= 4; ++k) {
    SCOPED_TRACE(::testing::Message() << "unmap " << k << " fails");
    world w(one_granule_spans());
    build(w);
    w.arena->release_cached();  // so that the pause's unmaps are the live spans', one each
    const std::uint64_t created = w.sim->counters().of(backend_call::create_physical);
    w.sim->fail_nth(sim_fault_target::unmap, k);
    EXPECT_THROW((void)w.arena->pause(pause_keep::host), backend_error);
    w.sim->reset_faults();
    if (k >= 2) {  // k - 1 spans were released before the failing unmap: the undoing mapped them anew
      EXPECT_GT(w.sim->counters().of(backend_call::create_physical), created);
    }
    EXPECT_FALSE(w.arena->paused()) << "the pause was undone";
    EXPECT_TRUE(w.consistent());
    w.take(G);
    EXPECT_TRUE(w.consistent());
    w.tear_down();
  }
}

TEST(ArenaPause, AFailedPauseWithoutContentsLeavesWhatItReleasedPaused) {
  world w(one_granule_spans());
  build(w);
  w.arena->release_cached();  // so that the pause's unmaps are the live spans', one each
  w.sim->fail_nth(sim_fault_target::unmap, 2);  // one live span released, then the failure
  EXPECT_THROW((void)w.arena->pause(pause_keep::none), backend_error);
  w.sim->reset_faults();
  EXPECT_TRUE(w.arena->paused()) << "released contents are gone: the caller resumes, as after a pause";
  EXPECT_GT(w.arena->paused_bytes(), 0U);
  EXPECT_THROW((void)w.arena->allocate(G), invalid_argument);
  ASSERT_TRUE(w.arena->resume());
  for (auto& b : w.blocks) {
    ASSERT_TRUE(w.sim->accessible(b.p, b.bytes));
    testing_arena::fill(b.p, b.bytes, b.seed);  // the released blocks' contents are new memory's
  }
  EXPECT_TRUE(w.consistent());
  w.tear_down();
}

TEST(ArenaPause, RunningOutOfHostMemoryRefusesThePauseAndChangesNothing) {
  for (std::uint64_t k = 1; k <= 3; ++k) {
    SCOPED_TRACE(::testing::Message() << "host allocation " << k << " fails");
    world w(one_granule_spans());
    build(w);
    const std::size_t held = w.sim->used_bytes();
    w.sim->fail_nth(sim_fault_target::allocate_host, k);
    EXPECT_FALSE(w.arena->pause(pause_keep::host));
    w.sim->reset_faults();
    EXPECT_FALSE(w.arena->paused());
    EXPECT_LE(w.sim->used_bytes(), held) << "only the cache went back";
    EXPECT_EQ(w.sim->counters().host_bytes, 0U) << "the copies made are freed";
    EXPECT_TRUE(w.consistent());
    w.tear_down();
  }
}

TEST(ArenaPause, AFailedResumeLeavesItPausedAndTheNextResumeRestoresEverything) {
  // The device refuses (resume returns false): a create, a map or a set_access fails.
  for (const sim_fault_target target :
       {sim_fault_target::create_physical, sim_fault_target::map, sim_fault_target::set_access}) {
    for (std::uint64_t k = 1; k <= 3; ++k) {
      SCOPED_TRACE(::testing::Message() << "call kind " << static_cast<int>(target) << ", call " << k);
      world w(one_granule_spans());
      build(w);
      ASSERT_TRUE(w.arena->pause(pause_keep::host));
      w.sim->fail_nth(target, k);
      EXPECT_FALSE(w.arena->resume());
      w.sim->reset_faults();
      EXPECT_TRUE(w.arena->paused());
      EXPECT_TRUE(released(w)) << "what the failed resume mapped is given back";
      ASSERT_TRUE(w.arena->resume());
      EXPECT_TRUE(w.consistent());
      w.tear_down();
    }
  }
}

TEST(ArenaPause, OnlyTheArenaOverVirtualMemoryPauses) {
  sim_backend flat(device_of(64, /*virtual_memory=*/false));
  config cfg;
  cfg.fallback_size = 8 * G;
  arena_policy fallback(cfg, flat);
  EXPECT_THROW((void)fallback.pause(pause_keep::none), invalid_argument);
  EXPECT_FALSE(fallback.paused());

  sim_backend sim;
  caching_policy caching(config{}, sim);
  EXPECT_THROW((void)caching.pause(pause_keep::none), invalid_argument);
  EXPECT_THROW((void)caching.resume(), invalid_argument);

  world w(one_granule_spans());
  EXPECT_THROW((void)w.arena->resume(), invalid_argument) << "resume without a pause";
  ASSERT_TRUE(w.arena->pause(pause_keep::none));
  EXPECT_THROW((void)w.arena->pause(pause_keep::none), invalid_argument) << "a second pause";
  ASSERT_TRUE(w.arena->resume());
}

}  // namespace
}  // namespace fragctl
