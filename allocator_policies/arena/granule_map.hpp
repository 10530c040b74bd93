// Physical pages behind the arena's address range (page stitching).
//
// The reserved range is cut into granules (the backend's granularity, 2 MiB
// on H100/H200). Physical memory comes in *spans*: one handle mapped over a
// run of consecutive granules, at most `max_span` bytes long. For each granule
// the map keeps the span mapped there, if any, and how many live blocks have
// it as their first or last granule; for each span, how many of its granules
// live blocks touch (on_allocate counts a block's granules between its first
// and last in their spans directly), the stamp of the frees that touched it
// (stream_clock) and when it was last wholly free.
//
// Why spans. A driver call costs about the same whatever the size of the
// handle (on an H200: create 9 us, map 1 us, set_access 25 us, unmap 16 us
// per handle from 2 to 64 MiB; benchmarks/vmm, docs/benchmarks.md), so one
// handle per 2 MiB granule made a growing arena pay about 35 us per 2 MiB.
// Spans cut that by up to max_span/granularity. What they cost: a span is
// unmapped whole, so the untouched granules of a span some live block still
// touches cannot go elsewhere (at most max_span - granularity per such span).
// With max_span equal to the granularity every span is one granule and any page
// can be stitched in anywhere.
//
// States of a span:
//   live     mapped, at least one granule touched by a live block
//   cached   mapped, no granule touched; in an LRU list, oldest first
// and handles mapped nowhere wait in the *pool*.
//
// Where a block lands on unmapped granules (gaps), map_range() fills each gap
// with handles from the pool, then with cached spans it *steals* (unmaps; only
// whole spans that fit the gap, and only once their frees are complete; one
// unmap for each run of adjacent ones, which cuts calls, not the driver's
// work: that follows the handles), and
// creates new memory only for what is still missing: one span per max_span of
// each run of missing granules (cut at multiples of max_span). Before
// creating, it releases pooled handles and complete cached spans that did not
// fit, as many bytes as it is about to create, so that physical memory held
// grows only when every held page is in a span touched by live memory (or by
// frees still in flight on a GPU). A span never reaches past the block that
// caused it: mapping ahead of growth would save more calls, but held memory
// would no longer follow the live bytes (docs/policies/arena.md has the
// measurements). trim() unmaps cached spans beyond a byte budget into the
// pool.
//
// Waiting before growing. On a GPU the host runs ahead, so the frees that
// left spans cached are mostly still in flight when the next block needs
// memory; those spans can be neither stolen nor released, and creating in
// their place makes the memory held grow with the GPU's lag instead of with
// the live bytes (docs/replay.md "GPU lag"). With `wait_before_growing`,
// before creating, map_range waits for the frees of cached spans outside the
// block, oldest span first, each on its own stream and only up to the event
// that covers it, until as many granules as are missing are free to steal,
// then plans again. The cost is a host wait on the GPU where a new peak
// would otherwise have been made, never a driver call more. Only there:
// where the handles held (created_, pooled ones included) plus what is
// missing stay within the high-water mark (the most created_ has held),
// creating raises no peak, and a wait would drain the GPU's queue just
// before the steal's unmaps and maps, so the GPU idles while the host makes
// them. If the device then cannot create, the caller's attempt with `wait`
// re-stitches instead (arena_policy::impl::map_or_throw).
//
// Failures midway. map_range is a transaction over the granules of its
// range: it maps all of them, with access granted, or leaves them unmapped.
// Each step is undone in its own way: handles taken from the pool go back to
// it; cached spans stolen for the range stay unmapped, their handles pooled
// (a state trim() reaches too, so nothing is remapped); handles created are
// released, or pooled when the mapping failed after them (the caller's next
// attempt takes them, and its last gives them back); spans mapped are
// unmapped, each by exactly the range it was mapped at, never a range some of
// which was not mapped (pytorch#188008's unusable process began that way).
// The counts (mapped_, pooled_, created_, the LRU) change with each call that
// succeeded and never before it, so a call that fails or throws leaves them
// exact. The undoing itself calls unmap, which can throw: a span whose
// access was granted then stays a cached span (trim or a steal unmaps it
// later); one without access is *stranded*: its granules read unmapped, so no
// block is ever served there, but it still counts as mapped, as the device
// sees it, until the next map_range or release_unused unmaps it first.
// trim(), release_unused() and the destructor unmap and release span by span:
// a failing call leaves that span and the ones not reached as they were (the
// destructor goes on past it).
//
// Pause and resume (the RL-colocation case: a trainer hands the GPU to an
// inference engine between steps and takes it back). pause() first gives
// back everything no live block touches (release_unused), then unmaps and
// releases every live span, keeping its slot, its granules' live counts and
// therefore every block's address: a paused span is one whose handle is 0
// (never a live handle). With `keep_contents` each span is first copied to a
// pinned host buffer, all of them before the first unmap, so running out of
// host memory changes nothing. resume() creates, maps and grants access to a
// fresh handle at each paused span that a live block still touches (a span
// whose blocks were all freed while paused is dropped), then copies the
// contents back. Both are transactions over the spans: a pause that fails
// midway maps fresh memory back at the spans it had released, with their
// contents, when it kept them (without, they stay paused: their contents
// are gone, and the caller resumes as after a pause), and a resume that fails midway
// unmaps and releases what it mapped, so every span is either mapped or
// paused, the counts are exact, and the call can be made again. While
// paused nothing may be allocated (arena_policy refuses); frees are
// counted as always, and a paused span that loses its last live block never
// enters the cache.
//
// Exported spans (another process imported their handle; device_allocator::
// share). A pause releases their handles like any other, which closes their
// exports (the descriptor, the serial): a consumer keeps mapping the old
// memory until it closes its import, while the producer resumes on fresh
// handles, which a later share exports anew. pause() counts such handles
// (detached_exports) and logs one warning line for them.
//
// Not thread-safe. The hot calls (covered, on_allocate, on_free) make no
// backend call and no heap allocation.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "allocator_policies/arena/block_index.hpp"
#include "core/stream_clock.hpp"
#include "fragctl/backend.hpp"

