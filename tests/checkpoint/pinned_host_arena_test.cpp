// The pinned host arena on the sim backend: both providers pin once and
// reuse their extents every iteration, unpin everything on destruction, and
// serve usable, disjoint buffers.
#include "fragctl/checkpoint/pinned_host_arena.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "checkpoint/host_providers.hpp"
#include "fragctl/error.hpp"
#include "fragctl/sim_backend.hpp"

namespace fragctl::checkpoint {
namespace {

std::uint64_t pins(const sim_backend& sim) { return sim.counters().of(backend_call::allocate_host); }

/// One "iteration": allocate buffers of the given sizes, write each, check
/// none overlaps another, free them in reverse order.
void iterate(pinned_host_arena& arena, const std::vector<std::size_t>& sizes) {
  std::vector<std::pair<char*, std::size_t>> live;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    auto* p = static_cast<char*>(arena.allocate(sizes[i]));
    ASSERT_NE(p, nullptr);
    std::memset(p, static_cast<int>(i & 0x7f), sizes[i]);
    live.emplace_back(p, sizes[i]);
  }
  std::vector<std::pair<char*, std::size_t>> sorted = live;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 1; i < sorted.size(); ++i) {
    ASSERT_LE(sorted[i - 1].first + sorted[i - 1].second, sorted[i].first) << "buffers overlap";
  }
  for (std::size_t i = 0; i < live.size(); ++i) {
    ASSERT_EQ(live[i].first[0], static_cast<char>(i & 0x7f));
    ASSERT_EQ(live[i].first[live[i].second - 1], static_cast<char>(i & 0x7f));
  }
  for (auto it = live.rbegin(); it != live.rend(); ++it) arena.deallocate(it->first, it->second);
}

std::vector<std::size_t> checkpoint_sizes() {
  return {3 * MiB, 1 * MiB + 100, 8 * MiB, 512 * KiB, 3 * MiB, 24 * KiB, 5 * MiB + 4096, 700, 2 * MiB};
}

class pinned_host_arena_test : public ::testing::TestWithParam<host_provider> {};

TEST_P(pinned_host_arena_test, pins_in_the_first_iteration_only_and_unpins_at_the_end) {
  sim_backend sim(sim_options{.backed = true});
  {
    pinned_host_arena arena(sim, GetParam());
    EXPECT_EQ(arena.provider(), GetParam());
    const std::vector<std::size_t> sizes = checkpoint_sizes();
    iterate(arena, sizes);
    const std::uint64_t warm = pins(sim);
    const std::size_t pinned = arena.stats().pinned_bytes;
    EXPECT_GT(warm, 0u);
    EXPECT_EQ(sim.counters().host_bytes, pinned);
    for (int it = 0; it < 5; ++it) iterate(arena, sizes);
    EXPECT_EQ(pins(sim), warm) << "steady state pinned again";
    EXPECT_EQ(arena.stats().pinned_bytes, pinned);

    const host_arena_stats s = arena.stats();
    EXPECT_EQ(s.pin_calls, warm);
    EXPECT_EQ(s.live_bytes, 0u);
    std::size_t total = 0;
    for (std::size_t b : sizes) total += b;
    EXPECT_EQ(s.peak_live_bytes, total);
    EXPECT_EQ(s.allocations, 6 * sizes.size());
    EXPECT_EQ(s.frees, 6 * sizes.size());
  }
  EXPECT_EQ(sim.live().host, 0u);
  EXPECT_EQ(sim.counters().host_bytes, 0u);
  EXPECT_EQ(sim.counters().of(backend_call::free_host), pins(sim));
}

TEST_P(pinned_host_arena_test, buffers_are_page_aligned_from_16_kib) {
  sim_backend sim(sim_options{.backed = true});
  pinned_host_arena arena(sim, GetParam());
  for (std::size_t bytes : {16 * KiB, 100 * KiB + 1, 4 * MiB}) {
    void* p = arena.allocate(bytes);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 4096, 0u) << bytes;
    arena.deallocate(p, bytes);
  }
  void* small = arena.allocate(24);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(small) % 16, 0u);
  arena.deallocate(small, 24);
  EXPECT_THROW((void)arena.allocate(0), invalid_argument);
  arena.deallocate(nullptr, 0);
}

TEST_P(pinned_host_arena_test, out_of_pinnable_memory_is_out_of_memory) {
  sim_backend sim(sim_options{.backed = true});
  pinned_host_arena arena(sim, GetParam());
  sim.fail_every(sim_fault_target::allocate_host, 1);
  EXPECT_THROW((void)arena.allocate(64 * MiB), out_of_memory);
  sim.reset_faults();
  void* p = arena.allocate(64 * MiB);
  EXPECT_NE(p, nullptr);
  arena.deallocate(p, 64 * MiB);
}

