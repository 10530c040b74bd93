// The `buckets` policy: size-class slabs over an upstream policy. The class
// table and the data structures are derived in buckets_policy.hpp.
#include "allocator_policies/buckets/buckets_policy.hpp"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/stream_clock.hpp"
#include "fmt/format.h"
#include "fragctl/error.hpp"
#include "fragctl/log.hpp"

namespace fragctl {
namespace {

device_allocator& checked(const std::unique_ptr<device_allocator>& upstream) {
  if (upstream == nullptr) throw invalid_argument("buckets: no upstream policy");
  return *upstream;
}

}  // namespace

/// Everything the policy holds; the algorithm is its member functions.
struct buckets_policy::impl {
  struct slab;
  struct stream_pool;
  struct slab_list {
    slab* head = nullptr;
    slab* tail = nullptr;
  };
  struct slab_cell {
    slab* low = nullptr;   ///< a slab that ends in the cell (or covers it whole)
    slab* high = nullptr;  ///< a slab that starts inside the cell
  };
  struct held_free {
    slab* owner;
    std::uint32_t slot;
  };
  /// Slots freed on one stream from other streams' slabs, reusable once
  /// `stamp` is complete.
  struct held_group {
    free_stamp stamp;
    std::vector<held_free> slots;
  };

  impl(const config& cfg, std::unique_ptr<device_allocator> upstream);
  ~impl();
  impl(const impl&) = delete;
  impl& operator=(const impl&) = delete;

  void* do_allocate(std::size_t bytes, stream_t stream);
  free_result do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept;
  std::size_t do_allocation_size(std::size_t bytes) const noexcept;
  pool_state do_state() const;
  void do_release_cached();
  [[nodiscard]] std::size_t empty_slabs() const noexcept;

  [[nodiscard]] stream_pool& pool_for(stream_t stream);
  [[nodiscard]] stream_pool& find_or_add_pool(stream_t stream);
  [[nodiscard]] slab* refill(stream_pool& pool, std::size_t cls);
  [[nodiscard]] slab* new_slab(stream_pool& pool, std::size_t cls);
  [[nodiscard]] void* upstream_allocate(std::size_t bytes, stream_t stream);
  [[nodiscard]] slab* find_slab(std::uintptr_t p) const noexcept;
  [[nodiscard]] static std::optional<std::uint32_t> live_slot(const slab* s, std::uintptr_t p) noexcept;
  [[nodiscard]] std::optional<free_result> check_free(void* ptr, std::size_t bytes) const;
  void push_free(slab* s, std::uint32_t slot) noexcept;
  void hold_free(slab* s, std::uint32_t slot, stream_t stream) noexcept;
  void became_empty(slab* s) noexcept;
  void release_slab(slab* s) noexcept;
  std::size_t release_empty_slabs() noexcept;
  void reclaim_held(bool wait);
  void forget_stream(stream_t stream) noexcept;
  void link_head(slab* s) noexcept;
  void link_tail(slab* s) noexcept;
  void unlink(slab* s) noexcept;

  std::unique_ptr<device_allocator> upstream_;
  std::string name_;
  std::size_t slab_size_;
  std::size_t slab_cost_;  ///< upstream's allocation_size(slab_size)
  unsigned slab_shift_;
  std::size_t reserve_;
  std::size_t classes_;
  std::size_t largest_class_;

  std::vector<std::unique_ptr<slab>> slabs_;
  absl::flat_hash_map<std::uintptr_t, slab_cell> cells_;
  std::vector<std::unique_ptr<stream_pool>> pools_;
  absl::flat_hash_map<stream_t, stream_pool*> pool_of_;  ///< pools_ by stream (a scan of 100,000 was quadratic)
  stream_t last_stream_ = nullptr;
  stream_pool* last_pool_ = nullptr;
  std::vector<std::size_t> empty_per_class_;

  stream_clock clock_;
  std::vector<held_group> unfenced_;  ///< by the freeing stream's clock index; no event covers them yet
  std::vector<held_group> fenced_;    ///< covered by an event, oldest first; not yet seen complete
  std::size_t held_slots_ = 0;