namespace fragctl::arena_detail {

class granule_map {
 public:
  /// Covers [base, base + bytes) (granule-aligned) with granules of
  /// `granularity`; holds at most `physical_limit` bytes of handles, each at
  /// most `max_span` bytes (rounded down to the granularity, at least one
  /// granule); `wait_before_growing` as in the theory above.
  granule_map(device_backend& backend, stream_clock& clock, std::uintptr_t base, std::size_t bytes,
              std::size_t granularity, std::size_t physical_limit, std::size_t max_span, bool wait_before_growing);
  /// Unmaps and releases every handle, logging a call that fails and going
  /// on with the others. The owner must first make sure no queued work uses
  /// the memory (stream_clock::synchronize_all).
  ~granule_map();
  granule_map(const granule_map&) = delete;
  granule_map& operator=(const granule_map&) = delete;

  /// Whether every granule of [addr, addr + bytes) is mapped. Span by
  /// span: a span's granules are all mapped or all unmapped.
  [[nodiscard]] bool covered(std::uintptr_t addr, std::size_t bytes) const noexcept {
    const granule* const gs = granules_.data();
    const std::size_t last = last_of(addr, bytes);
    for (std::size_t g = first(addr); g <= last;) {
      const std::uint32_t si = gs[g].span;
      if (si == nil) return false;
      if (g == last) break;
      g = std::size_t{spans_[si].first} + spans_[si].count;
    }
    return true;
  }

