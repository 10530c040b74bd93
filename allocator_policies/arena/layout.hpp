// The step plan's layout (docs/policies/arena.md, "The steady-state plan"):
// where each planned block of a step lies, so that no two blocks whose lives
// meet share an address.
//
// Greedy by size, largest first (longer lives first among equal sizes, then
// the earlier): each block goes into the first bin that holds it at the
// lowest offset free of the blocks placed before it whose lives meet its own;
// what no bin holds goes to the new range after them, which has no end.
//
// Finding the placed blocks whose lives meet a block's. A scan of every
// placed block per block (with the placed blocks kept in (bin, offset)
// order, the order the first-fit sweep reads) is O(n^2): 0.37 s for a kvgen
// step of 37,329 blocks, most of whose lives meet a few dozen others. So the
// placed blocks are split by the length of their lives. A short life (at
// most long_life allocations) is filed under the bucket of 64 allocations it
// begins in, and a short life that meets a block's began within long_life
// before the block's birth or during its life: those buckets hold them all,
// and those that meet it are sorted by value. The long lives are kept in
// (bin, offset) order and walked whole; the two are merged for the sweep.
// Where the long lives and the short ones' sort would cost about as much as
// a walk of the placed blocks (lives mostly step-long, or all just under
// long_life), the block walks every placed block in order instead, as the
// scan did; a step whose lives all last 600-1,024 allocations is still up
// to 13% slower than the scan. Memory stays O(n). Each way gives
// the same set of blocks in the sweep's order, so the layout is the scan's,
// block for block (arena_layout_test holds the two side by side); figures in
// docs/benchmarks.md, "The plan's layout indexed by time".
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace fragctl::arena_detail {

/// One block of the step: live over the step's allocations [t, due) (a life
/// with due <= t meets only lives that began after its t and end after it),
/// `bytes` long.
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
/// hold every block). A pure function of its arguments. Preconditions: the
/// items' bytes add up to less than 2^64 (no offset wraps; the plan's are
/// 512-byte units of a step's blocks), and the largest `t` is a step's
/// length (a vector of buckets per 64 allocations up to it is made). Throws
/// std::bad_alloc.
[[nodiscard]] std::uint64_t greedy_layout(std::span<const layout_item> items, std::span<const std::uint64_t> bin_bytes,
                                          std::vector<layout_place>& places, std::vector<std::uint64_t>& bin_used);

}  // namespace fragctl::arena_detail
