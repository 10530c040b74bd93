#include "allocator_policies/arena/block_index.hpp"

namespace fragctl::arena_detail {

// The owner's birth fields sit in the node's padding: a node of 80 bytes,
// as before them (the nodes are the hot path's memory traffic).
static_assert(sizeof(block_index::block) == 80);

void block_index::reset(std::uintptr_t base, std::size_t bytes) {
  nodes_.clear();
  live_.clear();
  spare_ = nil;
  for (auto& group : heads_) group.fill(nil);
  sl_map_.fill(0);
  group_map_ = 0;
  nodes_.reserve(4096);
  live_.reserve(4096);
  block whole;
  whole.addr = whole.dirty_lo = whole.dirty_hi = base;
  whole.size = bytes;
  whole.is_free = true;
  nodes_.push_back(whole);
  link_free(0);
}

std::uintptr_t block_index::allocate_at(std::uint32_t id, std::uintptr_t at, std::size_t bytes, std::size_t requested,
                                        birth n) {
  if (at == nodes_[id].addr) return allocate({id, side::front}, bytes, requested, n);
  if (at + bytes == nodes_[id].addr + nodes_[id].size) return allocate({id, side::back}, bytes, requested, n);
  unlink_free(id);  // prepare() left two spare nodes: one for this split, one for allocate()
  const std::uint32_t upper = take_spare();
  block& lo = nodes_[id];
  block& up = nodes_[upper];
  up = lo;
  up.prev_free = up.next_free = nil;
  up.addr = at;
  up.size = lo.addr + lo.size - at;
  up.prev = id;
  if (lo.next != nil) nodes_[lo.next].prev = upper;
  lo.next = upper;
  lo.size = at - lo.addr;
  clip(lo);
  clip(up);
  link_free(id);
  link_free(upper);
  return allocate({upper, side::front}, bytes, requested, n);
}

void address_table::reserve(std::size_t n) {
  if (n <= room()) return;
  std::size_t capacity = 64;
  while (capacity / 2 < n) capacity *= 2;
  std::vector<slot> old(capacity);
  old.swap(slots_);
  mask_ = capacity - 1;
  shift_ = 64 - static_cast<unsigned>(std::countr_zero(capacity));
  size_ = 0;
  for (const slot& s : old) {
    if (s.id != nil) insert(s.addr, s.id, s.tag);
  }
}

void block_index::grow() {
  // Doubling keeps growth amortized; recycled nodes are used first.
  const auto first = static_cast<std::uint32_t>(nodes_.size());
  const std::size_t more = nodes_.empty() ? 64 : nodes_.size();
  nodes_.resize(nodes_.size() + more);
  for (std::size_t i = nodes_.size(); i-- > first;) {
    nodes_[i].next_free = spare_;
    spare_ = static_cast<std::uint32_t>(i);
  }
}

}  // namespace fragctl::arena_detail