  /// A live block now covers [addr, addr + bytes), all mapped.
  ///
  /// Only a block's first and last granules (its *edges*) are counted: a
  /// granule strictly between them lies wholly inside the block, so no
  /// other live block touches it, and the block is the first to touch it.
  /// Such inner granules raise their span's count of touched granules
  /// together, span by span, without a read of their own; a granule's
  /// `live` is the number of live blocks it is an edge of (spans_under
  /// reads touched granules from the spans). The cost of a block is its
  /// spans, not its granules.
  void on_allocate(std::uintptr_t addr, std::size_t bytes) noexcept {
    const std::size_t lo = first(addr);
    const std::size_t hi = last_of(addr, bytes);
    touch_edge(lo);
    if (hi == lo) return;  // one granule: most blocks
    for (std::size_t g = lo + 1; g < hi;) {
      const std::uint32_t si = granules_[g].span;
      span& s = spans_[si];
      const std::size_t end = std::min<std::size_t>(std::size_t{s.first} + s.count, hi);
      const auto inner = static_cast<std::uint32_t>(end - g);
      if ((s.live += inner) == inner) lru_remove(si);
      g = end;
    }
    touch_edge(hi);
  }

  /// The live block [addr, addr + bytes) was freed with `stamp` at time
  /// `now` (any monotonic count). Returns whether a span became cached (no
  /// live block touches it any more).
  ///
  /// Edges and inner granules as on_allocate: the stamp is merged into each
  /// span the block touches (merging the same stamp again changes
  /// nothing), and its count of touched granules lowered by the inner
  /// granules it holds at once.
  bool on_free(std::uintptr_t addr, std::size_t bytes, free_stamp stamp, std::uint64_t now) noexcept {
    // Highest address first, so that trimming (oldest first) unmaps a freed
    // range from its top and what stays mapped is where the next block in
    // that range is carved (from its bottom).
    const std::size_t lo = first(addr);
    const std::size_t hi = last_of(addr, bytes);
    if (hi == lo) return untouch_edge(lo, stamp, now);  // one granule: most blocks
    bool cached = untouch_edge(hi, stamp, now);
    for (std::size_t g = hi; g > lo + 1;) {
      const std::uint32_t si = granules_[g - 1].span;
      span& s = spans_[si];
      const std::size_t start = std::max<std::size_t>(s.first, lo + 1);
      const auto inner = static_cast<std::uint32_t>(g - start);
      s.stamp = clock_.merge(s.stamp, stamp);
      if ((s.live -= inner) == 0) cached |= cache(si, now);
      g = start;
    }
    return untouch_edge(lo, stamp, now) || cached;
  }

  /// When the oldest cached span became cached (on_free's `now`), if any.
  [[nodiscard]] std::optional<std::uint64_t> oldest_cached() const noexcept {
    const std::uint32_t s = spans_[lru].next;
    if (s == lru) return std::nullopt;
    return spans_[s].cached_at;
  }

  /// Maps every unmapped granule of [addr, addr + bytes): handles from the
  /// pool, then spans stolen from complete cached ones outside the range,
  /// then created. With `wait`, blocks for every pending free first; else,
  /// with wait_before_growing, for those of cached spans before creating
  /// memory that would take the handles held above their high-water mark.
  /// Returns false when out of memory; then the range is as it was and only
  /// cache and pool changed (and, if an undoing unmap threw, a span is
  /// stranded). Throws backend_error when a call throws, with the same
  /// guarantee.
  [[nodiscard]] bool map_range(std::uintptr_t addr, std::size_t bytes, bool wait) {
    return map_range(addr, bytes, wait, wait_before_growing_);
  }

  /// Unmaps cached spans that became cached at or before `before`, oldest
  /// first, while more than `keep` bytes are cached; skips spans whose frees
  /// are not complete yet. Never blocks. A throwing unmap stops it there.
  void trim(std::size_t keep, std::uint64_t before);
  /// Unmaps every cached and stranded span and releases every pooled
  /// handle. The owner must have synchronized pending frees
  /// (stream_clock::synchronize_all). If a call throws, what it did not reach
  /// stays as it was.
  void release_unused();

