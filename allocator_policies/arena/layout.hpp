// The step plan's layout (docs/policies/arena.md, "The steady-state plan"):
// where each planned block of a step lies, so that no two blocks whose lives
// meet share an address.
//
// Greedy by size, largest first (longer lives first among equal sizes, then
// the earlier): each block goes into the first bin that holds it at the
// lowest offset free of the blocks placed before it whose lives meet its own;
// what no bin holds goes to the new range after them, which has no end.
//
// Cost. A block's lifetime meets few others' (a kvgen step of 37,329 blocks:
// 44 on average), so the blocks placed so far are indexed by time: each is
// filed in every bucket of kBucket allocations its life touches, and a
// block's neighbours in time are read from its own buckets, each counted in
// the first bucket where both lives are. That makes the layout about
// O(n (b + k log k)) for n blocks, b the blocks filed in a bucket and k the
// neighbours, against O(n^2) for a scan of every placed block (the kvgen
// step: 0.4 s on the build machine, docs/benchmarks.md). The result is the
// scan's, block for block (arena_layout_test holds the two side by side).
// The index takes a bucket per kBucket allocations up to the latest `due`:
// a step's lives, below 2^20 allocations in the plan (its history's cap).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace fragctl::arena_detail {

/// One block of the step: live over the step's allocations [t, due), `bytes` long.
struct layout_item {
  std::uint32_t t, due;
  std::uint64_t bytes;
};

/// Where a block lies: its bin (bin == the bins' count: the new range) and its offset there.
struct layout_place {
  std::uint32_t bin = 0;
  std::uint64_t offset = 0;
};

/// Lays `items` out in bins of `bin_bytes` (tried in order) and a new range
/// after them. Writes `places[i]` for items[i] and `bin_used[b]`, the extent
/// the layout uses in bin b; returns the new range's extent (0: the bins
/// hold every block).
[[nodiscard]] std::uint64_t greedy_layout(std::span<const layout_item> items,
                                          std::span<const std::uint64_t> bin_bytes,
                                          std::vector<layout_place>& places, std::vector<std::uint64_t>& bin_used);

}  // namespace fragctl::arena_detail
