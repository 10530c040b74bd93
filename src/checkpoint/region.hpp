// Offsets inside the checkpoint store's device region.
//
// Best fit over free ranges (ordered by size, then offset), split on
// allocation and coalesced with both neighbours on release. Each free range
// carries fences: per stream, the latest marker after which its memory is no
// longer used there (a copy out of it, a backward kernel reading it). Whoever
// takes a block must order its stream after the fences of other streams;
// fences are conservative, so a block split off a range takes all of the
// range's fences and coalesced ranges keep both sets. Not thread-safe.
#pragma once

#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "core/stream_marker.hpp"

namespace fragctl::checkpoint {

class region {
 public:
  /// A region of `bytes`, all free, with no fences.
  explicit region(std::size_t bytes);

  struct block {
    std::size_t offset = 0;
    std::vector<marker_ref> fences;
  };

  /// The lowest-addressed of the smallest free ranges that hold `bytes` (> 0),
  /// carved from its start; nullopt when no range is large enough.
  [[nodiscard]] std::optional<block> allocate(std::size_t bytes);
  /// Returns [offset, offset + bytes) (from allocate) with one more fence
  /// (null for none).
  void release(std::size_t offset, std::size_t bytes, marker_ref fence);

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t free_bytes() const noexcept { return free_; }
  [[nodiscard]] std::size_t largest_free() const noexcept;
  /// Every fence of every free range (for a final wait before the region goes).
  [[nodiscard]] std::vector<marker_ref> fences() const;
  /// Number of free ranges (1 when nothing is allocated).
  [[nodiscard]] std::size_t free_ranges() const noexcept { return by_offset_.size(); }

 private:
  struct range {
    std::size_t bytes = 0;
    std::vector<marker_ref> fences;
  };
  void insert(std::size_t offset, range r);

  std::size_t size_;
  std::size_t free_;
  absl::btree_map<std::size_t, range> by_offset_;
  absl::btree_set<std::pair<std::size_t, std::size_t>> by_size_;  // (bytes, offset)
};

}  // namespace fragctl::checkpoint