  /// Releases the physical memory of every span (pause and resume, in the
  /// theory above), copying what live blocks touch to pinned host memory
  /// first when `keep_contents` (copies queued on `stream`, then waited
  /// for). The owner must have synchronized pending frees and must allocate
  /// nothing until resume(). Returns false, with nothing changed but the
  /// cache given back, when pinned host memory runs out. Throws what a
  /// backend call throws, every span left mapped or paused.
  [[nodiscard]] bool pause(bool keep_contents, stream_t stream);
  /// Maps fresh physical memory at every paused span a live block touches,
  /// restoring the contents kept; waits for the copies on `stream`. Returns
  /// false when the device or the physical limit refuses; then every span
  /// is paused again and resume() may be called later. Throws as pause().
  [[nodiscard]] bool resume(stream_t stream);
  [[nodiscard]] bool paused() const noexcept { return paused_; }
  /// Calls set_access again on every mapped run (not paused ones), so that
  /// the backend's access peers added since reach memory mapped before
  /// (arena_policy::enable_peer_access). Throws backend_error, or
  /// out_of_memory's cause as backend_error, if a call fails; calling it
  /// again retries every run.
  void grant_access_again();
  /// A span mapped under a range (spans_under).
  struct span_view {
    std::uintptr_t addr;
    std::size_t bytes;
    physical_handle handle;
  };
  /// The spans mapped under [addr, addr + bytes) in address order, if every
  /// granule of it is mapped (not paused) in a span a live block touches;
  /// else empty. Whether the range itself is live memory is the caller's
  /// check (arena_policy's share asks live_over first). Allocates; for
  /// sharing, not for hot paths.
  [[nodiscard]] std::vector<span_view> spans_under(std::uintptr_t addr, std::size_t bytes) const;
  /// Bytes of paused spans (address space whose memory was given back).
  [[nodiscard]] std::size_t paused_bytes() const noexcept;
  /// Exported handles pause() released, and their bytes, over the map's life.
  struct detached {
    std::uint64_t handles = 0;
    std::uint64_t bytes = 0;
  };
  [[nodiscard]] detached detached_exports() const noexcept { return detached_; }