  std::size_t live_slot_bytes_ = 0;
  std::uint64_t retries_ = 0;
};

/// One slab: host-side metadata of slab_size bytes of upstream memory.
struct buckets_policy::impl::slab {
  std::uintptr_t base = 0;
  std::uint32_t slot_size = 0;
  std::uint32_t reciprocal = 0;  ///< ceil(2^32 / slot_size)
  std::uint32_t slot_count = 0;
  std::uint32_t carved = 0;    ///< slots [0, carved) were handed out at least once
  std::uint32_t free_top = 0;  ///< entries on free_stack
  std::uint32_t live = 0;      ///< slots handed out now
  std::uint32_t held = 0;      ///< slots freed on another stream, not yet reusable
  std::uint32_t cls = 0;
  bool listed = false;         ///< in its pool's list of slabs with a free slot
  bool counted_empty = false;  ///< counted in empty_per_class_
  std::size_t index = 0;       ///< position in slabs_
  stream_pool* pool = nullptr;
  slab* prev = nullptr;
  slab* next = nullptr;
  std::unique_ptr<std::uint32_t[]> free_stack;
  std::unique_ptr<std::uint64_t[]> live_bits;
  /// Each live slot's requested bytes: a free with another size is a
  /// SIZE_MISMATCH that gives back what was requested, even within a class.
  std::unique_ptr<std::uint32_t[]> requested;

