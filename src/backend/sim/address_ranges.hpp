// A set of disjoint half-open address ranges, merged where they touch. The sim
// backend keeps the ranges the device was granted access to (set_access) in
// one, so that checking a copy or an access is a single ordered lookup.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/container/btree_map.h"

namespace fragctl::sim_detail {

class address_ranges {
 public:
  /// Adds [begin, end); merges with ranges it overlaps or touches.
  void insert(std::uintptr_t begin, std::uintptr_t end);
  /// Removes [begin, end), splitting a range that straddles either end.
  void erase(std::uintptr_t begin, std::uintptr_t end);
  /// True when every address of [begin, end) is in the set (true if empty).
  [[nodiscard]] bool covers(std::uintptr_t begin, std::uintptr_t end) const;
  /// Number of disjoint ranges.
  [[nodiscard]] std::size_t size() const noexcept { return ranges_.size(); }

 private:
  absl::btree_map<std::uintptr_t, std::uintptr_t> ranges_;  // begin -> end
};

}  // namespace fragctl::sim_detail