  [[nodiscard]] std::size_t granularity() const noexcept { return granularity_; }
  /// Bytes of the largest span.
  [[nodiscard]] std::size_t max_span_bytes() const noexcept { return std::size_t{max_span_} << shift_; }
  /// Bytes of spans no live block touches.
  [[nodiscard]] std::size_t cached_bytes() const noexcept { return cached_ << shift_; }
  /// Bytes mapped, stranded spans included (the device holds them mapped).
  [[nodiscard]] std::size_t mapped_bytes() const noexcept { return mapped_ << shift_; }
  [[nodiscard]] std::size_t pooled_bytes() const noexcept { return pooled_ << shift_; }
  [[nodiscard]] std::size_t held_bytes() const noexcept { return mapped_bytes() + pooled_bytes(); }
  [[nodiscard]] std::size_t physical_limit() const noexcept { return limit_; }
  /// Maximal runs of consecutive mapped granules. O(spans).
  [[nodiscard]] std::size_t mapped_runs() const noexcept;
  /// The maximal runs of mapped granules as [address, end), in address
  /// order, from the spans (O(spans log spans)) rather than every granule
  /// of the range. May allocate.
  [[nodiscard]] std::vector<std::pair<std::uintptr_t, std::uintptr_t>> mapped_run_list() const;
  /// Calls f(addr, bytes) for every maximal run of mapped granules, in
  /// address order (mapped_run_list). May allocate.
  template <class F>
  void for_each_mapped_run(F&& f) const {
    for (const auto& [lo, hi] : mapped_run_list()) f(lo, hi - lo);
  }
  /// Collects the maximal runs of mapped granules for mapped_in() and
  /// for_each_run_in(), which see the map as it was then. O(spans log spans);
  /// may allocate.
  void index_runs();
  /// Granules of [addr, addr + bytes) mapped (by the last index_runs()).
  [[nodiscard]] std::size_t mapped_in(std::uintptr_t addr, std::size_t bytes) const noexcept;
  /// Granules [addr, addr + bytes) touches.
  [[nodiscard]] std::size_t touched(std::uintptr_t addr, std::size_t bytes) const noexcept {
    return last_of(addr, bytes) - first(addr) + 1;
  }
  /// Calls f(addr, bytes) for every run of the last index_runs() that
  /// intersects [addr, addr + bytes), in address order.
  template <class F>
  void for_each_run_in(std::uintptr_t addr, std::size_t bytes, F&& f) const {
    const std::size_t lo = first(addr), hi = last_of(addr, bytes);
    auto it =
        std::upper_bound(runs_.begin(), runs_.end(), lo, [](std::size_t g, const mapped_run& r) { return g < r.end; });
    for (; it != runs_.end() && it->first <= hi; ++it)
      f(base_ + (std::size_t{it->first} << shift_), std::size_t{it->end - it->first} << shift_);
  }
  /// Calls f(addr, bytes) for every maximal part of [addr, addr + bytes)
  /// whose granules are mapped in spans some live block touches (memory no
  /// steal or trim can take), in address order.
  template <class F>
  void for_each_pinned_in(std::uintptr_t addr, std::size_t bytes, F&& f) const {
    const std::uintptr_t end = addr + bytes;
    std::uintptr_t run = 0;
    bool in = false;
    for (std::size_t g = first(addr), last = last_of(addr, bytes); g <= last; ++g) {
      const bool pinned = mapped(g) && spans_[granules_[g].span].live != 0;
      const std::uintptr_t lo = std::max(addr, base_ + (g << shift_));
      if (pinned && !in) run = lo;
      if (!pinned && in) f(run, lo - run);
      in = pinned;
    }
    if (in) f(run, end - run);
  }

 private:
  struct granule {
    std::uint32_t live = 0;    // live blocks it is the first or last granule of (on_allocate)
    std::uint32_t span = nil;  // span mapped here; nil = unmapped
  };
  struct span {
    std::uint64_t handle = 0;      // physical_handle value
    std::uint32_t first = 0;       // first granule
    std::uint32_t count = 0;       // granules; 0 = a free slot
    std::uint32_t live = 0;        // granules touched by live blocks
    std::uint32_t prev = nil, next = nil;  // LRU links while cached
    free_stamp stamp;              // frees that touched it since it was mapped
    std::uint64_t cached_at = 0;   // when it was last cached
  };
  struct mapped_run {
    std::uint32_t first;  // granules [first, end)
    std::uint32_t end;
    std::size_t before;  // granules mapped in the runs before it
  };
  struct pooled {
    std::uint64_t handle;
    std::uint32_t count;
  };
  /// A piece of a gap and where its handle comes from.
  struct piece {
    std::uint32_t first;
    std::uint32_t count;
    std::uint64_t handle;
  };
  static constexpr std::uint32_t lru = 0;  // spans_[0]: the LRU's sentinel
  static constexpr std::uint64_t paused_handle = 0;  // a paused span's handle
  /// A paused span's pinned host copy (pause with keep_contents).
  struct kept_copy {
    std::uint32_t span;
    void* host;
    std::size_t bytes;
  };

