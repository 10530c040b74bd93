// Physical pages behind the arena's address range (page stitching).
//
// The reserved range is cut into granules (the backend's granularity, 2 MiB
// on H100/H200). For each granule the map keeps how many live blocks touch
// it, the stamp of the frees that touched it (stream_clock), and the physical
// handle mapped there, if any. Every handle is exactly one granule, so any
// page can be stitched in at any granule of the range.
//
// States of a granule:
//   unmapped               no handle; its physical memory is elsewhere
//   live                   mapped, touched by at least one live block
//   cached                 mapped, touched by none; in an LRU list, oldest first
// and handles not mapped anywhere wait in the *pool*.
//
// Where a block lands on unmapped granules, map_range() maps a handle from
// the pool onto each, or *steals* one (unmaps the oldest cached granule whose
// frees are complete), and creates a new handle only when neither exists; a
// run of consecutive granules gets one set_access call. trim() unmaps cached
// granules beyond a byte budget into the pool. So physical memory held only
// grows when every held page is touched by live memory (or by frees still in
// flight on a GPU), whatever the addresses.
//
// Not thread-safe. The hot calls (covered, on_allocate, on_free) make no
// backend call and no heap allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "allocator_policies/arena/block_index.hpp"
#include "allocator_policies/arena/stream_clock.hpp"
#include "fragctl/backend.hpp"

namespace fragctl::arena_detail {

class granule_map {
 public:
  /// Covers [base, base + bytes) (granule-aligned) with granules of
  /// `granularity`; holds at most `physical_limit` bytes of handles.
  granule_map(device_backend& backend, stream_clock& clock, std::uintptr_t base, std::size_t bytes,
              std::size_t granularity, std::size_t physical_limit);
  /// Unmaps and releases every handle. The owner must first make sure no
  /// queued work uses the memory (stream_clock::synchronize_all).
  ~granule_map();
  granule_map(const granule_map&) = delete;
  granule_map& operator=(const granule_map&) = delete;

  /// Whether every granule of [addr, addr + bytes) is mapped.
  [[nodiscard]] bool covered(std::uintptr_t addr, std::size_t bytes) const noexcept {
    for (std::size_t g = first(addr), last = last_of(addr, bytes); g <= last; ++g) {
      if (handles_[g] == 0) return false;
    }
    return true;
  }

  /// A live block now covers [addr, addr + bytes), all mapped.
  void on_allocate(std::uintptr_t addr, std::size_t bytes) noexcept {
    for (std::size_t g = first(addr), last = last_of(addr, bytes); g <= last; ++g) {
      if (granules_[g].live++ == 0) lru_remove(g);
    }
  }

  /// The live block [addr, addr + bytes) was freed with `stamp` at time
  /// `now` (any monotonic count). Returns whether a granule became cached (no
  /// live block touches it any more).
  bool on_free(std::uintptr_t addr, std::size_t bytes, free_stamp stamp, std::uint64_t now) noexcept {
    // Highest address first, so that trimming (oldest first) unmaps a freed
    // range from its top and what stays mapped is where the next block in
    // that range is carved (from its bottom).
    bool cached = false;
    for (std::size_t g = last_of(addr, bytes) + 1, lo = first(addr); g-- > lo;) {
      granule& gr = granules_[g];
      gr.stamp = clock_.merge(gr.stamp, stamp);
      if (--gr.live == 0) {
        gr.cached_at = now;
        lru_push(g);
        cached = true;
      }
    }
    return cached;
  }

  /// When the oldest cached granule became cached (on_free's `now`), if any.
  [[nodiscard]] std::optional<std::uint64_t> oldest_cached() const noexcept {
    const std::uint32_t g = lru_next_[sentinel_];
    if (g == sentinel_) return std::nullopt;
    return granules_[g].cached_at;
  }

  /// Maps every unmapped granule of [addr, addr + bytes): handles from the
  /// pool, then stolen from complete cached granules outside the range, then
  /// created. With `wait`, blocks for pending frees before giving up. Returns
  /// false when out of memory; then only cache and pool changed.
  [[nodiscard]] bool map_range(std::uintptr_t addr, std::size_t bytes, bool wait);

