// The caching policy's algorithm; the theory is in caching_policy.hpp.
#include "allocator_policies/caching/caching_policy.hpp"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "core/stream_clock.hpp"
#include "fmt/format.h"
#include "fragctl/error.hpp"
#include "fragctl/log.hpp"
#include "util/intervals.hpp"

namespace fragctl {
namespace {

constexpr std::size_t nodes_per_chunk = 512;

// Every request is rounded up to a multiple of min_alignment, at least one.
constexpr std::size_t round_request(std::size_t bytes) noexcept {
  return bytes < min_alignment ? min_alignment : round_up(bytes, min_alignment);
}

// How a free of `given` bytes of a block of `requested` is judged (the
// free and check_free): the request or its rounded size is right.
constexpr free_result judged_free(std::size_t given, std::size_t requested) noexcept {
  const bool right = given == requested || given == round_request(requested);
  return {right ? free_status::ok : free_status::size_mismatch, requested};
}

constexpr std::size_t round_to_multiple(std::size_t n, std::size_t to) noexcept {
  return (n + to - 1) / to * to;
}

void require(bool ok, std::string_view what) {
  if (!ok) throw invalid_argument(fmt::format("caching policy: {}", what));
}

}  // namespace

// Everything the policy holds; the algorithm is its member functions.
struct caching_policy::impl {
  enum class block_state : std::uint8_t { free, allocated, pending };

  struct block {
    char* ptr = nullptr;
    std::size_t size = 0;
    std::size_t requested = 0;  ///< caller's request while allocated
    stream_t stream = nullptr;  ///< stream of the segment
    block* prev = nullptr;      ///< neighbours inside the segment
    block* next = nullptr;
    block_state state = block_state::free;
    bool small = false;  ///< in the small pool
  };

  // Entry of a free set: the key by value (no pointer chase while searching)
  // plus the block it stands for.
  struct free_entry {
    std::uintptr_t stream;
    std::size_t size;
    std::uintptr_t addr;
    block* node;
  };
  struct free_order {
    bool operator()(const free_entry& a, const free_entry& b) const noexcept {
      if (a.stream != b.stream) return a.stream < b.stream;
      if (a.size != b.size) return a.size < b.size;
      return a.addr < b.addr;
    }
  };
  using free_set = absl::btree_set<free_entry, free_order>;

  struct segment_info {
    std::size_t size;
    stream_t stream;
  };

  /// A block freed on another stream than its segment's, until `stamp`
  /// (recorded at the free) is complete.
  struct pending_free {
    block* node;
    free_stamp stamp;
  };

  impl(const config& cfg, device_backend& backend);
  ~impl();
  impl(const impl&) = delete;
  impl& operator=(const impl&) = delete;

  void* do_allocate(std::size_t bytes, stream_t stream);
  free_result do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept;
  std::size_t do_allocation_size(std::size_t bytes) const noexcept;
  pool_state do_state() const;
  void do_release_cached();
  memory_snapshot do_memory_map() const;

  [[nodiscard]] std::size_t segment_size_for(std::size_t rounded) const noexcept;
  [[nodiscard]] bool should_split(const block& b, std::size_t rounded) const noexcept;
  [[nodiscard]] block* take_free_block(free_set& pool, stream_t stream, std::size_t rounded);
  [[nodiscard]] block* new_segment(std::size_t bytes, stream_t stream, bool small);
  void* hand_out(block* b, std::size_t rounded, std::size_t requested);
  void free_block(block* b);
  void defer_free(block* b, stream_t stream) noexcept;
  void process_pending(bool wait);
  void forget_stream(stream_t stream);
  bool release_oversize_blocks(free_set& pool, stream_t stream, std::size_t rounded);
  void release_segments(const std::vector<block*>& heads);
  void release_all_free_segments();
  [[nodiscard]] std::size_t largest_free() const noexcept;
  [[noreturn]] void throw_oom(std::size_t requested);

  static free_entry entry_of(const block* b) noexcept {
    return {reinterpret_cast<std::uintptr_t>(b->stream), b->size,
            reinterpret_cast<std::uintptr_t>(b->ptr), const_cast<block*>(b)};
  }
  free_set& pool_of(const block* b) noexcept { return b->small ? small_free_ : large_free_; }

