// The C API's live-block table, device memory and graph pools
// (fragctl/fragctl.h: fragctl_block_info, fragctl_device_memory,
// fragctl_graph_pool_reclaim, policy "graph_pool") on the sim backend.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "fragctl/fragctl.h"
#include "fragctl/stats.hpp"

namespace {

fragctl_allocator* make(const char* policy, const char* options) {
  fragctl_allocator* a = nullptr;
  EXPECT_EQ(fragctl_create(policy, options, "sim", 0, &a), FRAGCTL_OK) << fragctl_last_error();
  return a;
}

fragctl_counters counters_of(fragctl_allocator* a) {
  fragctl_counters c{};
  c.struct_size = sizeof c;
  EXPECT_EQ(fragctl_get_counters(a, &c), FRAGCTL_OK) << fragctl_last_error();
  return c;
}

// The use of the map block at `p`, or -1 when the map has none there.
int use_of(fragctl_allocator* a, void* p) {
  struct context {
    std::uint64_t address;
    int use = -1;
  } found{reinterpret_cast<std::uint64_t>(p)};
  EXPECT_EQ(fragctl_memory_map(
                a,
                [](const fragctl_map_segment* s, void* v) {
                  auto& c = *static_cast<context*>(v);
                  for (std::size_t i = 0; i < s->block_count; ++i) {
                    if (s->blocks[i].address == c.address) c.use = s->blocks[i].use;
                  }
                },
                &found),
            FRAGCTL_OK)
      << fragctl_last_error();
  return found.use;
}

void* const stream_a = reinterpret_cast<void*>(0x1000);
void* const stream_b = reinterpret_cast<void*>(0x2000);
constexpr std::size_t MiB = std::size_t{1} << 20;

TEST(CApiBlocks, BlockInfoAnswersSizeAndStreamWithTheTable) {
  fragctl_allocator* a = make("caching", "sim_capacity:1GiB,block_table:true");
  void* p = nullptr;
  ASSERT_EQ(fragctl_malloc(a, &p, 3 * MiB + 1, stream_a), FRAGCTL_OK) << fragctl_last_error();
  std::size_t bytes = 0;
  void* stream = nullptr;
  ASSERT_EQ(fragctl_block_info(a, p, &bytes, &stream), FRAGCTL_OK) << fragctl_last_error();
  EXPECT_EQ(bytes, 3 * MiB + 1);
  EXPECT_EQ(stream, stream_a);
  ASSERT_EQ(fragctl_free(a, p, bytes, stream), FRAGCTL_OK);
  EXPECT_EQ(fragctl_block_info(a, p, &bytes, &stream), FRAGCTL_ERROR_NOT_OWNED);
  int local = 0;
  EXPECT_EQ(fragctl_block_info(a, &local, &bytes, &stream), FRAGCTL_ERROR_NOT_OWNED);
  char* json = nullptr;
  ASSERT_EQ(fragctl_stats_json(a, &json), FRAGCTL_OK);
  const auto stats = fragctl::stats_from_json(json);
  fragctl_string_free(json);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->misuse_not_owned, 0u) << "a lookup is not misuse";
  EXPECT_EQ(fragctl_destroy(a), FRAGCTL_OK);
}

TEST(CApiBlocks, BlockInfoWithoutTheTableIsAStateError) {
  fragctl_allocator* a = make("caching", "sim_capacity:1GiB");
  void* p = nullptr;
  ASSERT_EQ(fragctl_malloc(a, &p, MiB, stream_a), FRAGCTL_OK);
  std::size_t bytes = 0;
  void* stream = nullptr;
  EXPECT_EQ(fragctl_block_info(a, p, &bytes, &stream), FRAGCTL_ERROR_STATE);
  EXPECT_NE(std::string(fragctl_last_error()).find("block_table"), std::string::npos) << fragctl_last_error();
  EXPECT_EQ(fragctl_block_info(a, p, nullptr, &stream), FRAGCTL_ERROR_INVALID_ARGUMENT);
  ASSERT_EQ(fragctl_free(a, p, MiB, stream_a), FRAGCTL_OK);
  EXPECT_EQ(fragctl_destroy(a), FRAGCTL_OK);
}

TEST(CApiBlocks, DeviceMemoryIsTheBackendsFigure) {
  fragctl_allocator* a = make("caching", "sim_capacity:1GiB");
  std::size_t free = 0;
  std::size_t total = 0;
  ASSERT_EQ(fragctl_device_memory(a, &free, &total), FRAGCTL_OK) << fragctl_last_error();
  EXPECT_EQ(total, 1024 * MiB);
  void* p = nullptr;
  ASSERT_EQ(fragctl_malloc(a, &p, 64 * MiB, stream_a), FRAGCTL_OK);
  std::size_t free_after = 0;
  ASSERT_EQ(fragctl_device_memory(a, &free_after, &total), FRAGCTL_OK);
  EXPECT_LE(free_after + 64 * MiB, free);
  EXPECT_EQ(fragctl_device_memory(a, nullptr, &total), FRAGCTL_ERROR_INVALID_ARGUMENT);
  ASSERT_EQ(fragctl_free(a, p, 64 * MiB, stream_a), FRAGCTL_OK);
  EXPECT_EQ(fragctl_destroy(a), FRAGCTL_OK);
}

