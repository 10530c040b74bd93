// device_allocator::memory_map(): the caching and arena policies' layouts, pass-through
// by adaptors and wrappers, the default for policies that do not describe
// theirs, and the JSON round trip.

#include "core/passthrough_allocator.hpp"
#include "fragctl/adaptors.hpp"
#include "fragctl/allocator_stack.hpp"
#include "fragctl/memory_map.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/sim_backend.hpp"
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <memory>

namespace fragctl {
namespace {

std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

std::unique_ptr<allocator_stack> sim_stack(const std::string& policy) {
  config cfg;
  cfg.backend = backend_kind::sim;
  cfg.policy = policy;
  return make_allocator(cfg);
}

void expect_tiled(const memory_snapshot& m) {
  for (const memory_segment& s : m.segments) {
    std::uintptr_t at = s.address;
    for (const memory_block& b : s.blocks) {
      EXPECT_EQ(b.address, at) << "blocks tile their segment in address order";
      at += b.size;
    }
    EXPECT_EQ(at, s.address + s.size);
  }
}

TEST(memory_map, caching_lists_segments_and_tiling_blocks) {
  const auto stack = sim_stack("caching");
  device_allocator& a = stack->allocator();
  void* small1 = a.allocate(1000);
  void* small2 = a.allocate(4096);
  void* large = a.allocate(30 * MiB);

  const memory_snapshot m = a.memory_map();
  ASSERT_TRUE(m.available);
  EXPECT_EQ(m.allocator, "caching");
  ASSERT_EQ(m.segments.size(), 2u);
  EXPECT_EQ(m.reserved_bytes(), 2 * MiB + 30 * MiB);
  EXPECT_EQ(m.reserved_bytes(), a.state().reserved);

  const memory_segment& small_seg = addr(small1) >= m.segments[0].address &&
                                            addr(small1) < m.segments[0].address + m.segments[0].size
                                        ? m.segments[0]
                                        : m.segments[1];
  const memory_segment& large_seg = &small_seg == &m.segments[0] ? m.segments[1] : m.segments[0];
  EXPECT_EQ(small_seg.pool, "small");
  EXPECT_EQ(small_seg.size, 2 * MiB);
  ASSERT_EQ(small_seg.blocks.size(), 3u);
  EXPECT_EQ(small_seg.blocks[0], (memory_block{addr(small1), 1024, 1000, block_use::live, nullptr}));
  EXPECT_EQ(small_seg.blocks[1], (memory_block{addr(small2), 4096, 4096, block_use::live, nullptr}));
  EXPECT_EQ(small_seg.blocks[2].use, block_use::free);
  EXPECT_EQ(small_seg.blocks[2].size, 2 * MiB - 5120);
  EXPECT_EQ(large_seg.pool, "large");
  ASSERT_EQ(large_seg.blocks.size(), 1u);
  EXPECT_EQ(large_seg.blocks[0].use, block_use::live);
  EXPECT_EQ(large_seg.blocks[0].requested, 30 * MiB);

  expect_tiled(m);

  // A freed block merges with the free tail.
  a.deallocate(small2, 4096);
  const memory_snapshot after = a.memory_map();
  EXPECT_EQ(after.bytes(block_use::live), 1024 + 30 * MiB);
  EXPECT_EQ(after.largest_free_block(), 2 * MiB - 1024);
  EXPECT_EQ(after.block_count(), 3u);

  a.deallocate(small1, 1000);
  a.deallocate(large, 30 * MiB);
}

TEST(memory_map, cross_stream_free_is_pending_until_its_event_completes) {
  sim_options o;
  o.manual_completion = true;
  sim_backend sim(o);
  config cfg;
  const std::unique_ptr<device_allocator> policy = make_policy("caching", cfg, sim);
  const stream_t other = sim.create_stream();
  void* p = policy->allocate(4096);
  sim.submit(other);
  policy->deallocate(p, 4096, other);
  const memory_snapshot m = policy->memory_map();
  ASSERT_EQ(m.segments.size(), 1u);
  ASSERT_FALSE(m.segments[0].blocks.empty());
  EXPECT_EQ(m.segments[0].blocks[0].use, block_use::pending);
  EXPECT_EQ(m.bytes(block_use::pending), 4096u);
  sim.complete_all();
  policy->release_cached();
  sim.destroy_stream(other);
}

// The arena's segments are its runs of mapped granules, tiled by its blocks;
// a block that reaches into unmapped address space is cut at the run's end.
TEST(memory_map, arena_segments_are_mapped_runs_tiled_by_blocks) {
  const auto stack = sim_stack("arena");
  device_allocator& a = stack->allocator();
  void* small = a.allocate(1000);
  void* mid = a.allocate(3 * MiB);
  void* big = a.allocate(5 * MiB);

  memory_snapshot m = a.memory_map();
  ASSERT_TRUE(m.available);
  EXPECT_EQ(m.allocator, "arena");
  ASSERT_FALSE(m.segments.empty());
  EXPECT_EQ(m.segments.size(), a.state().segments);
  EXPECT_EQ(m.reserved_bytes(), a.state().reserved);
  EXPECT_EQ(m.bytes(block_use::live), a.state().allocated);
  EXPECT_EQ(m.bytes(block_use::live), 1024 + 3 * MiB + 5 * MiB);
  EXPECT_EQ(m.bytes(block_use::free), a.state().cached_free);
  EXPECT_EQ(m.segments[0].pool, "mapped");
  expect_tiled(m);
  bool found = false;
  for (const memory_segment& seg : m.segments) {
    for (const memory_block& b : seg.blocks) {
      if (b.address == addr(mid)) {
        EXPECT_EQ(b, (memory_block{addr(mid), 3 * MiB, 3 * MiB, block_use::live, nullptr}));
        found = true;
      }
    }
  }
  EXPECT_TRUE(found) << "the 3 MiB block is in the map";

  a.deallocate(mid, 3 * MiB);
  m = a.memory_map();
  EXPECT_EQ(m.bytes(block_use::live), 1024 + 5 * MiB);
  EXPECT_EQ(m.reserved_bytes(), a.state().reserved);
  expect_tiled(m);
  a.deallocate(small, 1000);
  a.deallocate(big, 5 * MiB);
}

// With no hysteresis the freed block's granules are unmapped at once: two
// runs, and the free block between the live ones is cut at each run's end.
TEST(memory_map, arena_blocks_are_cut_at_the_ends_of_mapped_runs) {
  sim_backend sim;
  auto cfg = parse_config("release_threshold:0,release_delay:0,map_chunk:2MiB");
  ASSERT_TRUE(cfg.ok());
  const std::unique_ptr<device_allocator> policy = make_policy("arena", *cfg, sim);
  void* low = policy->allocate(3 * MiB);
  void* mid = policy->allocate(8 * MiB);
  void* high = policy->allocate(3 * MiB);
  policy->deallocate(mid, 8 * MiB);
  const memory_snapshot m = policy->memory_map();
  EXPECT_EQ(m.segments.size(), policy->state().segments);
  ASSERT_GE(m.segments.size(), 2u) << "the middle granules were unmapped";
  EXPECT_EQ(m.reserved_bytes(), policy->state().reserved);
  EXPECT_EQ(m.bytes(block_use::live), policy->state().allocated);
  expect_tiled(m);
  for (const memory_segment& seg : m.segments) {
    for (const memory_block& b : seg.blocks) {
      EXPECT_FALSE(b.address < addr(mid) + 8 * MiB && addr(mid) + 2 * MiB <= b.address &&
                   b.address + b.size <= addr(mid) + 6 * MiB)
          << "no block inside the unmapped middle granules";
    }
  }
  policy->deallocate(low, 3 * MiB);
  policy->deallocate(high, 3 * MiB);
}

TEST(memory_map, arena_free_on_another_stream_is_pending_on_that_stream) {
  sim_options o;
  o.manual_completion = true;
  sim_backend sim(o);
  config cfg;
  const std::unique_ptr<device_allocator> policy = make_policy("arena", cfg, sim);
  const stream_t other = sim.create_stream();
  void* keep = policy->allocate(8192);
  void* p = policy->allocate(4096);
  sim.submit(other);
  policy->deallocate(p, 4096, other);
  const memory_snapshot m = policy->memory_map();
  expect_tiled(m);
  EXPECT_EQ(m.bytes(block_use::pending), 4096u);
  bool found = false;
  for (const memory_segment& seg : m.segments) {
    for (const memory_block& b : seg.blocks) {
      if (b.use == block_use::pending) {
        EXPECT_EQ(b.address, addr(p));
        EXPECT_EQ(b.stream, other);
        found = true;
      }
    }
  }
  EXPECT_TRUE(found);
  policy->deallocate(keep, 8192);
  sim.complete_all();
  policy->release_cached();
  sim.destroy_stream(other);
}

TEST(memory_map, arena_without_virtual_memory_is_one_fallback_block) {
  sim_options o;
  o.virtual_memory = false;
  o.capacity = 256 * MiB;
  sim_backend sim(o);
  config cfg;
  const std::unique_ptr<device_allocator> policy = make_policy("arena", cfg, sim);
  void* p = policy->allocate(MiB);
  const memory_snapshot m = policy->memory_map();
  ASSERT_EQ(m.segments.size(), 1u);
  EXPECT_EQ(m.segments[0].pool, "fallback block");
  EXPECT_EQ(m.reserved_bytes(), policy->state().reserved);
  EXPECT_EQ(m.bytes(block_use::live), MiB);
  expect_tiled(m);
  policy->deallocate(p, MiB);
}

TEST(memory_map, wrappers_and_adaptors_answer_with_the_base_layout) {
  const auto stack = sim_stack("buckets:caching");
  device_allocator& a = stack->allocator();
  void* p = a.allocate(4096);  // a slot of a 2 MiB slab, which is a caching block
  const memory_snapshot m = a.memory_map();
  ASSERT_TRUE(m.available);
  EXPECT_EQ(m.allocator, "caching");
  EXPECT_EQ(m.bytes(block_use::live), 2 * MiB);
  a.deallocate(p, 4096);
}

TEST(memory_map, policies_without_a_layout_say_so) {
  sim_backend sim;
  statistics_adaptor stats(std::make_unique<testing::passthrough_allocator>(sim));
  void* p = stats.allocate(4096);
  const memory_snapshot m = stats.memory_map();
  EXPECT_FALSE(m.available);
  EXPECT_EQ(m.allocator, "passthrough");
  EXPECT_TRUE(m.segments.empty());
  stats.deallocate(p, 4096);
}

TEST(memory_map, json_round_trip) {
  memory_snapshot m;
  m.available = true;
  m.allocator = "caching";
  m.segments.push_back({0x7f0000000000, 4096, reinterpret_cast<stream_t>(0x10), "small",
                        {{0x7f0000000000, 1024, 1000, block_use::live, reinterpret_cast<stream_t>(0x10)},
                         {0x7f0000000400, 1024, 0, block_use::pending, reinterpret_cast<stream_t>(0x20)},
                         {0x7f0000000800, 2048, 0, block_use::free, reinterpret_cast<stream_t>(0x10)}}});
  const std::string text = to_json(m);
  EXPECT_THAT(text, ::testing::HasSubstr("\"address\": \"0x7f0000000000\""));
  const auto back = memory_snapshot_from_json(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, m);

  // Over the block budget, segments stay and blocks go.
  const auto trimmed = memory_snapshot_from_json(to_json(m, 2));
  ASSERT_TRUE(trimmed.ok());
  ASSERT_EQ(trimmed->segments.size(), 1u);
  EXPECT_TRUE(trimmed->segments[0].blocks.empty());

  EXPECT_FALSE(memory_snapshot_from_json("{\"segments\": [{\"address\": 12}]}").ok());
  EXPECT_FALSE(memory_snapshot_from_json("{\"segments\": [{\"blocks\": [{\"use\": \"gone\"}]}]}").ok());
}

}  // namespace
}  // namespace fragctl
