// The `graph_pool` policy (graph_pool_policy.hpp).
#include "allocator_policies/graph_pool/graph_pool_policy.hpp"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "fmt/format.h"
#include "fragctl/error.hpp"

namespace fragctl {

config graph_pool_upstream_config(const config& cfg) {
  config upstream = cfg;
  upstream.release_on_oom = false;
  upstream.release_threshold = SIZE_MAX;
  return upstream;
}

graph_pool_policy::graph_pool_policy(const config& /*cfg*/, std::unique_ptr<device_allocator> upstream)
    : upstream_(std::move(upstream)) {
  if (!upstream_) throw invalid_argument("graph_pool: upstream is null");
  name_ = fmt::format("{}:{}", policy_name, upstream_->name());
}

graph_pool_policy::~graph_pool_policy() { return_kept(); }

void graph_pool_policy::do_stream_ending(stream_t stream) {
  // Its blocks' frees, and the kept blocks' return to the upstream, name
  // the block's stream: the default stream's from now on, as the
  // upstream's blocks of the stream become. The upstream first: it may
  // fail, this cannot.
  forget_stream(*upstream_, stream);
  for (auto& [ptr, block] : live_) {
    if (block.stream == stream) block.stream = nullptr;
  }
  for (auto& [bytes, kept] : kept_) {
    if (kept.stream == stream) kept.stream = nullptr;
  }
}

std::optional<block_record> graph_pool_policy::claim(void* ptr) {
  const auto it = kept_by_ptr_.find(ptr);
  if (it == kept_by_ptr_.end()) return std::nullopt;
  claimed_ = ptr;
  return block_record{it->second->first, it->second->second.stream};
}

void graph_pool_policy::take(kept_index::iterator it) {
  kept_bytes_ -= upstream_->allocation_size(it->first);
  kept_by_ptr_.erase(it->second.ptr);
  kept_.erase(it);
}

void* graph_pool_policy::reuse(std::size_t bytes, stream_t stream) {
  auto [lo, hi] = kept_.equal_range(bytes);
  auto match = hi;
  if (claimed_ != nullptr) {
    match = std::find_if(lo, hi, [&](const auto& k) { return k.second.ptr == claimed_; });
    claimed_ = nullptr;
  }
  if (match == hi) match = std::find_if(lo, hi, [&](const auto& k) { return k.second.stream == stream; });
  if (match == hi || match->second.stream != stream) return nullptr;
  void* ptr = match->second.ptr;
  take(match);
  return ptr;
}

// A block the pool keeps is live upstream but free here: the next capture
// takes it while another process would use it.
shared_memory graph_pool_policy::do_share(void* ptr, std::size_t bytes) const {
  const auto a = reinterpret_cast<std::uintptr_t>(ptr);
  const std::uintptr_t end = a + std::max<std::size_t>(bytes, 1);
  for (const auto& [kept_ptr, it] : kept_by_ptr_) {
    const auto k = reinterpret_cast<std::uintptr_t>(kept_ptr);
    if (k < end && a < k + upstream_->allocation_size(it->first)) {
      throw invalid_argument(fmt::format(
          "{}: share({}, {}): not live memory of this allocator (a freed block the pool keeps)", name_, ptr, bytes));
    }
  }
  return upstream_->share(ptr, bytes);
}

void* graph_pool_policy::do_allocate(std::size_t bytes, stream_t stream) {
  live_.reserve(live_.size() + 1);  // the insert below cannot throw
  void* ptr = reuse(bytes, stream);
  if (ptr == nullptr) {
    try {
      ptr = upstream_->allocate(bytes, stream);
    } catch (const out_of_memory&) {
      if (kept_.empty()) throw;
      // The kept blocks stay the pool's: the upstream is private to it.
      return_kept();
      ++retries_;
      ptr = upstream_->allocate(bytes, stream);
    }
  }
  live_.emplace(ptr, block_record{bytes, stream});
  return ptr;
}

free_result graph_pool_policy::do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept {
  const auto it = live_.find(ptr);
  if (it == live_.end()) return {free_status::not_owned, 0};
  const block_record block = it->second;
  const free_status status = bytes == block.bytes ? free_status::ok : free_status::size_mismatch;
  if (stream != block.stream) {
    // Used on another stream: the upstream keeps it until that stream's work is done.
    const free_result upstream = upstream_->try_deallocate(ptr, block.bytes, stream);
    if (upstream.status == free_status::not_owned) return upstream;
    live_.erase(it);
    return {status, block.bytes};
  }
  try {
    const auto kept = kept_.emplace(block.bytes, kept_block{ptr, block.stream});
    try {
      kept_by_ptr_.emplace(ptr, kept);
    } catch (...) {
      kept_.erase(kept);
      throw;
    }
  } catch (...) {
    // No memory for the pool's own index: the upstream takes the block.
    live_.erase(it);
    (void)upstream_->try_deallocate(ptr, block.bytes, stream);
    return {status, block.bytes};
  }
  kept_bytes_ += upstream_->allocation_size(block.bytes);
  live_.erase(it);
  return {status, block.bytes};
}

void graph_pool_policy::return_kept() noexcept {
  for (const auto& [bytes, k] : kept_) (void)upstream_->try_deallocate(k.ptr, bytes, k.stream);
  kept_.clear();
  kept_by_ptr_.clear();
  kept_bytes_ = 0;
  claimed_ = nullptr;
}

pool_state graph_pool_policy::do_state() const {
  pool_state s = upstream_->state();
  s.allocated -= std::min(s.allocated, kept_bytes_);
  s.cached_free += kept_bytes_;
  if (!kept_.empty()) {  // ordered by size: the last is the largest
    s.largest_free_block = std::max(s.largest_free_block, upstream_->allocation_size(kept_.rbegin()->first));
  }
  s.retries += retries_;
  return s;
}

memory_snapshot graph_pool_policy::do_memory_map() const {
  memory_snapshot map = upstream_->memory_map();
  if (kept_by_ptr_.empty()) return map;
  for (memory_segment& segment : map.segments) {
    for (memory_block& b : segment.blocks) {
      if (b.use != block_use::live) continue;
      if (!kept_by_ptr_.contains(reinterpret_cast<void*>(b.address))) continue;
      b.use = block_use::free;  // kept in the pool: free to its callers
      b.requested = 0;
    }
  }
  return map;
}

std::optional<free_result> graph_pool_policy::do_check_free(void* ptr, std::size_t bytes) const {
  const auto it = live_.find(ptr);
  if (it == live_.end()) return free_result{free_status::not_owned, 0};
  return free_result{bytes == it->second.bytes ? free_status::ok : free_status::size_mismatch, it->second.bytes};
}

std::optional<block_record> graph_pool_policy::do_block_info(void* ptr) const {
  const auto it = live_.find(ptr);
  if (it == live_.end()) return std::nullopt;
  return it->second;
}

}  // namespace fragctl
