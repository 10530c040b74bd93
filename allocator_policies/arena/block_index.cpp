#include "allocator_policies/arena/block_index.hpp"

namespace fragctl::arena_detail {

void block_index::reset(std::uintptr_t base, std::size_t bytes) {
  nodes_.clear();
  live_.clear();
  spare_ = nil;
  for (auto& group : heads_) group.fill(nil);
  sl_map_.fill(0);
  group_map_ = 0;
  nodes_.reserve(4096);
  live_.reserve(4096);
  live_room_ = 4096;
  block whole;
  whole.addr = whole.dirty_lo = whole.dirty_hi = base;
  whole.size = bytes;
  whole.is_free = true;
  nodes_.push_back(whole);
  link_free(0);
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
