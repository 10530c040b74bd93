// Peer access (issue 30, item 4): once a program lets device B reach device
// A's memory, every span the arena on A has mapped, and every span it maps
// later, is granted to B (cuMemSetAccess with B's location), so kernels on B
// read A's tensors directly, as they read cudaMalloc memory. On sim: a
// machine of two devices; accessible_from says what B may touch.
#include <gtest/gtest.h>

#include <memory>

#include "allocator_policies/arena/arena_policy.hpp"
#include "allocator_policies/buckets/buckets_policy.hpp"
#include "allocator_policies/caching/caching_policy.hpp"
#include "fragctl/error.hpp"
#include "fragctl/sim_backend.hpp"

namespace fragctl {
namespace {

constexpr std::size_t G = 2 * MiB;

sim_options two_devices() {
  sim_options o;
  o.capacity = 256 * G;
  o.granularity = G;
  o.devices = 2;
  return o;
}

config small_spans() {
  config cfg;
  cfg.map_chunk = 0;
  cfg.release_threshold = 0;
  cfg.release_delay = 0;
  return cfg;
}

TEST(ArenaPeerAccess, MappedAndLaterSpansAreGrantedToThePeer) {
  sim_backend sim(two_devices());
  arena_policy arena(small_spans(), sim);
  void* a = arena.allocate(3 * G);
  ASSERT_TRUE(sim.accessible_from(0, a, 3 * G));
  EXPECT_FALSE(sim.accessible_from(1, a, 3 * G)) << "control: no peer access before it is enabled";

  arena.enable_peer_access(1);
  EXPECT_TRUE(sim.accessible_from(1, a, 3 * G)) << "memory mapped before";
  void* b = arena.allocate(5 * G);
  EXPECT_TRUE(sim.accessible_from(1, b, 5 * G)) << "memory mapped after";
  arena.enable_peer_access(1);  // again: nothing changes
  EXPECT_EQ(sim.access_peers().size(), 1U);

  arena.deallocate(a, 3 * G);  // unmapped (release_delay 0), then mapped again for c
  void* c = arena.allocate(3 * G);
  EXPECT_TRUE(sim.accessible_from(1, c, 3 * G)) << "re-stitched memory";

  ASSERT_TRUE(arena.pause(pause_keep::none));
  EXPECT_FALSE(sim.accessible_from(1, b, 5 * G));
  ASSERT_TRUE(arena.resume());
  EXPECT_TRUE(sim.accessible_from(1, b, 5 * G)) << "memory mapped by resume";
  arena.deallocate(b, 5 * G);
  arena.deallocate(c, 3 * G);
}

TEST(ArenaPeerAccess, BadPeersAreRefusedAndAFailedGrantCanBeRetried) {
  sim_backend sim(two_devices());
  arena_policy arena(small_spans(), sim);
  void* a = arena.allocate(4 * G);
  EXPECT_THROW(arena.enable_peer_access(0), invalid_argument) << "its own device";
  EXPECT_THROW(arena.enable_peer_access(-1), invalid_argument);
  EXPECT_THROW(arena.enable_peer_access(2), backend_error) << "no such device";
  EXPECT_TRUE(sim.access_peers().empty());

  sim.fail_nth(sim_fault_target::set_access, 1);
  EXPECT_THROW(arena.enable_peer_access(1), backend_error);
  EXPECT_TRUE(sim.access_peers().empty()) << "a peer whose grant failed is not in every later mapping's list";
  sim.reset_faults();
  arena.enable_peer_access(1);
  EXPECT_TRUE(sim.accessible_from(1, a, 4 * G)) << "the second call granted what the first could not";
  arena.deallocate(a, 4 * G);
}

TEST(ArenaPeerAccess, PlainAllocationsNeedNothingAndWrappersReachTheArena) {
  sim_backend sim(two_devices());
  caching_policy caching(config{}, sim);
  EXPECT_NO_THROW(caching.enable_peer_access(1));
  EXPECT_TRUE(sim.access_peers().empty()) << "cudaMalloc memory: the runtime's peer access covers it";
  EXPECT_THROW(caching.enable_peer_access(0), invalid_argument);

  sim_backend other(two_devices());
  buckets_policy buckets(config{}, std::make_unique<arena_policy>(small_spans(), other));
  void* big = buckets.allocate(4 * G);  // above the classes: the arena's block
  buckets.enable_peer_access(1);
  EXPECT_TRUE(other.accessible_from(1, big, 4 * G));
  buckets.deallocate(big, 4 * G);
}

// A bad peer gets one answer whatever the policy: its own device or a
// negative ordinal is an invalid_argument, a device that does not exist (or
// cannot reach this one: the backend's can-access-peer check) a
// backend_error, also from policies whose memory needs no grant.
TEST(ArenaPeerAccess, EveryPolicyRefusesTheSameBadPeers) {
  sim_options no_vm = two_devices();
  no_vm.virtual_memory = false;
  config fallback = small_spans();
  fallback.fallback_size = 8 * G;
  struct policy_case {
    const char* name;
    sim_options machine;
    std::unique_ptr<device_allocator> (*make)(sim_backend&, const config&);
    config cfg;
  };
  const auto make_caching = [](sim_backend& sim, const config& cfg) -> std::unique_ptr<device_allocator> {
    return std::make_unique<caching_policy>(cfg, sim);
  };
  const auto make_arena = [](sim_backend& sim, const config& cfg) -> std::unique_ptr<device_allocator> {
    return std::make_unique<arena_policy>(cfg, sim);
  };
  const auto make_buckets = [](sim_backend& sim, const config& cfg) -> std::unique_ptr<device_allocator> {
    return std::make_unique<buckets_policy>(cfg, std::make_unique<arena_policy>(cfg, sim));
  };
  for (const policy_case& c : {policy_case{"caching", two_devices(), make_caching, config{}},
                               policy_case{"arena", two_devices(), make_arena, small_spans()},
                               policy_case{"arena (fallback block)", no_vm, make_arena, fallback},
                               policy_case{"buckets:arena", two_devices(), make_buckets, small_spans()}}) {
    SCOPED_TRACE(c.name);
    sim_backend sim(c.machine);
    const std::unique_ptr<device_allocator> a = c.make(sim, c.cfg);
    EXPECT_THROW(a->enable_peer_access(0), invalid_argument) << "its own device";
    EXPECT_THROW(a->enable_peer_access(-1), invalid_argument);
    EXPECT_THROW(a->enable_peer_access(2), backend_error) << "no such device";
    EXPECT_NO_THROW(a->enable_peer_access(1)) << "control: a device that exists";

    sim_options one = c.machine;
    one.devices = 1;
    sim_backend alone(one);
    const std::unique_ptr<device_allocator> b = c.make(alone, c.cfg);
    EXPECT_THROW(b->enable_peer_access(1), backend_error) << "a machine of one device";
  }
}

}  // namespace
}  // namespace fragctl
