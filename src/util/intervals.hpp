// Whether a set of address ranges covers a range: the check that memory
// handed to another process (device_allocator::share) is all live blocks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace fragctl::util {

/// Whether `parts` (half-open [first, second) ranges, any order, may
/// overlap) cover every address of [lo, hi). Reorders `parts`.
[[nodiscard]] inline bool covers(std::vector<std::pair<std::uintptr_t, std::uintptr_t>>& parts, std::uintptr_t lo,
                                 std::uintptr_t hi) {
  std::sort(parts.begin(), parts.end());
  std::uintptr_t at = lo;
  for (const auto& [first, second] : parts) {
    if (at >= hi) break;
    if (second <= at) continue;
    if (first > at) return false;
    at = second;
  }
  return at >= hi;
}

}  // namespace fragctl::util