  /// Unmaps cached granules that became cached at or before `before`,
  /// oldest first, while more than `keep` bytes are cached; skips granules
  /// whose frees are not complete yet. Never blocks.
  void trim(std::size_t keep, std::uint64_t before);
  /// Unmaps every cached granule and releases every pooled handle. The owner
  /// must have synchronized pending frees (stream_clock::synchronize_all).
  void release_unused();

  [[nodiscard]] std::size_t granularity() const noexcept { return granularity_; }
  [[nodiscard]] std::size_t cached_bytes() const noexcept { return cached_ * granularity_; }
  [[nodiscard]] std::size_t mapped_bytes() const noexcept { return mapped_ * granularity_; }
  [[nodiscard]] std::size_t pooled_bytes() const noexcept { return pool_.size() * granularity_; }
  [[nodiscard]] std::size_t held_bytes() const noexcept { return mapped_bytes() + pooled_bytes(); }
  [[nodiscard]] std::size_t physical_limit() const noexcept { return limit_; }
  /// Maximal runs of consecutive mapped granules.
  [[nodiscard]] std::size_t mapped_runs() const noexcept;
  /// Calls f(addr, bytes) for every maximal run of mapped granules, in
  /// address order.
  template <class F>
  void for_each_mapped_run(F&& f) const {
    const std::size_t n = handles_.size();
    for (std::size_t g = 0; g < n;) {
      if (handles_[g] == 0) {
        ++g;
        continue;
      }
      std::size_t end = g + 1;
      while (end < n && handles_[end] != 0) ++end;
      f(base_ + (g << shift_), (end - g) << shift_);
      g = end;
    }
  }
  /// Longest part of [addr, addr + bytes) whose granules are all mapped.
  [[nodiscard]] std::size_t longest_mapped(std::uintptr_t addr, std::size_t bytes) const noexcept;

 private:
  struct granule {
    std::uint32_t live = 0;      // live blocks touching it
    free_stamp stamp;            // frees that touched it since it was last known idle
    std::uint64_t cached_at = 0;  // when it was last cached
  };

  [[nodiscard]] std::size_t first(std::uintptr_t addr) const noexcept { return (addr - base_) >> shift_; }
  [[nodiscard]] std::size_t last_of(std::uintptr_t addr, std::size_t bytes) const noexcept {
    return (addr + bytes - 1 - base_) >> shift_;
  }
  [[nodiscard]] void* address(std::size_t g) const noexcept {
    return reinterpret_cast<void*>(base_ + (g << shift_));
  }

  void lru_push(std::size_t g) noexcept;
  void lru_remove(std::size_t g) noexcept;
  /// Whether the frees that touched granule g are complete, refreshing each
  /// stream at most once per `refreshed` mask (bit i: stream i, bit 63: all).
  [[nodiscard]] bool idle(std::size_t g, std::uint64_t& refreshed);
  /// Unmaps cached granule g into the pool.
  void unmap_to_pool(std::size_t g);
  /// Fills the pool to `need` handles without touching granules [lo, hi].
  [[nodiscard]] bool fill_pool(std::size_t need, std::size_t lo, std::size_t hi);
  /// Undoes the mapping of granules [lo, hi) that map_range just mapped.
  void unmap_fresh(std::size_t lo, std::size_t hi) noexcept;

  device_backend& backend_;
  stream_clock& clock_;
  std::uintptr_t base_;
  std::size_t granularity_;
  unsigned shift_;
  std::size_t limit_;  // bytes of handles the map may hold
  std::size_t created_ = 0;  // handles held (mapped + pooled)
  std::size_t mapped_ = 0;
  std::size_t cached_ = 0;
  std::vector<granule> granules_;
  std::vector<std::uint64_t> handles_;  // physical_handle value mapped at each granule; 0 = none
  // LRU of cached granules: a circular list through index `sentinel_`.
  std::vector<std::uint32_t> lru_prev_, lru_next_;
  std::uint32_t sentinel_;
  std::vector<physical_handle> pool_;
};

}  // namespace fragctl::arena_detail
