#include "checkpoint/region.hpp"

#include <cassert>
#include <iterator>

namespace fragctl::checkpoint {

region::region(std::size_t bytes) : size_(bytes), free_(bytes) {
  if (bytes > 0) insert(0, range{bytes, {}});
}

std::size_t region::largest_free() const noexcept {
  return by_size_.empty() ? 0 : by_size_.rbegin()->first;
}

std::vector<marker_ref> region::fences() const {
  std::vector<marker_ref> all;
  for (const auto& [offset, r] : by_offset_) {
    for (const marker_ref& f : r.fences) add_fence(all, f);
  }
  return all;
}

void region::insert(std::size_t offset, range r) {
  by_size_.insert({r.bytes, offset});
  by_offset_.emplace(offset, std::move(r));
}

std::optional<region::block> region::allocate(std::size_t bytes) {
  assert(bytes > 0);
  auto fit = by_size_.lower_bound({bytes, 0});
  if (fit == by_size_.end()) return std::nullopt;
  const std::size_t offset = fit->second;
  by_size_.erase(fit);
  auto node = by_offset_.extract(offset);
  range& r = node.mapped();
  block b{offset, r.fences};
  if (r.bytes > bytes) {
    r.bytes -= bytes;
    insert(offset + bytes, std::move(r));
  }
  free_ -= bytes;
  return b;
}

void region::release(std::size_t offset, std::size_t bytes, marker_ref fence) {
  range r{bytes, {}};
  add_fence(r.fences, std::move(fence));
  std::size_t start = offset;
  // Coalesce with the free range that ends where this one starts.
  auto next = by_offset_.lower_bound(offset);
  if (next != by_offset_.begin()) {
    auto prev = std::prev(next);
    assert(prev->first + prev->second.bytes <= offset);
    if (prev->first + prev->second.bytes == offset) {
      start = prev->first;
      r.bytes += prev->second.bytes;
      for (marker_ref& f : prev->second.fences) add_fence(r.fences, std::move(f));
      by_size_.erase({prev->second.bytes, prev->first});
      by_offset_.erase(prev);
    }
  }
  // And with the one that starts where it ends.
  next = by_offset_.lower_bound(offset);
  if (next != by_offset_.end() && next->first == offset + bytes) {
    r.bytes += next->second.bytes;
    for (marker_ref& f : next->second.fences) add_fence(r.fences, std::move(f));
    by_size_.erase({next->second.bytes, next->first});
    by_offset_.erase(next);
  } else {
    assert(next == by_offset_.end() || next->first > offset + bytes);
  }
  free_ += bytes;
  insert(start, std::move(r));
}

}  // namespace fragctl::checkpoint