  [[nodiscard]] bool has_free_slot() const noexcept { return free_top > 0 || carved < slot_count; }
  [[nodiscard]] bool empty() const noexcept { return live == 0 && held == 0; }
  [[nodiscard]] bool is_live(std::uint32_t i) const noexcept {
    return ((live_bits[i / 64] >> (i % 64)) & 1U) != 0;
  }
  void flip(std::uint32_t i) noexcept { live_bits[i / 64] ^= std::uint64_t{1} << (i % 64); }
};

/// The slabs of one stream: per class, the slabs that have a free slot.
/// Partly used slabs come first, empty ones last, so empty ones drain.
struct buckets_policy::impl::stream_pool {
  stream_t stream = nullptr;
  std::vector<slab_list> open;
};

buckets_policy::impl::impl(const config& cfg, std::unique_ptr<device_allocator> upstream)
    : upstream_(std::move(upstream)),
      slab_size_(cfg.slab_size),
      reserve_(cfg.slab_reserve),
      classes_(buckets::class_count(cfg.buckets_limit)),
      clock_(checked(upstream_).backend()) {
  name_ = fmt::format("buckets:{}", upstream_->name());
  if (!std::has_single_bit(slab_size_) || slab_size_ > GiB) {
    throw invalid_argument(fmt::format(
        "buckets: slab_size {} is not a power of two of at most 1GiB", slab_size_));
  }
  if (cfg.buckets_limit > slab_size_) {
    throw invalid_argument(fmt::format(
        "buckets: buckets_limit {} exceeds slab_size {}: a slab must hold a slot of every class",
        cfg.buckets_limit, slab_size_));
  }
  largest_class_ = classes_ == 0 ? 0 : buckets::class_size(classes_ - 1);
  slab_cost_ = upstream_->allocation_size(slab_size_);
  slab_shift_ = static_cast<unsigned>(std::countr_zero(slab_size_));
  empty_per_class_.assign(classes_, 0);
  (void)find_or_add_pool(nullptr);
}

buckets_policy::impl::~impl() {
  try {
    reclaim_held(/*wait=*/true);
  } catch (const std::exception& e) {
    logger().warn("{}: waiting for cross-stream frees failed: {}", name_, e.what());
  }
  std::size_t live = 0;
  for (const auto& s : slabs_) {
    live += s->live;
    (void)upstream_->try_deallocate(reinterpret_cast<void*>(s->base), slab_size_, s->pool->stream);
  }
  if (live > 0) logger().warn("{}: destroyed with {} slots still live", name_, live);
}

std::size_t buckets_policy::impl::empty_slabs() const noexcept {
  std::size_t n = 0;
  for (std::size_t c : empty_per_class_) n += c;
  return n;
}

// --- Streams ----------------------------------------------------------------

buckets_policy::impl::stream_pool& buckets_policy::impl::pool_for(stream_t stream) {
  if (stream == last_stream_ && last_pool_ != nullptr) return *last_pool_;
  return find_or_add_pool(stream);
}

buckets_policy::impl::stream_pool& buckets_policy::impl::find_or_add_pool(stream_t stream) {
  const auto at = pool_of_.find(stream);
  stream_pool* found = at == pool_of_.end() ? nullptr : at->second;
  if (found == nullptr) {
    auto pool = std::make_unique<stream_pool>();
    pool->stream = stream;
    pool->open.resize(classes_);
    found = pool.get();
    pool_of_.emplace(stream, found);
    try {
      pools_.push_back(std::move(pool));
    } catch (...) {  // out of host memory: neither table holds it
      pool_of_.erase(stream);
      throw;
    }
  }
  last_stream_ = stream;
  last_pool_ = found;
  return *found;
}

// --- Intrusive lists of slabs with a free slot ------------------------------

void buckets_policy::impl::link_head(slab* s) noexcept {
  slab_list& l = s->pool->open[s->cls];
  s->prev = nullptr;
  s->next = l.head;
  (l.head != nullptr ? l.head->prev : l.tail) = s;
  l.head = s;
  s->listed = true;
}

void buckets_policy::impl::link_tail(slab* s) noexcept {
  slab_list& l = s->pool->open[s->cls];
  s->next = nullptr;
  s->prev = l.tail;
  (l.tail != nullptr ? l.tail->next : l.head) = s;
  l.tail = s;
  s->listed = true;
}

void buckets_policy::impl::unlink(slab* s) noexcept {
  slab_list& l = s->pool->open[s->cls];
  (s->prev != nullptr ? s->prev->next : l.head) = s->next;
  (s->next != nullptr ? s->next->prev : l.tail) = s->prev;
  s->prev = s->next = nullptr;
  s->listed = false;
}

// --- Allocate -----------------------------------------------------------------

void* buckets_policy::impl::do_allocate(std::size_t bytes, stream_t stream) {
  if (bytes > largest_class_) return upstream_allocate(bytes, stream);
  const std::size_t cls = buckets::class_index(bytes);
  stream_pool& pool = pool_for(stream);
  slab* s = pool.open[cls].head;
  if (s == nullptr) s = refill(pool, cls);

  std::uint32_t slot = 0;
  if (s->free_top > 0) {
    slot = s->free_stack[--s->free_top];
  } else {
    slot = s->carved++;
  }
  if (s->counted_empty) {
    s->counted_empty = false;
    --empty_per_class_[cls];
  }
  ++s->live;
  s->flip(slot);
  s->requested[slot] = static_cast<std::uint32_t>(bytes);  // at most largest_class_
  if (!s->has_free_slot()) unlink(s);
  live_slot_bytes_ += s->slot_size;
  return reinterpret_cast<void*>(s->base + std::uintptr_t{slot} * s->slot_size);
}

buckets_policy::impl::slab* buckets_policy::impl::refill(stream_pool& pool, std::size_t cls) {
  if (held_slots_ > 0) {
    reclaim_held(/*wait=*/false);
    if (pool.open[cls].head != nullptr) return pool.open[cls].head;
  }
  return new_slab(pool, cls);
}

void* buckets_policy::impl::upstream_allocate(std::size_t bytes, stream_t stream) {
  try {
    return upstream_->allocate(bytes, stream);
  } catch (const out_of_memory&) {
    if (release_empty_slabs() == 0) throw;
  }
  ++retries_;
  return upstream_->allocate(bytes, stream);
}

buckets_policy::impl::slab* buckets_policy::impl::new_slab(stream_pool& pool, std::size_t cls) {
  const auto slot_size = static_cast<std::uint32_t>(buckets::class_size(cls));
  const auto slot_count = static_cast<std::uint32_t>(slab_size_ / slot_size);
  auto s = std::make_unique<slab>();
  s->slot_size = slot_size;
  s->reciprocal = static_cast<std::uint32_t>(((std::uint64_t{1} << 32) + slot_size - 1) / slot_size);
  s->slot_count = slot_count;
  s->cls = static_cast<std::uint32_t>(cls);
  s->pool = &pool;
  s->free_stack = std::make_unique<std::uint32_t[]>(slot_count);
  s->live_bits = std::make_unique<std::uint64_t[]>((slot_count + 63) / 64);
  s->requested = std::make_unique<std::uint32_t[]>(slot_count);
  // Host memory first: once the upstream gave the slab, nothing below throws.
  slabs_.reserve(slabs_.size() + 1);
  cells_.reserve(cells_.size() + 2);

  s->base = reinterpret_cast<std::uintptr_t>(upstream_allocate(slab_size_, pool.stream));
  const std::uintptr_t first = s->base >> slab_shift_;
  if ((s->base & (slab_size_ - 1)) == 0) {
    cells_[first].low = s.get();
  } else {
    cells_[first].high = s.get();
    cells_[first + 1].low = s.get();
  }
  s->index = slabs_.size();
  slab* raw = s.get();
  slabs_.push_back(std::move(s));
  link_head(raw);
  return raw;
}

// --- Free ---------------------------------------------------------------------

buckets_policy::impl::slab* buckets_policy::impl::find_slab(std::uintptr_t p) const noexcept {
  const auto it = cells_.find(p >> slab_shift_);
  if (it == cells_.end()) return nullptr;
  const slab_cell& c = it->second;
  slab* s = (c.high != nullptr && p >= c.high->base) ? c.high : c.low;
  if (s == nullptr || p < s->base || p - s->base >= slab_size_) return nullptr;
  return s;
}

// The live slot of slab `s` that starts at `p`, or none (an interior
// pointer, a slot never carved or free).
std::optional<std::uint32_t> buckets_policy::impl::live_slot(const slab* s, std::uintptr_t p) noexcept {
  const std::uint64_t offset = p - s->base;
  const auto slot = static_cast<std::uint32_t>((offset * s->reciprocal) >> 32);
  if (std::uint64_t{slot} * s->slot_size != offset || slot >= s->carved || !s->is_live(slot)) return std::nullopt;
  return slot;
}

std::optional<free_result> buckets_policy::impl::check_free(void* ptr, std::size_t bytes) const {
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  const slab* s = find_slab(p);
  if (s == nullptr) return upstream_->check_free(ptr, bytes);
  const std::optional<std::uint32_t> slot = live_slot(s, p);
  if (!slot) return free_result{free_status::not_owned, 0};
  const std::size_t requested = s->requested[*slot];
  return free_result{bytes == requested ? free_status::ok : free_status::size_mismatch, requested};
}

free_result buckets_policy::impl::do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept {
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  slab* s = find_slab(p);
  if (s == nullptr) return upstream_->try_deallocate(ptr, bytes, stream);

  const std::optional<std::uint32_t> live = live_slot(s, p);
  if (!live) return {free_status::not_owned, 0};
  const std::uint32_t slot = *live;
  s->flip(slot);
  --s->live;
  const std::size_t slot_size = s->slot_size;  // push_free may release the slab
  const std::size_t requested = s->requested[slot];
  live_slot_bytes_ -= slot_size;
  if (stream == s->pool->stream) {
    push_free(s, slot);
  } else {
    hold_free(s, slot, stream);
  }
  return {bytes == requested ? free_status::ok : free_status::size_mismatch, requested};
}

void buckets_policy::impl::push_free(slab* s, std::uint32_t slot) noexcept {
  s->free_stack[s->free_top++] = slot;
  if (s->empty()) {
    became_empty(s);
  } else if (!s->listed) {
    link_head(s);
  }
}

void buckets_policy::impl::became_empty(slab* s) noexcept {
  if (empty_per_class_[s->cls] >= reserve_) {
    release_slab(s);
    return;
  }
  ++empty_per_class_[s->cls];
  s->counted_empty = true;
  if (s->listed) unlink(s);
  link_tail(s);
}

void buckets_policy::impl::release_slab(slab* s) noexcept {
  if (s->listed) unlink(s);
  if (s->counted_empty) --empty_per_class_[s->cls];
  const std::uintptr_t first = s->base >> slab_shift_;
  const auto clear = [this](std::uintptr_t cell, slab* gone) {
    auto it = cells_.find(cell);
    if (it == cells_.end()) return;
    if (it->second.low == gone) it->second.low = nullptr;
    if (it->second.high == gone) it->second.high = nullptr;
    if (it->second.low == nullptr && it->second.high == nullptr) cells_.erase(it);
  };
  clear(first, s);
  if ((s->base & (slab_size_ - 1)) != 0) clear(first + 1, s);
  (void)upstream_->try_deallocate(reinterpret_cast<void*>(s->base), slab_size_, s->pool->stream);
  // Swap-remove from slabs_; `s` dies here.
  const std::size_t i = s->index;
  if (i + 1 != slabs_.size()) {
    slabs_[i] = std::move(slabs_.back());
    slabs_[i]->index = i;
  }
  slabs_.pop_back();
}

std::size_t buckets_policy::impl::release_empty_slabs() noexcept {
  std::vector<slab*> empty;
  for (const auto& s : slabs_) {
    if (s->empty()) empty.push_back(s.get());
  }
  for (slab* s : empty) release_slab(s);
  return empty.size();
}

// --- Cross-stream frees ---------------------------------------------------------

// Frees are stamped at once (no backend call); the event covering them is
// recorded when a refill looks for held slots, one per stream for all of its
// frees since the last (stream_clock::record_now).
void buckets_policy::impl::hold_free(slab* s, std::uint32_t slot, stream_t stream) noexcept {
  ++s->held;
  ++held_slots_;
  const std::uint32_t index = clock_.index_of(stream);
  if (index >= unfenced_.size()) unfenced_.resize(index + 1);
  held_group& g = unfenced_[index];
  g.stamp = clock_.on_free(index);
  g.slots.push_back({s, slot});
}

void buckets_policy::impl::reclaim_held(bool wait) {
  for (held_group& g : unfenced_) {
    if (g.slots.empty()) continue;
    fenced_.reserve(fenced_.size() + 1);  // the move below must not lose the slots
    clock_.record_now(g.stamp.stream);
    fenced_.push_back(held_group{g.stamp, std::move(g.slots)});
    g.slots.clear();
  }
  if (wait) {
    clock_.synchronize_all();
  } else {
    clock_.refresh_all();
  }
  std::size_t kept = 0;
  for (std::size_t i = 0; i < fenced_.size(); ++i) {
    held_group& f = fenced_[i];
    if (!clock_.complete(f.stamp)) {
      if (kept != i) fenced_[kept] = std::move(f);
      ++kept;
      continue;
    }
    for (const held_free& h : f.slots) {
      --h.owner->held;
      --held_slots_;
      push_free(h.owner, h.slot);
    }
  }
  fenced_.resize(kept);
}

// A stream's work is done and its owner destroys it: its pool's slabs join
// the default stream's pool, so that no slab goes back upstream naming the
// handle and allocations on the default stream reuse them, and slots freed
// on it are reusable. Nothing here can fail; the upstream forgot the stream
// already (do_stream_ending), so a slab given back below names the default
// stream.
void buckets_policy::impl::forget_stream(stream_t stream) noexcept {
  const auto ended = std::find_if(pools_.begin(), pools_.end(), [&](const auto& p) { return p->stream == stream; });
  if (ended != pools_.end()) {
    stream_pool* old = ended->get();
    stream_pool* to = last_pool_ = pools_.front().get();  // the default stream's, made first and never ended
    for (const auto& s : slabs_) {
      if (s->pool != old) continue;
      const bool listed = s->listed;
      if (listed) unlink(s.get());
      s->pool = to;
      if (!listed) continue;
      // Empty slabs go last, as became_empty files them.
      if (s->empty()) {
        link_tail(s.get());
      } else {
        link_head(s.get());
      }
    }
    pools_.erase(ended);
    pool_of_.erase(stream);
    last_stream_ = nullptr;
  }
  for (std::uint32_t i = 0; i < unfenced_.size(); ++i) {
    held_group& g = unfenced_[i];
    if (g.slots.empty() || clock_.stream_of(i) != stream) continue;
    for (const held_free& h : g.slots) {
      --h.owner->held;
      --held_slots_;
      push_free(h.owner, h.slot);
    }
    g.slots.clear();
  }
  clock_.end_stream(stream);  // the fenced groups' stamps on it are complete now
}

// --- State and release ------------------------------------------------------

std::size_t buckets_policy::impl::do_allocation_size(std::size_t bytes) const noexcept {
  if (bytes == 0 || bytes > largest_class_) return upstream_->allocation_size(bytes);
  return buckets::class_size(buckets::class_index(bytes));
}

pool_state buckets_policy::impl::do_state() const {
  pool_state up = upstream_->state();
  const std::size_t slab_bytes = slabs_.size() * slab_cost_;
  pool_state s = up;
  s.allocated = live_slot_bytes_ + (up.allocated >= slab_bytes ? up.allocated - slab_bytes : 0);
  s.cached_free = up.cached_free + slab_bytes - live_slot_bytes_;
  std::size_t largest_slot = 0;
  for (const auto& pool : pools_) {
    for (std::size_t c = classes_; c-- > 0;) {
      if (pool->open[c].head != nullptr) {
        largest_slot = std::max(largest_slot, buckets::class_size(c));
        break;
      }
    }
  }
  s.largest_free_block = std::max(up.largest_free_block, largest_slot);
  s.retries = up.retries + retries_;
  return s;
}

void buckets_policy::impl::do_release_cached() {
  reclaim_held(/*wait=*/true);
  (void)release_empty_slabs();
  upstream_->release_cached();
}

// --- The policy: the device_allocator face of its impl ------------------------

buckets_policy::buckets_policy(const config& cfg, std::unique_ptr<device_allocator> upstream)
    : impl_(std::make_unique<impl>(cfg, std::move(upstream))) {}
buckets_policy::~buckets_policy() = default;

device_allocator& buckets_policy::upstream() const noexcept { return *impl_->upstream_; }
std::size_t buckets_policy::largest_class() const noexcept { return impl_->largest_class_; }
std::size_t buckets_policy::class_count() const noexcept { return impl_->classes_; }
std::size_t buckets_policy::slabs() const noexcept { return impl_->slabs_.size(); }
std::size_t buckets_policy::empty_slabs() const noexcept { return impl_->empty_slabs(); }

void* buckets_policy::do_allocate(std::size_t bytes, stream_t stream) { return impl_->do_allocate(bytes, stream); }
free_result buckets_policy::do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept {
  return impl_->do_deallocate(ptr, bytes, stream);
}
std::optional<free_result> buckets_policy::do_check_free(void* ptr, std::size_t bytes) const {
  return impl_->check_free(ptr, bytes);
}
std::size_t buckets_policy::do_allocation_size(std::size_t bytes) const noexcept {
  return impl_->do_allocation_size(bytes);
}
pool_state buckets_policy::do_state() const { return impl_->do_state(); }
void buckets_policy::do_release_cached() { impl_->do_release_cached(); }
void buckets_policy::do_stream_ending(stream_t stream) {
  forget_stream(*impl_->upstream_, stream);  // first: it is the part that may fail
  impl_->forget_stream(stream);
}
void buckets_policy::do_enable_peer_access(int peer) { impl_->upstream_->enable_peer_access(peer); }
shared_memory buckets_policy::do_share(void* ptr, std::size_t bytes) const {
  // Every slot the range meets, in any slab, must be live: a free slot is
  // the next allocation's while another process would use it (a slab is one
  // live block to the policy below, which checks the rest).
  const auto lo = reinterpret_cast<std::uintptr_t>(ptr);
  const std::uintptr_t hi = lo + std::max<std::size_t>(bytes, 1);  // past the range
  for (const std::unique_ptr<impl::slab>& s : impl_->slabs_) {
    const std::uintptr_t slab_end = s->base + impl_->slab_size_;
    if (hi <= s->base || lo >= slab_end) continue;
    // The slots under the range's part in this slab; one past the last slot
    // (the slab's tail) is never carved.
    const std::uint64_t first = (std::max(lo, s->base) - s->base) / s->slot_size;
    const std::uint64_t last = (std::min(hi, slab_end) - 1 - s->base) / s->slot_size;
    bool live = true;
    for (std::uint64_t slot = first; live && slot <= last; ++slot) {
      live = slot < s->carved && s->is_live(static_cast<std::uint32_t>(slot));
    }
    if (!live) {
      throw invalid_argument(fmt::format("{}: share({}, {}): not live memory of this allocator (a free slot)",
                                         impl_->name_, ptr, bytes));
    }
  }
  return impl_->upstream_->share(ptr, bytes);
}
device_backend& buckets_policy::do_backend() const noexcept { return impl_->upstream_->backend(); }
std::string_view buckets_policy::do_name() const noexcept { return impl_->name_; }
memory_snapshot buckets_policy::do_memory_map() const { return impl_->upstream_->memory_map(); }

}  // namespace fragctl
