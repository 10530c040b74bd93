// A backed sim device with an arena on it and the live blocks it served,
// each carrying a pattern: the fixture of the arena's failure tests
// (arena_rollback_test: transactional mapping; arena_pause_test: pause and
// resume). consistent() is the arena's invariant with the device's view.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "allocator_policies/arena/arena_policy.hpp"
#include "fragctl/memory_map.hpp"
#include "fragctl/sim_backend.hpp"

namespace fragctl::testing_arena {

// The granularity: small, so that the patterns every check reads stay small.
constexpr std::size_t G = 64 * KiB;

inline void fill(void* p, std::size_t bytes, std::uint32_t seed) {
  auto* w = static_cast<std::uint32_t*>(p);
  for (std::size_t i = 0; i < bytes / 4; ++i) w[i] = seed * 2654435761u + static_cast<std::uint32_t>(i);
}
inline bool intact(const void* p, std::size_t bytes, std::uint32_t seed) {
  const auto* w = static_cast<const std::uint32_t*>(p);
  for (std::size_t i = 0; i < bytes / 4; ++i) {
    if (w[i] != seed * 2654435761u + static_cast<std::uint32_t>(i)) return false;
  }
  return true;
}

// A backed sim device, an arena on it, and the live blocks with their patterns.
class world {
 public:
  explicit world(const config& cfg) {
    sim_options o;
    o.capacity = 256 * G;
    o.granularity = G;
    o.backed = true;
    sim = std::make_unique<sim_backend>(o);
    arena = std::make_unique<arena_policy>(cfg, *sim);
  }

  void* take(std::size_t bytes) {
    void* p = arena->allocate(bytes);
    keep(p, bytes);
    return p;
  }
  // Where `p` lies in the arena's range: the first block of an empty arena
  // starts the range (backed devices place each range elsewhere).
  [[nodiscard]] std::uintptr_t offset(const void* p) const { return reinterpret_cast<std::uintptr_t>(p) - origin; }
  // Records a block the arena returned and writes its pattern, if the device
  // can access it (else writing would fault; consistent() reports it).
  void keep(void* p, std::size_t bytes) {
    if (origin == 0) origin = reinterpret_cast<std::uintptr_t>(p);
    if (sim->accessible(p, bytes)) {
      fill(p, bytes, next_seed);
    } else {
      ADD_FAILURE() << "a block of " << bytes << " bytes was served from memory the device cannot access";
    }
    blocks.push_back({p, bytes, next_seed++});
  }
  void give(void* p) {
    for (auto it = blocks.begin(); it != blocks.end(); ++it) {
      if (it->p != p) continue;
      EXPECT_TRUE(intact(p, it->bytes, it->seed)) << "a block lost its data before its free";
      arena->deallocate(p, it->bytes);
      blocks.erase(it);
      return;
    }
    ADD_FAILURE() << "not a live block";
  }

  // The arena and the device agree, and every live block is usable.
  [[nodiscard]] ::testing::AssertionResult consistent() const {
    const pool_state s = arena->state();
    std::size_t allocated = 0;
    for (const live& b : blocks) allocated += arena->allocation_size(b.bytes);
    if (s.allocated != allocated) {
      return ::testing::AssertionFailure() << "allocated " << s.allocated << ", the live blocks hold " << allocated;
    }
    if (s.reserved != sim->mapped_bytes()) {
      return ::testing::AssertionFailure()
             << "reserved " << s.reserved << ", the device has " << sim->mapped_bytes() << " bytes mapped";
    }
    if (s.reserved + arena->pooled_bytes() != sim->used_bytes() || sim->counters().held_bytes != sim->used_bytes()) {
      return ::testing::AssertionFailure()
             << "reserved " << s.reserved << " + pooled " << arena->pooled_bytes() << ", the device holds "
             << sim->used_bytes() << " (counters " << sim->counters().held_bytes << ")";
    }
    if (s.cached_free != s.reserved - s.allocated) {
      return ::testing::AssertionFailure() << "cached_free " << s.cached_free << " is not reserved - allocated";
    }
    // A mapped run the arena serves blocks from must be accessible (a span
    // left mapped without access would hand out memory the device faults on).
    for (const memory_segment& seg : arena->memory_map().segments) {
      if (!sim->accessible(reinterpret_cast<void*>(seg.address), seg.size)) {
        return ::testing::AssertionFailure()
               << "mapped run [" << seg.address << ", +" << seg.size << ") is not accessible";
      }
    }
    for (const live& b : blocks) {
      if (!sim->accessible(b.p, b.bytes)) return ::testing::AssertionFailure() << "a live block is not accessible";
      if (!intact(b.p, b.bytes, b.seed)) return ::testing::AssertionFailure() << "a live block lost its data";
      fill(b.p, b.bytes, b.seed);  // and is still writable
    }
    return ::testing::AssertionSuccess();
  }

  // Frees every block, returns the cache and destroys the arena: the device
  // must then hold nothing.
  void tear_down() {
    while (!blocks.empty()) give(blocks.back().p);
    EXPECT_EQ(arena->state().allocated, 0U);
    arena->release_cached();
    EXPECT_EQ(arena->state().reserved, 0U);
    EXPECT_EQ(arena->pooled_bytes(), 0U);
    arena.reset();
    const sim_backend::live_objects l = sim->live();
    EXPECT_EQ(l.mappings, 0U);
    EXPECT_EQ(l.physical, 0U);
    EXPECT_EQ(l.reservations, 0U);
    EXPECT_EQ(sim->used_bytes(), 0U);
  }

  struct live {
    void* p;
    std::size_t bytes;
    std::uint32_t seed;
  };
  std::unique_ptr<sim_backend> sim;
  std::unique_ptr<arena_policy> arena;
  std::vector<live> blocks;
  std::uint32_t next_seed = 1;
  std::uintptr_t origin = 0;  // the first block's address
};

}  // namespace fragctl::testing_arena