TEST_P(pinned_host_arena_test, threads_share_one_arena) {
  sim_backend sim(sim_options{.backed = true});
  pinned_host_arena arena(sim, GetParam());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&arena, t] {
      for (int i = 0; i < 200; ++i) {
        const std::size_t bytes = (static_cast<std::size_t>(t) + 1) * 8 * KiB + static_cast<std::size_t>(i) * 512;
        auto* p = static_cast<unsigned char*>(arena.allocate(bytes));
        p[0] = static_cast<unsigned char>(t);
        p[bytes - 1] = static_cast<unsigned char>(t);
        EXPECT_EQ(p[0], t);
        arena.deallocate(p, bytes);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(arena.stats().allocations, 800u);
  EXPECT_EQ(arena.stats().live_bytes, 0u);
}

TEST_P(pinned_host_arena_test, large_buffers_pin_what_they_need) {
  // Regression: jemalloc's retained growth pinned 7.6 GiB for 5.5 GiB of
  // 256 MiB buffers (the next size class of a geometric series each time).
  sim_backend sim(sim_options{.backed = true});  // pages are mapped, never touched
  pinned_host_arena arena(sim, GetParam());
  for (int it = 0; it < 3; ++it) {
    std::vector<void*> v;
    for (int i = 0; i < 12; ++i) v.push_back(arena.allocate(256 * MiB));
    for (void* p : v) arena.deallocate(p, 256 * MiB);
  }
  const host_arena_stats s = arena.stats();
  EXPECT_EQ(s.peak_live_bytes, 12 * 256 * MiB);
  EXPECT_LE(s.pinned_bytes, s.peak_live_bytes + 8 * MiB);  // pads and metadata
  EXPECT_LE(s.pin_calls, 13u);
}

INSTANTIATE_TEST_SUITE_P(providers, pinned_host_arena_test,
                         ::testing::Values(host_provider::jemalloc, host_provider::size_classes),
                         [](const auto& p) { return std::string(to_string(p.param)); });

TEST(pinned_host_arena, automatic_takes_the_private_jemalloc_this_program_links) {
  sim_backend sim(sim_options{.backed = true});
  pinned_host_arena arena(sim);
  EXPECT_EQ(arena.provider(), host_provider::jemalloc);
  EXPECT_EQ(arena.jemalloc_source(), "libfragctl_jemalloc");
  EXPECT_EQ(jemalloc_available(), "libfragctl_jemalloc");
}

TEST(pinned_host_arena, two_arenas_keep_their_own_extents) {
  sim_backend sim(sim_options{.backed = true});
  auto a = std::make_unique<pinned_host_arena>(sim, host_provider::jemalloc);
  pinned_host_arena b(sim, host_provider::jemalloc);
  void* pa = a->allocate(4 * MiB);
  void* pb = b.allocate(4 * MiB);
  std::memset(pb, 7, 4 * MiB);
  a->deallocate(pa, 4 * MiB);
  const std::size_t b_pinned = b.stats().pinned_bytes;
  a.reset();  // destroying a unpins its extents only
  EXPECT_EQ(sim.counters().host_bytes, b_pinned);
  EXPECT_EQ(static_cast<unsigned char*>(pb)[4 * MiB - 1], 7);
  b.deallocate(pb, 4 * MiB);
}

TEST(pinned_host_arena, size_classes_are_eight_per_doubling) {
  EXPECT_EQ(host_size_class(1), 4096u);
  EXPECT_EQ(host_size_class(4096), 4096u);
  EXPECT_EQ(host_size_class(4097), 4096u + 512);
  EXPECT_EQ(host_size_class(256 * MiB), 256 * MiB);
  EXPECT_EQ(host_size_class(256 * MiB + 1), 288 * MiB);
  EXPECT_EQ(host_size_class(300 * MiB), 320 * MiB);
  EXPECT_EQ(host_size_class(511 * MiB), 512 * MiB);
  for (std::size_t b = 4097; b < 64 * MiB; b = b * 3 / 2 + 7) {
    const std::size_t c = host_size_class(b);
    EXPECT_GE(c, b);
    EXPECT_LT(static_cast<double>(c - b), 0.125 * static_cast<double>(b)) << b;
  }
}

}  // namespace
}  // namespace fragctl::checkpoint