TEST(CApiGraphPool, FreedBlocksStayInThePoolCountedAsCached) {
  fragctl_allocator* pool = make("graph_pool:caching", "sim_capacity:1GiB");
  EXPECT_STREQ(fragctl_policy(pool), "graph_pool:caching");
  void* p = nullptr;
  ASSERT_EQ(fragctl_malloc(pool, &p, 5 * MiB, stream_a), FRAGCTL_OK) << fragctl_last_error();
  const fragctl_counters live = counters_of(pool);
  EXPECT_EQ(use_of(pool, p), FRAGCTL_BLOCK_LIVE);
  ASSERT_EQ(fragctl_free(pool, p, 5 * MiB, stream_a), FRAGCTL_OK);

  const fragctl_counters kept = counters_of(pool);
  EXPECT_EQ(kept.allocated, 0u) << "a block kept in the pool is free to its callers";
  EXPECT_EQ(kept.requested, 0u);
  EXPECT_EQ(kept.reserved, live.reserved) << "the pool gives nothing back";
  EXPECT_GE(kept.cached_free, 5 * MiB);
  EXPECT_EQ(use_of(pool, p), FRAGCTL_BLOCK_FREE);
  ASSERT_EQ(fragctl_release_cached(pool), FRAGCTL_OK);
  EXPECT_EQ(counters_of(pool).reserved, live.reserved) << "release_cached gave a graph pool's memory back";

  void* again = nullptr;
  ASSERT_EQ(fragctl_malloc(pool, &again, 5 * MiB, stream_a), FRAGCTL_OK);
  EXPECT_EQ(again, p) << "a later capture of the same size on the same stream reuses the block";
  std::size_t bytes = 0;
  void* stream = nullptr;
  ASSERT_EQ(fragctl_block_info(pool, again, &bytes, &stream), FRAGCTL_OK) << "a graph pool keeps its live blocks";
  EXPECT_EQ(bytes, 5 * MiB);
  EXPECT_EQ(stream, stream_a);
  ASSERT_EQ(fragctl_free(pool, again, 5 * MiB, stream_a), FRAGCTL_OK);
  EXPECT_EQ(fragctl_destroy(pool), FRAGCTL_OK);
}

TEST(CApiGraphPool, ReclaimGivesACheckpointsBlockBackAtItsAddress) {
  fragctl_allocator* pool = make("graph_pool:caching", "sim_capacity:1GiB");
  void* p = nullptr;
  void* q = nullptr;
  ASSERT_EQ(fragctl_malloc(pool, &p, 4 * MiB, stream_a), FRAGCTL_OK);
  ASSERT_EQ(fragctl_malloc(pool, &q, 4 * MiB, stream_a), FRAGCTL_OK);
  ASSERT_EQ(fragctl_free(pool, p, 4 * MiB, stream_a), FRAGCTL_OK);
  ASSERT_EQ(fragctl_free(pool, q, 4 * MiB, stream_a), FRAGCTL_OK);
  const std::uint64_t allocations = counters_of(pool).allocations;

  ASSERT_EQ(fragctl_graph_pool_reclaim(pool, q), FRAGCTL_OK) << fragctl_last_error();
  const fragctl_counters c = counters_of(pool);
  EXPECT_EQ(c.allocations, allocations + 1) << "a reclaim is counted as an allocation";
  EXPECT_EQ(c.requested, 4 * MiB);
  EXPECT_EQ(use_of(pool, q), FRAGCTL_BLOCK_LIVE);
  EXPECT_EQ(use_of(pool, p), FRAGCTL_BLOCK_FREE);
  EXPECT_EQ(fragctl_graph_pool_reclaim(pool, q), FRAGCTL_ERROR_NOT_OWNED) << "q is live already";

  void* r = nullptr;
  ASSERT_EQ(fragctl_malloc(pool, &r, 4 * MiB, stream_a), FRAGCTL_OK);
  EXPECT_EQ(r, p);
  ASSERT_EQ(fragctl_free(pool, q, 4 * MiB, stream_a), FRAGCTL_OK);
  ASSERT_EQ(fragctl_free(pool, r, 4 * MiB, stream_a), FRAGCTL_OK);
  EXPECT_EQ(fragctl_destroy(pool), FRAGCTL_OK);

  fragctl_allocator* plain = make("caching", "sim_capacity:1GiB");
  EXPECT_EQ(fragctl_graph_pool_reclaim(plain, p), FRAGCTL_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(fragctl_destroy(plain), FRAGCTL_OK);
}

TEST(CApiGraphPool, ABlockFreedOnAnotherStreamIsNotReusedOnItsOwn) {
  fragctl_allocator* pool = make("graph_pool:caching", "sim_capacity:1GiB");
  void* p = nullptr;
  ASSERT_EQ(fragctl_malloc(pool, &p, 4 * MiB, stream_a), FRAGCTL_OK);
  ASSERT_EQ(fragctl_free(pool, p, 4 * MiB, stream_b), FRAGCTL_OK);
  EXPECT_EQ(fragctl_graph_pool_reclaim(pool, p), FRAGCTL_ERROR_NOT_OWNED)
      << "freed on another stream: handed to the base policy, which waits for that stream";
  EXPECT_EQ(fragctl_destroy(pool), FRAGCTL_OK);
}

}  // namespace