  /// Counts `count` granules of handles just created, and the high-water
  /// mark with them (the one place created_ grows).
  void add_created(std::size_t count) noexcept {
    created_ += count;
    high_water_ = std::max(high_water_, created_);
  }
  /// Whether span slot `sp` holds a mapping: in use and not paused.
  [[nodiscard]] static bool maps(const span& sp) noexcept { return sp.count != 0 && sp.handle != paused_handle; }
  /// Whether granule g is mapped (a span, not paused, is there).
  [[nodiscard]] bool mapped(std::size_t g) const noexcept {
    return granules_[g].span != nil && spans_[granules_[g].span].handle != paused_handle;
  }
  /// Maps a fresh handle at every paused span in `spans` a live block
  /// touches and grants access; on failure unmaps and releases what it
  /// mapped and returns false (or rethrows). Appends the spans mapped to
  /// `mapped_now`.
  [[nodiscard]] bool remap(const std::vector<std::uint32_t>& spans, std::vector<std::uint32_t>& mapped_now);
  /// Unmaps and releases the handles of `spans` (mapped by remap), marking
  /// them paused again; never throws (a call that fails is logged).
  void unremap(const std::vector<std::uint32_t>& spans) noexcept;
  /// Frees every kept host copy.
  void drop_copies() noexcept;

  [[nodiscard]] std::size_t first(std::uintptr_t addr) const noexcept { return (addr - base_) >> shift_; }
  [[nodiscard]] std::size_t last_of(std::uintptr_t addr, std::size_t bytes) const noexcept {
    return (addr + bytes - 1 - base_) >> shift_;
  }
  [[nodiscard]] void* address(std::size_t g) const noexcept {
    return reinterpret_cast<void*>(base_ + (g << shift_));
  }

  /// A live block has granule g as its first or last granule.
  void touch_edge(std::size_t g) noexcept {
    const std::uint32_t si = granules_[g].span;
    if (granules_[g].live++ == 0 && spans_[si].live++ == 0) lru_remove(si);
  }
  /// A freed block had granule g as its first or last granule (on_free);
  /// whether g's span became cached.
  bool untouch_edge(std::size_t g, free_stamp stamp, std::uint64_t now) noexcept {
    const std::uint32_t si = granules_[g].span;
    span& s = spans_[si];
    s.stamp = clock_.merge(s.stamp, stamp);
    return --granules_[g].live == 0 && --s.live == 0 && cache(si, now);
  }
  /// Span si lost its last touched granule at `now`: cached unless paused.
  bool cache(std::uint32_t si, std::uint64_t now) noexcept {
    span& s = spans_[si];
    if (s.handle == paused_handle) return false;
    s.cached_at = now;
    lru_push(si);
    return true;
  }
  /// Span s becomes the newest cached span.
  void lru_push(std::uint32_t s) noexcept {
    const std::uint32_t last = spans_[lru].prev;
    spans_[s].prev = last;
    spans_[s].next = lru;
    spans_[last].next = s;
    spans_[lru].prev = s;
    cached_ += spans_[s].count;
  }
  /// Span s leaves the cache.
  void lru_remove(std::uint32_t s) noexcept {
    spans_[spans_[s].prev].next = spans_[s].next;
    spans_[spans_[s].next].prev = spans_[s].prev;
    spans_[s].prev = spans_[s].next = nil;
    cached_ -= spans_[s].count;
  }
  /// Whether the frees that touched span s are complete, refreshing each
  /// stream at most once per `refreshed` mask (bit i: stream i, bit 63: all).
  [[nodiscard]] bool idle(std::uint32_t s, std::uint64_t& refreshed);
  /// Waits for the frees of cached spans outside granules [lo, hi], oldest
  /// first, until `granules` granules of them are complete; whether it waited.
  [[nodiscard]] bool settle(std::size_t granules, std::size_t lo, std::size_t hi, std::uint64_t& refreshed);
  /// Unmaps cached span s; its handle goes to the pool.
  void unmap_to_pool(std::uint32_t s);
  /// Cached spans, sorted here by address, unmapped with one call per run
  /// of adjacent ones; their handles go to the pool. If an unmap throws, the
  /// spans of that run and the later ones stay cached.
  void unmap_all_to_pool(std::vector<std::uint32_t>& spans);
  /// Span s was unmapped: its handle goes to the pool, its slot is freed.
  void forget_unmapped(std::uint32_t s) noexcept;
  /// Takes the largest pooled handle of at most `count` granules, if any.
  [[nodiscard]] std::optional<pooled> take_pooled(std::uint32_t count) noexcept;
  /// Puts a handle in the pool; capacity must be reserved.
  void put_pooled(pooled p) noexcept;
  /// Releases pooled handles and complete cached spans outside [lo, hi],
  /// oldest first, until `granules` granules' worth went back to the device.
  void release_for(std::size_t granules, std::size_t lo, std::size_t hi, std::uint64_t& refreshed);
  /// Plans the handles for the gap [from, to) (all unmapped): pool, then
  /// stolen cached spans, appended to `plan`; returns the first granule
  /// still without a handle. `refreshed` as for idle().
  std::uint32_t fill_gap(std::uint32_t from, std::uint32_t to, std::size_t lo, std::size_t hi,
                         std::vector<piece>& plan, std::uint64_t& refreshed);
  /// Maps every piece of `plan` as a new span; on a failed (or throwing) map
  /// or set_access undoes what it mapped, handles back to the pool, and
  /// returns false (or rethrows). A span whose undoing unmap throws stays
  /// mapped: cached if its access was granted, else stranded.
  [[nodiscard]] bool map_plan(const std::vector<piece>& plan);
  /// Span s, mapped without access granted, could not be unmapped: its
  /// granules are marked unmapped, so no block is served there, and the
  /// mapping waits in stranded_ (still counted in mapped_) for unstrand().
  void strand(std::uint32_t s) noexcept;
  /// Unmaps every stranded span, its handle to the pool. Throws what a
  /// failing unmap throws; that span and the ones not reached stay stranded.
  void unstrand();
  /// Creates handles for [from, to), cut at multiples of max_span; appended to
  /// `plan`. False, having released what it created, when the limit or the
  /// device refuses.
  [[nodiscard]] bool create_for(std::uint32_t from, std::uint32_t to, std::vector<piece>& plan);
  /// Returns every handle of `plan` to the pool (they are not mapped).
  void pool_plan(const std::vector<piece>& plan, std::size_t from) noexcept;
  [[nodiscard]] std::uint32_t new_span();
  /// map_range; `settle_first`: settle() before creating.
  [[nodiscard]] bool map_range(std::uintptr_t addr, std::size_t bytes, bool wait, bool settle_first);

