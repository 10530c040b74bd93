#include "backend/sim/address_ranges.hpp"

#include <algorithm>
#include <iterator>

namespace fragctl::sim_detail {

void address_ranges::insert(std::uintptr_t begin, std::uintptr_t end) {
  if (begin >= end) return;
  auto it = ranges_.upper_bound(begin);
  if (it != ranges_.begin()) {
    auto prev = std::prev(it);
    if (prev->second >= begin) it = prev;
  }
  while (it != ranges_.end() && it->first <= end) {
    begin = std::min(begin, it->first);
    end = std::max(end, it->second);
    it = ranges_.erase(it);
  }
  ranges_.emplace(begin, end);
}

void address_ranges::erase(std::uintptr_t begin, std::uintptr_t end) {
  if (begin >= end) return;
  auto it = ranges_.upper_bound(begin);
  if (it != ranges_.begin()) {
    auto prev = std::prev(it);
    if (prev->second > begin) {
      const std::uintptr_t prev_end = prev->second;
      if (prev->first == begin) {
        ranges_.erase(prev);
      } else {
        prev->second = begin;
      }
      if (prev_end > end) {
        ranges_.emplace(end, prev_end);
        return;
      }
      it = ranges_.upper_bound(begin);
    }
  }
  while (it != ranges_.end() && it->first < end) {
    const std::uintptr_t range_end = it->second;
    it = ranges_.erase(it);
    if (range_end > end) {
      ranges_.emplace(end, range_end);
      break;
    }
  }
}

bool address_ranges::covers(std::uintptr_t begin, std::uintptr_t end) const {
  if (begin >= end) return true;
  auto it = ranges_.upper_bound(begin);
  if (it == ranges_.begin()) return false;
  --it;
  return it->second >= end;
}

}  // namespace fragctl::sim_detail