  void grow_nodes();
  block* new_node() noexcept;  // precondition: a spare node exists
  void recycle(block* b) noexcept;

  device_backend& backend_;
  std::size_t small_size_;
  std::size_t small_segment_;
  std::size_t large_segment_;
  std::size_t large_segment_limit_;
  std::size_t segment_round_;
  std::size_t max_split_size_;
  bool release_on_oom_;

  free_set small_free_;
  free_set large_free_;
  absl::flat_hash_map<void*, block*> live_;
  absl::flat_hash_map<void*, segment_info> segments_;
  stream_clock clock_;
  std::vector<pending_free> pending_;

  std::vector<std::unique_ptr<block[]>> node_chunks_;
  block* spare_nodes_ = nullptr;  // linked through `next`

  std::size_t reserved_ = 0;
  std::size_t allocated_ = 0;
  std::uint64_t retries_ = 0;
};

caching_policy::impl::impl(const config& cfg, device_backend& backend)
    : backend_(backend),
      small_size_(cfg.small_size),
      small_segment_(cfg.small_segment),
      large_segment_(cfg.large_segment),
      large_segment_limit_(cfg.large_segment_limit),
      segment_round_(cfg.segment_round),
      max_split_size_(cfg.max_split_size),
      release_on_oom_(cfg.release_on_oom),
      clock_(backend) {
  require(small_size_ > 0, "small_size must be positive");
  require(small_segment_ > 0, "small_segment must be positive");
  require(large_segment_ > 0, "large_segment must be positive");
  require(segment_round_ > 0, "segment_round must be positive");
}

caching_policy::impl::~impl() {
  try {
    process_pending(/*wait=*/true);
  } catch (const std::exception& e) {
    logger().error("caching: waiting for pending frees at destruction failed: {}", e.what());
  }
  if (!live_.empty()) {
    logger().warn("caching: destroyed with {} live blocks ({} bytes); their memory is freed",
                  live_.size(), allocated_);
  }
  std::vector<stream_t> streams;
  for (const auto& [ptr, seg] : segments_) {
    if (std::find(streams.begin(), streams.end(), seg.stream) == streams.end()) {
      streams.push_back(seg.stream);
    }
  }
  for (stream_t s : streams) {
    try {
      backend_.synchronize_stream(s);
    } catch (const std::exception& e) {
      logger().error("caching: synchronizing a stream at destruction failed: {}", e.what());
    }
  }
  for (const auto& [ptr, seg] : segments_) {
    try {
      backend_.free(ptr, seg.size);
    } catch (const std::exception& e) {
      logger().error("caching: returning a {} byte segment at destruction failed: {}", seg.size,
                     e.what());
    }
  }
}

// --- Sizes -------------------------------------------------------------------

std::size_t caching_policy::impl::do_allocation_size(std::size_t bytes) const noexcept {
  return round_request(bytes);
}

std::size_t caching_policy::impl::segment_size_for(std::size_t rounded) const noexcept {
  if (rounded <= small_size_) return std::max(small_segment_, rounded);
  if (rounded < large_segment_limit_) return std::max(large_segment_, rounded);
  return round_to_multiple(rounded, segment_round_);
}

bool caching_policy::impl::should_split(const block& b, std::size_t rounded) const noexcept {
  const std::size_t remaining = b.size - rounded;
  if (b.small) return remaining >= min_alignment;
  return rounded < max_split_size_ && remaining > small_size_;
}

// --- Allocation ----------------------------------------------------------------

void* caching_policy::impl::do_allocate(std::size_t bytes, stream_t stream) {
  const std::size_t rounded = round_request(bytes);
  const bool small = rounded <= small_size_;
  free_set& pool = small ? small_free_ : large_free_;

  // A new segment and a split remainder need at most two nodes; taking them
  // now keeps every later step free of host allocation failures.
  if (spare_nodes_ == nullptr || spare_nodes_->next == nullptr) {
    grow_nodes();
  }
  if (!pending_.empty()) process_pending(/*wait=*/false);

  block* b = take_free_block(pool, stream, rounded);
  if (b == nullptr) {
    const std::size_t segment = segment_size_for(rounded);
    b = new_segment(segment, stream, small);
    if (b == nullptr && release_on_oom_) {
      if (max_split_size_ != std::numeric_limits<std::size_t>::max() &&
          release_oversize_blocks(pool, stream, rounded)) {
        b = new_segment(segment, stream, small);
      }
      if (b == nullptr) {
        process_pending(/*wait=*/true);
        release_all_free_segments();
        b = new_segment(segment, stream, small);
      }
      if (b != nullptr) ++retries_;
    }
    if (b == nullptr) throw_oom(bytes);
  }
  return hand_out(b, rounded, bytes);
}

caching_policy::impl::block* caching_policy::impl::take_free_block(free_set& pool, stream_t stream,
                                                       std::size_t rounded) {
  const auto key = reinterpret_cast<std::uintptr_t>(stream);
  auto it = pool.lower_bound(free_entry{key, rounded, 0, nullptr});
  if (it == pool.end() || it->stream != key) return nullptr;
  // An oversize block serves no ordinary request, and an oversize request
  // only from a block less than large_segment bigger than it.
  if (rounded < max_split_size_ && it->size >= max_split_size_) return nullptr;
  if (rounded >= max_split_size_ && it->size - rounded >= large_segment_) return nullptr;
  block* b = it->node;
  pool.erase(it);
  return b;
}

caching_policy::impl::block* caching_policy::impl::new_segment(std::size_t bytes, stream_t stream, bool small) {
  void* p = backend_.allocate(bytes);
  if (p == nullptr) return nullptr;
  try {
    segments_.emplace(p, segment_info{bytes, stream});
  } catch (...) {
    backend_.free(p, bytes);
    throw;
  }
  reserved_ += bytes;
  block* b = new_node();
  b->ptr = static_cast<char*>(p);
  b->size = bytes;
  b->requested = 0;
  b->stream = stream;
  b->prev = nullptr;
  b->next = nullptr;
  b->state = block_state::free;
  b->small = small;
  return b;
}

void* caching_policy::impl::hand_out(block* b, std::size_t rounded, std::size_t requested) {
  if (should_split(*b, rounded)) {
    block* rest = new_node();
    rest->ptr = b->ptr + rounded;
    rest->size = b->size - rounded;
    rest->requested = 0;
    rest->stream = b->stream;
    rest->prev = b;
    rest->next = b->next;
    rest->state = block_state::free;
    rest->small = b->small;
    if (b->next != nullptr) b->next->prev = rest;
    b->next = rest;
    b->size = rounded;
    pool_of(rest).insert(entry_of(rest));
  }
  b->state = block_state::allocated;
  b->requested = requested;
  allocated_ += rounded;
  live_.emplace(b->ptr, b);
  return b->ptr;
}

// --- Deallocation --------------------------------------------------------------

free_result caching_policy::impl::do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept {
  const auto it = live_.find(ptr);
  if (it == live_.end()) return {free_status::not_owned, 0};
  block* b = it->second;
  live_.erase(it);
  const free_result result = judged_free(bytes, b->requested);
  allocated_ -= round_request(b->requested);
  if (stream == b->stream) {
    free_block(b);
  } else {
    defer_free(b, stream);
  }
  return result;
}

void caching_policy::impl::free_block(block* b) {
  free_set& pool = pool_of(b);
  b->state = block_state::free;
  b->requested = 0;
  if (block* prev = b->prev; prev != nullptr && prev->state == block_state::free) {
    pool.erase(entry_of(prev));
    b->ptr = prev->ptr;
    b->size += prev->size;
    b->prev = prev->prev;
    if (b->prev != nullptr) b->prev->next = b;
    recycle(prev);
  }
  if (block* next = b->next; next != nullptr && next->state == block_state::free) {
    pool.erase(entry_of(next));
    b->size += next->size;
    b->next = next->next;
    if (b->next != nullptr) b->next->prev = b;
    recycle(next);
  }
  pool.insert(entry_of(b));
}

// The event is recorded at the free (stream_clock::record_now), not when a
// later allocation asks: the block comes back as soon as the work queued
// before its free is done, whatever is queued after.
void caching_policy::impl::defer_free(block* b, stream_t stream) noexcept {
  b->state = block_state::pending;
  try {
    pending_.reserve(pending_.size() + 1);
    const std::uint32_t index = clock_.index_of(stream);
    const free_stamp stamp = clock_.on_free(index);
    clock_.record_now(index);
    pending_.push_back(pending_free{b, stamp});
  } catch (const std::exception& e) {
    // The block stays pending for good: never reused, its segment never
    // released before destruction. Safe, and only on a failing runtime.
    logger().error("caching: cannot order the free of {} on another stream ({}); block withheld",
                   static_cast<void*>(b->ptr), e.what());
  }
}

void caching_policy::impl::process_pending(bool wait) {
  if (wait) {
    clock_.synchronize_all();
  } else {
    clock_.refresh_all();
  }
  std::size_t kept = 0;
  for (const pending_free& p : pending_) {
    if (clock_.complete(p.stamp)) {
      free_block(p.node);
    } else {
      pending_[kept++] = p;
    }
  }
  pending_.resize(kept);
}

// A stream's work is done and its owner destroys it: its frees are complete,
// and its segments become the default stream's, so that no later free,
// release or destruction names the handle. Their free blocks move to the
// default stream's run of the pools, where allocations on it find them: the
// one step that needs memory (the pools' new entries) comes first, all or
// nothing, so that a failure leaves the policy as it was.
void caching_policy::impl::forget_stream(stream_t stream) {
  const auto key = reinterpret_cast<std::uintptr_t>(stream);
  std::vector<std::pair<free_set*, block*>> moved;
  for (free_set* pool : {&small_free_, &large_free_}) {
    for (auto it = pool->lower_bound(free_entry{key, 0, 0, nullptr}); it != pool->end() && it->stream == key; ++it) {
      moved.emplace_back(pool, it->node);
    }
  }
  const auto refiled = [](const block* b) {
    return free_entry{0, b->size, reinterpret_cast<std::uintptr_t>(b->ptr), const_cast<block*>(b)};
  };
  std::size_t inserted = 0;
  try {
    for (const auto& [pool, b] : moved) {
      pool->insert(refiled(b));
      ++inserted;
    }
  } catch (...) {
    for (std::size_t i = 0; i < inserted; ++i) moved[i].first->erase(refiled(moved[i].second));
    throw;
  }
  for (const auto& [pool, b] : moved) {
    pool->erase(entry_of(b));
    b->stream = nullptr;
  }
  clock_.end_stream(stream);
  for (auto& [ptr, b] : live_) {
    if (b->stream == stream) b->stream = nullptr;
  }
  for (const pending_free& p : pending_) {
    if (p.node->stream == stream) p.node->stream = nullptr;
  }
  for (auto& [ptr, segment] : segments_) {
    if (segment.stream == stream) segment.stream = nullptr;
  }
}

// --- Returning memory ----------------------------------------------------------

void caching_policy::impl::do_release_cached() {
  process_pending(/*wait=*/true);
  release_all_free_segments();
}

void caching_policy::impl::release_all_free_segments() {
  std::vector<block*> heads;
  for (const free_set* pool : {&small_free_, &large_free_}) {
    for (const free_entry& e : *pool) {
      if (e.node->prev == nullptr && e.node->next == nullptr) heads.push_back(e.node);
    }
  }
  release_segments(heads);
}

bool caching_policy::impl::release_oversize_blocks(free_set& pool, stream_t stream, std::size_t rounded) {
  const auto key = reinterpret_cast<std::uintptr_t>(stream);
  const std::size_t target = std::max(rounded, max_split_size_);
  auto whole = [](const free_entry& e) { return e.node->prev == nullptr && e.node->next == nullptr; };

  // The smallest whole oversize segment that alone is enough ...
  for (auto it = pool.lower_bound(free_entry{key, target, 0, nullptr});
       it != pool.end() && it->stream == key; ++it) {
    if (whole(*it)) {
      release_segments({it->node});
      return true;
    }
  }
  // ... else whole oversize segments from the largest down until enough.
  std::vector<block*> victims;
  std::size_t total = 0;
  auto it = pool.lower_bound(free_entry{key, target, 0, nullptr});
  while (it != pool.begin() && total < target) {
    --it;
    if (it->stream != key || it->size < max_split_size_) break;
    if (whole(*it)) {
      victims.push_back(it->node);
      total += it->size;
    }
  }
  release_segments(victims);
  return total >= target;
}

void caching_policy::impl::release_segments(const std::vector<block*>& heads) {
  if (heads.empty()) return;
  // No queued work may use memory returned to the backend.
  std::vector<stream_t> streams;
  for (const block* b : heads) {
    if (std::find(streams.begin(), streams.end(), b->stream) == streams.end()) {
      streams.push_back(b->stream);
    }
  }
  for (stream_t s : streams) backend_.synchronize_stream(s);
  for (block* b : heads) {
    pool_of(b).erase(entry_of(b));
    segments_.erase(b->ptr);
    reserved_ -= b->size;
    backend_.free(b->ptr, b->size);
    recycle(b);
  }
}

// --- State and errors ----------------------------------------------------------

std::size_t caching_policy::impl::largest_free() const noexcept {
  std::size_t largest = 0;
  for (const free_set* pool : {&small_free_, &large_free_}) {
    // The last entry of each stream's run is that stream's largest block.
    auto it = pool->begin();
    while (it != pool->end()) {
      const auto next_stream =
          pool->upper_bound(free_entry{it->stream, std::numeric_limits<std::size_t>::max(),
                                       std::numeric_limits<std::uintptr_t>::max(), nullptr});
      largest = std::max(largest, std::prev(next_stream)->size);
      it = next_stream;
    }
  }
  return largest;
}

pool_state caching_policy::impl::do_state() const {
  pool_state s;
  s.reserved = reserved_;
  s.allocated = allocated_;
  s.cached_free = reserved_ - allocated_;
  s.largest_free_block = largest_free();
  s.segments = segments_.size();
  s.retries = retries_;
  return s;
}

// Every segment from its head block, found by walking back from any block
// the policy indexes (live, free or pending); a block withheld after a
// failed event record is reached through its neighbours.
memory_snapshot caching_policy::impl::do_memory_map() const {
  std::vector<const block*> known;
  known.reserve(live_.size() + small_free_.size() + large_free_.size() + pending_.size());
  for (const auto& [ptr, b] : live_) known.push_back(b);
  for (const free_set* pool : {&small_free_, &large_free_})
    for (const free_entry& e : *pool) known.push_back(e.node);
  for (const pending_free& p : pending_) known.push_back(p.node);

  absl::flat_hash_map<const char*, const block*> heads;
  for (const block* b : known) {
    while (b->prev != nullptr) b = b->prev;
    heads.emplace(b->ptr, b);
  }
  memory_snapshot m;
  m.available = true;
  m.allocator = std::string(policy_name);
  for (const auto& [ptr, seg] : segments_) {
    memory_segment s;
    s.address = reinterpret_cast<std::uintptr_t>(ptr);
    s.size = seg.size;
    s.stream = seg.stream;
    const auto head = heads.find(static_cast<const char*>(ptr));
    if (head != heads.end()) {
      s.pool = head->second->small ? "small" : "large";
      for (const block* b = head->second; b != nullptr; b = b->next) {
        const block_use use = b->state == block_state::allocated ? block_use::live
                              : b->state == block_state::pending ? block_use::pending
                                                                 : block_use::free;
        s.blocks.push_back({reinterpret_cast<std::uintptr_t>(b->ptr), b->size, b->requested, use, b->stream});
      }
    }
    m.segments.push_back(std::move(s));
  }
  std::sort(m.segments.begin(), m.segments.end(),
            [](const memory_segment& a, const memory_segment& b) { return a.address < b.address; });
  return m;
}

void caching_policy::impl::throw_oom(std::size_t requested) {
  oom_details d;
  d.requested = requested;
  d.reserved = reserved_;
  d.cached_free = reserved_ - allocated_;
  d.largest_free_block = largest_free();
  const memory_info info = backend_.get_memory_info();
  d.device_free = info.free;
  d.device_total = info.total;
  throw out_of_memory(d, "caching");
}

// --- Block nodes -----------------------------------------------------------------

void caching_policy::impl::grow_nodes() {
  node_chunks_.push_back(std::make_unique<block[]>(nodes_per_chunk));
  block* chunk = node_chunks_.back().get();
  for (std::size_t i = 0; i < nodes_per_chunk; ++i) {
    chunk[i].next = spare_nodes_;
    spare_nodes_ = &chunk[i];
  }
}

caching_policy::impl::block* caching_policy::impl::new_node() noexcept {
  block* b = spare_nodes_;
  spare_nodes_ = b->next;
  return b;
}

void caching_policy::impl::recycle(block* b) noexcept {
  b->next = spare_nodes_;
  spare_nodes_ = b;
}

// --- The policy: the device_allocator face of its impl --------------------------

caching_policy::caching_policy(const config& cfg, device_backend& backend)
    : impl_(std::make_unique<impl>(cfg, backend)) {}
caching_policy::~caching_policy() = default;

std::size_t caching_policy::live_blocks() const noexcept { return impl_->live_.size(); }

void* caching_policy::do_allocate(std::size_t bytes, stream_t stream) { return impl_->do_allocate(bytes, stream); }
free_result caching_policy::do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept {
  return impl_->do_deallocate(ptr, bytes, stream);
}
std::optional<free_result> caching_policy::do_check_free(void* ptr, std::size_t bytes) const {
  const auto it = impl_->live_.find(ptr);
  if (it == impl_->live_.end()) return free_result{free_status::not_owned, 0};
  return judged_free(bytes, it->second->requested);
}
std::size_t caching_policy::do_allocation_size(std::size_t bytes) const noexcept {
  return impl_->do_allocation_size(bytes);
}
void caching_policy::do_stream_ending(stream_t stream) { impl_->forget_stream(stream); }
pool_state caching_policy::do_state() const { return impl_->do_state(); }
void caching_policy::do_release_cached() { impl_->do_release_cached(); }
void caching_policy::do_enable_peer_access(int peer) {
  if (peer < 0 || peer == backend().device()) {
    throw invalid_argument(fmt::format("caching: enable_peer_access({}): a peer is another device's ordinal", peer));
  }
  // Segments are plain device allocations (the runtime's peer access covers
  // them), but a peer that does not exist or cannot reach this device is
  // refused as the arena refuses it.
  backend().check_access_peer(peer);
}
shared_memory caching_policy::do_share(void* ptr, std::size_t bytes) const {
  const auto a = reinterpret_cast<std::uintptr_t>(ptr);
  bytes = std::max<std::size_t>(bytes, 1);
  for (const auto& [base, segment] : impl_->segments_) {
    const auto b = reinterpret_cast<std::uintptr_t>(base);
    if (a >= b && a - b < segment.size && bytes <= segment.size - (a - b)) {
      // Free or cached memory would go to the next allocation while another
      // process used it.
      std::vector<std::pair<std::uintptr_t, std::uintptr_t>> parts;
      for (const auto& [live_ptr, node] : impl_->live_) {
        const auto p = reinterpret_cast<std::uintptr_t>(live_ptr);
        if (p < a + bytes && p + node->size > a) parts.emplace_back(p, p + node->size);
      }
      if (!util::covers(parts, a, a + bytes)) {
        throw invalid_argument(fmt::format(
            "caching: share({}, {}): not live memory of this allocator (a free or cached range)", ptr, bytes));
      }
      shared_memory out;
      out.base = base;
      out.bytes = segment.size;
      out.offset = a - b;
      return out;
    }
  }
  throw invalid_argument(fmt::format("caching: share({}, {}): not memory of this allocator's segments", ptr, bytes));
}
device_backend& caching_policy::do_backend() const noexcept { return impl_->backend_; }
memory_snapshot caching_policy::do_memory_map() const { return impl_->do_memory_map(); }

}  // namespace fragctl