  device_backend& backend_;
  stream_clock& clock_;
  std::uintptr_t base_;
  std::size_t granularity_;
  unsigned shift_;
  std::size_t limit_;          // bytes of handles the map may hold
  std::uint32_t max_span_;     // granules per span at most
  bool wait_before_growing_;
  std::size_t created_ = 0;    // granules of handles held (mapped + pooled)
  std::size_t high_water_ = 0;  // the most granules created_ has held
  std::size_t mapped_ = 0;     // granules mapped
  std::size_t cached_ = 0;     // granules in cached spans
  std::size_t pooled_ = 0;     // granules of pooled handles
  std::vector<granule> granules_;
  std::vector<span> spans_;    // [0] is the LRU sentinel
  std::vector<std::uint32_t> free_spans_;
  std::vector<pooled> pool_;   // sorted by count
  std::vector<mapped_run> runs_;  // index_runs()
  std::vector<piece> stranded_;  // mapped without access, unmap failed: see strand()
  bool paused_ = false;
  std::vector<kept_copy> copies_;  // pause with keep_contents
  detached detached_;              // exported handles pause released
  // Scratch of map_range.
  std::vector<piece> plan_;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> holes_;  // [from, to) still to create
  std::vector<std::uint32_t> made_;                              // spans map_plan mapped
  std::vector<std::uint32_t> stolen_;                            // spans fill_gap steals
  std::vector<std::uint32_t> stolen_counts_;                     // their sizes, oldest first
};

}  // namespace fragctl::arena_detail
