// The arena policy: a contiguous arena with page stitching.
//
// Theory.
//
// Address space. The arena reserves one virtual range per device, twice the
// physical memory it may hold (arena_size, default the device's total). The
// range is tiled into blocks (block_index.hpp): free blocks in segregated
// lists two levels deep (exact classes below 32 KiB, then 64 classes per
// doubling), found near best fit in O(1) (the request's own class first, then
// the next non-empty class), split on allocation, coalesced with free
// neighbours on free through boundary links. Sizes are rounded to 512 bytes.
// Every operation is a few array and bitmap accesses plus one insert into or
// erase from the live-block table (address_table); no ordered tree, no heap
// allocation.
// Twice the address space means address-space fragmentation cannot be what
// fails an allocation: a contiguous free range of any size the device could
// hold is always left somewhere.
//
// Page stitching (granule_map.hpp). Physical memory is mapped in spans: one
// handle over a run of granules (2 MiB on H100/H200), at most map_chunk bytes
// (16 MiB by default). Each span counts its granules live blocks touch; a
// span none of whose granules is touched is "cached" (kept mapped). A block
// landing on unmapped granules fills them from the pool of unmapped handles
// that fit, then steals whole cached spans that fit (unmapping them), and
// creates new spans only for what is still missing, after giving back as
// many bytes of unused pool and cached spans as it creates. Hence:
//  * physical memory held grows only when every held span is touched by a
//    live block. Reserved bytes follow live bytes up to the partly used
//    granules at the edges of holes and, with spans, the untouched granules
//    of spans a live block still touches (map_chunk at the granularity
//    removes those: one handle per granule, any page stitchable anywhere).
//  * because free pages are re-stitched wherever the next request lands,
//    the largest block the arena can serve is effectively all free physical
//    memory: an out-of-memory caused by fragmentation needs the free bytes to
//    sit in partly used spans.
//  * pooled handles are still held from the device (the backend counts
//    them), but they are used or given back before anything is created, so
//    they never add to the peak. release_cached() returns pool and cache.
//
// Placement before re-stitching. Best fit looks at sizes only; a block of
// at least relocate_spans largest spans that it would put on unmapped
// granules goes instead where the fewest granules are missing
// (closer_to_mapped), so that it re-stitches what it lacks, not its whole
// size, when a mapped free range almost fits it elsewhere; only if the move
// saves at least 1/relocate_saving of its granules, since a block moved for
// less cuts into mapped free ranges that a repeating step's next blocks fit.
//
// Blocks that outlive a step (lifetime placement). Under gradient
// accumulation the first micro-batch's weight gradients live until the
// optimizer step, thousands of calls, while the backward's temporaries around
// them come and go; best fit puts each gradient in the hole a freed temporary
// of a little more left, and the rest of that hole (a few granules) stays
// mapped inside spans the gradient pins until the step ends, where the step's
// peak finds it unusable (the live declm job with two micro-batches held
// 1.014 of its live bytes, 258 of its 386 MB excess in such spans). So the
// arena remembers, per rounded size, how many calls the last block of that
// size lived (a direct-mapped table, overwritten on collision); a block whose
// size's last block lived at least lifetime_horizon calls goes, if it can,
// next to a live block that is long-lived too (expected so, or already that
// old), in the smallest free block that has such a neighbour and is mapped
// where the block would sit. Long-lived blocks then pack together and the
// temporaries' holes stay whole for temporaries. A block with no such place
// goes to best fit; blocks of sizes that live briefly are never moved. The
// plan's ranges count as long-lived from the start; a block the plan hands
// over counts its age from the hand-over, and planned blocks teach the table
// nothing (the plan places them itself). Calls are counted modulo 2^32 here:
// a lifetime or age of 2^32 calls or more (hours) reads short, which costs
// at most a guess.
//
// The steady-state plan (step_plan.hpp). Once the job repeats a step
// (found from the shape of its allocations and frees, not their sizes; no
// marker), the step's blocks, each at the largest size seen at its point,
// are laid out in the arena's free holes and one new range, which become
// live blocks of the arena, and every step of that shape whose blocks fit
// is served from that layout: no search and no driver call. A step larger
// than any seen is laid out again at its start; what does not follow the
// plan goes to the placement above; the plan's ranges go back once it is
// left (its live blocks, if any, handed to the arena at their addresses).
//
// Driver calls. The common path (the block lands on mapped granules) makes
// none. A newly touched run costs one map per span and one set_access for the
// run; the spans stolen for one gap are unmapped with one call per run of
// adjacent ones (a mapping is unmapped whole, never in part). Each call costs about
// the same whatever the handle's size (on an H200: create 9 us, map 1 us,
// set_access 25 us, unmap 16 us per handle from 2 to 64 MiB; bench_vmm),
// which is why spans exist: a new peak costs a few calls per 16 MiB instead
// of per 2 MiB. What to keep mapped matters too. A cached span is reused at
// its own address for free, and because cached spans are stolen or exchanged
// before anything is created, keeping them costs no peak memory. So cached
// spans up to release_threshold bytes stay mapped indefinitely, and beyond it
// a cached span is unmapped into the pool only once it stayed cached for
// release_delay allocator calls (2^20 by default): a hysteresis under which
// memory a training step frees and the next takes again is never unmapped,
// and a steady-state step maps and unmaps nothing. Unmapping every free span
// at once (release_delay 0) keeps the same peak but sends most operations of
// a training trace to the driver (docs/policies/arena.md).
//
// Stream order (stream_clock.hpp). A free is stamped with its stream's tick
// and costs no backend call. Same-stream reuse is immediate. Another stream
// may use a free block's dirty part only once one event recorded on the
// freeing stream after the free (lazily, when someone needs to know)
// completed; a clean prefix or suffix is usable at once. A granule is
// unmapped only when every free that touched it is complete; that is checked
// by querying, and waited for when memory is short or, with
// wait_before_growing (the default), before creating memory above the most
// held so far while a cached span waits on pending frees: on a GPU the host
// runs ahead, and creating instead of waiting makes the peak follow the
// GPU's lag rather than the live bytes (granule_map.hpp; docs/policies/
// arena.md "GPU lag"). Below that mark it creates: a wait there would leave
// the GPU idle while the host re-stitches.
//
// Out of memory. No fitting block usable on the stream: query pending events,
// then wait for them. Mapping short of handles: wait for pending frees and
// steal or exchange every cached span; then unmap and release everything unused and
// try once more; then give back what that attempt left unused and throw
// out_of_memory with requested, reserved, free in cache, the largest free
// block and device free/total.
//
// Failures midway. Mapping is transactional (granule_map.hpp): each attempt
// maps the block's whole range or leaves it unmapped, and the block is taken
// from the free lists only once its range is mapped, so a failed create, map
// or set_access leaves the arena as it was apart from cache and pool, and it
// serves the next request that fits. A failed unmap or release is a runtime
// error (backend_error), with the same guarantee.
//
// Without virtual memory (HIP 5.2, sim without it) the arena is one raw block
// of fallback_size bytes, tiled the same way; nothing is mapped, reserved is
// the block, and the arena is out of memory when no block of it fits.
#include "allocator_policies/arena/arena_policy.hpp"

#include <algorithm>
#include <array>
#include <optional>

#include "allocator_policies/arena/block_index.hpp"
#include "allocator_policies/arena/granule_map.hpp"
#include "allocator_policies/arena/step_plan.hpp"
#include "core/stream_clock.hpp"
#include "fmt/format.h"
#include "fragctl/error.hpp"
#include "fragctl/log.hpp"
#include "util/intervals.hpp"
#include "util/strings.hpp"

namespace fragctl {

using arena_detail::block_index;
using arena_detail::granule_map;
using arena_detail::nil;
using arena_detail::step_plan;

struct arena_policy::impl {
  impl(const config& cfg, device_backend& b);
  ~impl();

  /// Blocks of at least this many largest spans are placed by
  /// closer_to_mapped(): moved next to mapped memory, a block partly covers
  /// at most two spans at its ends, which then stay mapped whole; for a
  /// smaller block that costs more memory than the moves it saves.
  static constexpr std::size_t relocate_spans = 16;
  /// A move must leave at least 1/relocate_saving of the block's granules
  /// fewer to map than best fit would. A smaller saving is not worth leaving
  /// the place best fit chooses again step after step: the moved block cuts
  /// into a mapped free range that the next blocks of a repeating step fit,
  /// and they re-stitch in turn (a frozen-base job made 20 driver calls per
  /// step with every move, none with this rule).
  static constexpr std::size_t relocate_saving = 32;
  /// Lifetime placement (the theory above): a block is expected to live long
  /// when the last block of its size lived at least this many calls (about
  /// half a step of the declm job with two micro-batches, whose gradients live
  /// 8,100-14,000 calls; at 3,000 other jobs' blocks moved too and their
  /// driver calls rose by up to half on replays).
  static constexpr std::uint32_t lifetime_horizon = 8000;
  /// Free blocks lifetime placement looks at, about smallest first.
  static constexpr int lifetime_scan = 64;
  /// The lifetime, in calls, of the last block freed with a rounded size
  /// (in block_index units), by a hash of the size.
  struct last_life {
    std::uint32_t units = 0;
    std::uint32_t calls = 0;
  };
  static constexpr unsigned lifetime_slots_log2 = 12;
  /// A place for a block of `size` on `stream`, now bound for `at`, where
  /// enough fewer granules are unmapped, if there is one.
  struct spot {
    std::uint32_t id = nil;
    std::uintptr_t at = 0;
  };
  [[nodiscard]] spot closer_to_mapped(std::size_t size, std::uint32_t stream, std::uintptr_t at);
  [[nodiscard]] static std::size_t lifetime_slot(std::size_t units) noexcept {
    return static_cast<std::size_t>((units * UINT64_C(0x9E3779B97F4A7C15)) >> (64 - lifetime_slots_log2));
  }
  /// The call count as a block's birth keeps it (modulo 2^32), and a live
  /// block's age since then (the subtraction wraps as the count does).
  [[nodiscard]] std::uint32_t birth_now() const noexcept { return static_cast<std::uint32_t>(calls); }
  [[nodiscard]] std::uint32_t age(const block_index::block& b) const noexcept { return birth_now() - b.born; }
  /// Whether the last block of `size` bytes freed lived at least lifetime_horizon calls.
  [[nodiscard]] bool expected_long(std::size_t size) const noexcept;
  /// Remembers how long live block `b`, being freed, lived.
  void learn_lifetime(const block_index::block& b) noexcept;
  /// Whether block `id` (nil for none) is live and long-lived: expected so
  /// when allocated, or lifetime_horizon calls old.
  [[nodiscard]] bool long_lived(std::uint32_t id) const noexcept;
  /// The smallest free block (of the first lifetime_scan looked at, about
  /// smallest first: block_index::for_each_fitting) wholly usable on
  /// `stream` with a long-lived neighbour, where `size` bytes against that
  /// neighbour are mapped, and that place; none if there is none.
  [[nodiscard]] spot next_to_long_lived(std::size_t size, std::uint32_t stream) const noexcept;
  [[nodiscard]] block_index::fit find_fit_slow(std::size_t bytes, std::uint32_t stream, std::size_t requested);
  /// Whether best fit finds `size` bytes on `stream` in mapped memory now
  /// (place() would make no driver call).
  [[nodiscard]] bool mapped_fit(std::size_t size, std::uint32_t stream) const noexcept;
  void map_or_throw(std::uintptr_t addr, std::size_t bytes, std::size_t requested);
  /// release_unused(), logging a runtime error instead of throwing it.
  void give_back_unused() noexcept;
  void trim() noexcept;
  [[nodiscard]] std::size_t largest_free() const;
  /// Whether every byte of [addr, addr + bytes) (inside the range) is live
  /// memory a caller was given: the arena's live blocks other than the
  /// plan's ranges, and the live planned blocks in those.
  [[nodiscard]] bool live_over(std::uintptr_t addr, std::size_t bytes) const;
  /// Best fit, moved closer to mapped memory when large, mapped: the
  /// arena's own placement of a block of `size` (rounded) on stream `si`.
  /// A plan's new range (`plan_range`) stays where best fit puts it and is
  /// a long-lived neighbour from the start.
  [[nodiscard]] std::uintptr_t place(std::size_t size, std::uint32_t si, std::size_t requested,
                                     bool plan_range = false);
  /// Maps the plan's region and starts the plan; false when it cannot be had.
  bool start_plan();
  /// Gives the region of a plan left behind back to the arena.
  void free_region() noexcept;
  /// Frees the plan's ranges (plan_blocks).
  void free_plan_blocks() noexcept;
  /// The plan was left with planned blocks live: they become the arena's
  /// own live blocks at their addresses, and the ranges around them free
  /// memory of the arena (their pages stay mapped where a block touches them).
  void hand_over();
  /// After the plan was left: its live blocks handed over (hand_over), or,
  /// with none live, its ranges freed (free_region).
  void settle_left_plan();
  /// Tells the plan of an allocation or a free; if its history cannot grow
  /// (no host memory), the plan is left and planning stops.
  void note(std::uintptr_t addr, std::size_t size, std::uint32_t si, bool is_free, bool planned) noexcept;
  /// note() could not grow the history: the plan is left and planning stops.
  [[gnu::cold]] void stop_planning() noexcept;
  /// Frees a planned block (the address is in the plan's region).
  free_result free_planned(std::uintptr_t addr, std::size_t bytes, stream_t stream) noexcept;
  [[nodiscard]] out_of_memory oom(std::size_t requested) const;

  device_backend& backend;
  std::size_t threshold;
  std::uint64_t release_delay;
  std::uint64_t calls = 0;  // allocations and frees so far: the clock of release_delay
  void* raw = nullptr;  // the reserved range, or the fallback block
  std::size_t range = 0;
  std::size_t capped_at = 0;  // the arena_size option, rounded to granules; 0 when not set
  stream_clock clock;
  block_index blocks;
  std::optional<granule_map> granules;  // with virtual memory only
  bool paused = false;                  // pause() until resume()
  std::size_t allocated = 0;
  std::uint64_t retries = 0;
  step_plan plan;  // the steady-state plan (step_plan.hpp), with virtual memory only
  std::vector<step_plan::bin> plan_bins;    // scratch of start_plan
  std::vector<std::uintptr_t> plan_blocks;  // the plan's ranges (live blocks), sorted
  std::size_t peak_held = 0;                // most physical memory held (mapped and pooled) so far
  bool lifetime_placement;  // the option
  std::array<last_life, std::size_t{1} << lifetime_slots_log2> lifetimes{};  // lifetime placement's memory
};

arena_policy::impl::impl(const config& cfg, device_backend& b)
    : backend(b),
      threshold(cfg.release_threshold),
      release_delay(cfg.release_delay),
      clock(b),
      lifetime_placement(cfg.lifetime_placement) {
  if (backend.supports_virtual_memory()) {
    const std::size_t g = backend.granularity();
    const std::size_t cap = round_up(cfg.arena_size != 0 ? cfg.arena_size : backend.get_memory_info().total, g);
    if (cap == 0) throw invalid_argument("arena: the device reports no memory and arena_size is 0");
    if (cfg.arena_size != 0) capped_at = cap;
    range = 2 * cap;
    raw = backend.reserve_address(range);
    try {
      granules.emplace(backend, clock, reinterpret_cast<std::uintptr_t>(raw), range, g, cap, cfg.map_chunk,
                       cfg.wait_before_growing);
      blocks.reset(reinterpret_cast<std::uintptr_t>(raw), range);
      plan.enable(cfg.step_plan);
      plan.set_call_counter(
          [](const void* ctx) { return static_cast<const device_backend*>(ctx)->counters().memory_calls(); }, &backend);
    } catch (...) {
      granules.reset();
      backend.release_address(raw, range);
      throw;
    }
  } else {
    range = cfg.fallback_size;
    if (range == 0) {
      const std::size_t free_bytes = backend.get_memory_info().free / 10 * 9;
      range = free_bytes >= 2 * MiB ? round_down(free_bytes, 2 * MiB) : round_down(free_bytes, min_alignment);
    }
    range = round_up(range, min_alignment);
    if (range == 0) throw invalid_argument("arena: fallback_size is 0 and the device reports no free memory");
    raw = backend.allocate(range);
    if (raw == nullptr) {
      oom_details d;
      d.requested = range;
      const memory_info info = backend.get_memory_info();
      d.device_free = info.free;
      d.device_total = info.total;
      throw out_of_memory(d, "arena (fallback block)");
    }
    try {
      blocks.reset(reinterpret_cast<std::uintptr_t>(raw), range);
    } catch (...) {
      backend.free(raw, range);
      throw;
    }
    plan.enable(false);
  }
}

arena_policy::impl::~impl() {
  const std::size_t live = blocks.live_count() + plan.live_planned() - plan_blocks.size();
  if (live != 0) {
    logger().warn("arena: destroyed with {} live blocks ({} bytes); their memory is freed", live, allocated);
  }
  try {
    clock.synchronize_all();
    if (granules) {
      granules.reset();
      backend.release_address(raw, range);
    } else {
      backend.free(raw, range);
    }
  } catch (const std::exception& e) {
    logger().error("arena: returning memory at destruction failed: {}", e.what());
  }
}

bool arena_policy::impl::mapped_fit(std::size_t size, std::uint32_t stream) const noexcept {
  if (granules && expected_long(size) && next_to_long_lived(size, stream).id != nil) return true;  // as place()
  const block_index::fit where = blocks.find_fit(size, stream, clock);
  return where && (!granules || granules->covered(blocks.address_of(where, size), size));
}

block_index::fit arena_policy::impl::find_fit_slow(std::size_t bytes, std::uint32_t stream,
                                                    std::size_t requested) {
  clock.refresh_all();
  if (const block_index::fit f = blocks.find_fit(bytes, stream, clock)) return f;
  clock.synchronize_all();
  if (const block_index::fit f = blocks.find_fit(bytes, stream, clock)) return f;
  throw oom(requested);
}

// Placement before re-stitching. The free block best fit chose would need
// granules mapped: look, in every free block usable on the stream, at the
// positions that start or end at the block's ends or at the ends of a run of
// mapped granules inside it, and take the one that leaves the fewest
// granules unmapped (ties: the smaller free block), if that saves at least
// 1/relocate_saving of the block's granules. A block that misses a mapped
// free range by a few granules then re-stitches those, not its whole size.
// O(free blocks + runs x log runs), on the path that calls the driver.
arena_policy::impl::spot arena_policy::impl::closer_to_mapped(std::size_t size, std::uint32_t stream,
                                                              std::uintptr_t at) {
  granules->index_runs();
  spot best;
  const std::size_t granules_of_block = granules->touched(at, size);
  const std::size_t missing_at_best_fit = granules_of_block - granules->mapped_in(at, size);
  std::size_t best_missing = missing_at_best_fit;
  std::size_t best_block = 0;
  blocks.for_each_free_id([&](std::uint32_t id, const block_index::block& b) {
    if (b.size < size || !clock.usable_on(b.stamp, stream)) return;
    const std::uintptr_t lo = b.addr, hi = b.addr + b.size - size;
    const auto consider = [&](std::uintptr_t pos) {
      pos = std::clamp(pos, lo, hi);
      const std::size_t missing = granules->touched(pos, size) - granules->mapped_in(pos, size);
      if (missing < best_missing || (missing == best_missing && best.id != nil && b.size < best_block)) {
        best = {id, pos};
        best_missing = missing;
        best_block = b.size;
      }
    };
    consider(lo);
    consider(hi);
    granules->for_each_run_in(b.addr, b.size, [&](std::uintptr_t run, std::size_t bytes) {
      consider(run);
      consider(run + bytes >= size ? run + bytes - size : lo);
    });
  });
  if ((missing_at_best_fit - best_missing) * relocate_saving < granules_of_block) return spot{};
  return best;
}

// Each map_range either maps the whole range or leaves the granules as they
// were (stolen spans and what it created wait in the pool, granule_map.hpp).
// Before the last attempt, and after it fails, everything unused goes back
// to the device, so an out_of_memory leaves nothing held for the failed
// request. Giving back is best effort here: a runtime error while doing it
// is logged and the out_of_memory, with its diagnosis, still reaches the
// caller; a runtime error of the mapping itself propagates.
void arena_policy::impl::map_or_throw(std::uintptr_t addr, std::size_t bytes, std::size_t requested) {
  struct note_peak {
    impl& s;
    ~note_peak() { s.peak_held = std::max(s.peak_held, s.granules->held_bytes()); }
  } peak{*this};
  if (granules->map_range(addr, bytes, /*wait=*/false)) return;
  if (!granules->map_range(addr, bytes, /*wait=*/true)) {
    clock.synchronize_all();
    give_back_unused();
    if (!granules->map_range(addr, bytes, /*wait=*/true)) {
      give_back_unused();
      throw oom(requested);
    }
  }
  ++retries;
}

void arena_policy::impl::give_back_unused() noexcept {
  try {
    granules->release_unused();
  } catch (const std::exception& e) {
    logger().error("arena: giving back unused memory before out_of_memory failed: {}", e.what());
  }
}

void arena_policy::impl::trim() noexcept {
  if (calls < release_delay) return;
  try {
    granules->trim(threshold, calls - release_delay);
  } catch (const std::exception& e) {
    logger().error("arena: unmapping free granules failed: {}", e.what());
  }
}

bool arena_policy::impl::expected_long(std::size_t size) const noexcept {
  if (!lifetime_placement) return false;
  const std::size_t units = size / block_index::unit;
  const last_life& l = lifetimes[lifetime_slot(units)];
  return l.units == units && l.calls >= lifetime_horizon;
}

void arena_policy::impl::learn_lifetime(const block_index::block& b) noexcept {
  const std::size_t units = b.size / block_index::unit;
  if (!lifetime_placement || units > UINT32_MAX) return;
  lifetimes[lifetime_slot(units)] = {static_cast<std::uint32_t>(units), age(b)};
}

bool arena_policy::impl::long_lived(std::uint32_t id) const noexcept {
  if (id == nil) return false;
  const block_index::block& b = blocks.at(id);
  return !b.is_free && (b.long_lived || age(b) >= lifetime_horizon);
}

arena_policy::impl::spot arena_policy::impl::next_to_long_lived(std::size_t size, std::uint32_t stream) const noexcept {
  spot best;
  std::size_t best_size = 0;
  blocks.for_each_fitting(size, lifetime_scan, [&](std::uint32_t id, const block_index::block& b) {
    if ((best.id != nil && b.size >= best_size) || !clock.usable_on(b.stamp, stream)) return;
    if (long_lived(b.prev) && granules->covered(b.addr, size)) {
      best = {id, b.addr};
    } else if (long_lived(b.next) && granules->covered(b.addr + b.size - size, size)) {
      best = {id, b.addr + b.size - size};
    } else {
      return;
    }
    best_size = b.size;
  });
  return best;
}

std::uintptr_t arena_policy::impl::place(std::size_t size, std::uint32_t si, std::size_t requested,
                                         bool plan_range) {
  blocks.prepare();
  const block_index::birth birth{birth_now(), plan_range || expected_long(size)};
  if (birth.long_lived && !plan_range && granules) {
    if (const spot p = next_to_long_lived(size, si); p.id != nil) {
      const std::uintptr_t addr = blocks.allocate_at(p.id, p.at, size, requested, birth);
      granules->on_allocate(addr, size);
      return addr;
    }
  }
  block_index::fit where = blocks.find_fit(size, si, clock);
  if (where.blocked != free_stamp::none) {
    // A better block waits for another stream's frees: ask once whether they are done.
    clock.refresh(where.blocked);
    where = blocks.find_fit(size, si, clock);
  }
  if (!where) where = find_fit_slow(size, si, requested);
  std::uintptr_t addr = 0;
  if (granules && !granules->covered(blocks.address_of(where, size), size)) {
    spot p;
    if (size >= relocate_spans * granules->max_span_bytes()) {
      p = closer_to_mapped(size, si, blocks.address_of(where, size));
    }
    if (p.id == nil) p = {where.id, blocks.address_of(where, size)};
    if (!granules->covered(p.at, size)) map_or_throw(p.at, size, requested);
    addr = blocks.allocate_at(p.id, p.at, size, requested, birth);
  } else {
    addr = blocks.allocate(where, size, requested, birth);
  }
  if (granules) granules->on_allocate(addr, size);
  return addr;
}

// The plan's ranges are live blocks of the arena: the mapped free ranges
// the layout used (so that the step's blocks fill the holes its first steps
// left between long-lived blocks) and, for what they do not hold, one new
// range. Their spans are never cached, so no trim or steal takes them while
// the plan serves from them.
bool arena_policy::impl::start_plan() {
  const std::uint32_t si = plan.region_stream();
  std::vector<step_plan::bin>& bins = plan_bins;
  bins.clear();
  plan_blocks.clear();
  try {
    // A plan starts only if it pays and fits: its new range (what the bins
    // do not hold) must cost no more driver calls to map (about one per
    // largest span) than best fit made in the step's last repeat, or over
    // the steps in a row at its shape (step_plan::shape_run_calls), since a
    // job whose steps best fit already serves from mapped memory gains
    // nothing from it; and it must not raise the memory held above its
    // high-water mark (the range takes the cached spans and pooled handles
    // first). A plan laid out again for a larger step (regrow), with sizes
    // its history bears out, may raise it by as much as the step's planned
    // live bytes grow and 1/16 of that for the packing (refused, the step
    // goes to best fit, which raises the memory held by more: 5,437 driver
    // calls and 57 MB more on the 40-step declm model's last step), no more.
    const std::uint64_t peak = plan.live_peak();
    std::size_t grown = plan.regrowing() && peak > plan.previous_layout_live() ? peak - plan.previous_layout_live() : 0;
    // Only for sizes the plan's history bears out: a layout of sizes it
    // contradicts is a guess, and memory mapped for a guess stays the
    // job's high-water mark (step_plan::resize_for).
    const bool guess = plan.regrowing() && !plan.regrow_borne_out();
    if (guess) grown = 0;
    grown += grown / 16;
    const std::size_t spare = granules->cached_bytes() + granules->pooled_bytes();
    // A plan refused waits for the next step start, except one laid out
    // again for a larger step on sizes its history does not bear out: its
    // slots hold the guess, which no later step start fits under the
    // high-water mark (waiting, it served no step again; arena_plan_test's
    // two-dimensional jobs), so it learns anew, from a history with this
    // step in it.
    // A layout refused for its memory in a run of steps at one shape backs
    // off (step_plan::defer): the next steps at the shape would most likely
    // be refused the same way, each after a layout.
    const auto wait = [&](bool layout_passes_mark) {
      if (guess) {
        plan.abandon();
      } else {
        plan.defer(layout_passes_mark && plan.in_shape_run());
      }
    };
    // Best fit's calls: in the step that just ended, or over the steps in
    // a row at its shape, which it makes again at each such step (a
    // mixture of experts at one shape: 95-308 a step, 3-10 times fewer
    // than mapping its plan's range costs).
    const std::uint64_t best_fit_calls = std::max(plan.recent_step_calls(), plan.shape_run_calls());
    // Why a new range is refused, if it is (counted and logged by judge).
    struct verdict {
      bool costs_more = false;   // more calls than best fit's
      bool passes_mark = false;  // past the high-water mark and the growth allowed
      explicit operator bool() const noexcept { return costs_more || passes_mark; }
    };
    // `at_least`: new_range is a lower bound (before the bins are known, or the layout made).
    const auto judge = [&](std::size_t new_range, bool at_least) {
      const std::size_t held = granules->held_bytes() + (new_range > spare ? new_range - spare : 0);
      const verdict v{best_fit_calls * granules->max_span_bytes() < new_range, held > peak_held + grown};
      if (v) {
        plan.start_refused(v.costs_more, v.passes_mark);
        log_noexcept(spdlog::level::debug,
                     "arena step plan: not started: a new range of {}{} bytes{}{}{} (best fit's calls in the step "
                     "before: {}, over the steps in a row at its shape: {}; the memory held with it {}, high-water "
                     "mark {}, growth allowed {})",
                     at_least ? "at least " : "", new_range, v.costs_more ? " costs more calls than best fit made" : "",
                     v.costs_more && v.passes_mark ? " and" : "", v.passes_mark ? " passes the high-water mark" : "",
                     plan.recent_step_calls(), plan.shape_run_calls(), held, peak_held, grown);
      }
      return v;
    };
    // Both rules grow with the range, and the range is at least the step's
    // live peak less what the bins hold: a plan refused at that bound waits
    // without what follows, which it would not pass either. A refused plan
    // is judged again at the next step start (or, backed off, a later one),
    // and what follows is costly: the bins scan every free block's granules
    // (about a third of the arena's instructions on the resnet50 trace,
    // whose plan never pays), the
    // layout takes time (layout.hpp: 36 ms for a kvgen step of 37,329
    // blocks; 217 ms for the live t5 job with gradient accumulation when
    // it scanned every placed block per block). Before the scan the bins
    // are bounded by the free memory of the spans live blocks touch
    // (mapped less cached less live).
    const std::size_t held_by_blocks = granules->mapped_bytes() - granules->cached_bytes();
    const std::size_t at_most_in_bins = held_by_blocks > allocated ? held_by_blocks - allocated : 0;
    if (judge(peak > at_most_in_bins ? peak - at_most_in_bins : 0, true)) {
      wait(false);
      return false;
    }
    // The bins: free memory in spans live blocks touch (holes no steal can
    // take), for the step's small blocks; the rest goes to one new range,
    // which steals the cached spans.
    blocks.for_each_free_id([&](std::uint32_t id, const block_index::block& b) {
      if (!clock.usable_on(b.stamp, si)) return;
      granules->for_each_pinned_in(b.addr, b.size, [&](std::uintptr_t lo, std::size_t bytes) {
        const std::uintptr_t from = round_up(lo, block_index::unit);
        const std::uintptr_t to = round_down(lo + bytes, block_index::unit);
        if (to > from) bins.push_back({from, to - from, id, 0});
      });
    });
    std::sort(bins.begin(), bins.end(),
              [](const step_plan::bin& a, const step_plan::bin& b) { return a.base < b.base; });
    std::size_t in_bins = 0;
    for (const step_plan::bin& b : bins) in_bins += b.bytes;
    if (judge(peak > in_bins ? peak - in_bins : 0, true)) {
      wait(false);
      return false;
    }
    const std::size_t extra = round_up(plan.lay_out(bins), block_index::unit);
    if (const verdict v = judge(extra, false)) {
      wait(v.passes_mark);
      return false;
    }
    // Highest first: a split keeps the lower part in the node it cuts, so
    // the ids of bins lower in the same free block stay valid.
    for (std::size_t i = bins.size(); i-- > 0;) {
      const step_plan::bin& b = bins[i];
      if (b.used == 0) continue;
      const std::size_t size = round_up(b.used, block_index::unit);
      blocks.prepare();
      // The plan's ranges live as long as the plan: long-lived neighbours.
      plan_blocks.push_back(blocks.allocate_at(b.block, b.base, size, size, {0, /*long_lived=*/true}));
      granules->on_allocate(b.base, size);
    }
    std::uintptr_t base = 0;
    if (extra != 0) {
      base = place(extra, si, extra, /*plan_range=*/true);
      plan_blocks.push_back(base);
    }
    std::sort(plan_blocks.begin(), plan_blocks.end());
    plan.start(bins, base);
    log_noexcept(spdlog::level::debug, "arena step plan: started, {} bytes in holes of mapped spans and {} new",
                 plan.layout_bytes() > extra ? plan.layout_bytes() - extra : 0, extra);
    return true;
  } catch (const out_of_memory&) {
    free_plan_blocks();
    plan.abandon();
    return false;
  } catch (...) {
    free_plan_blocks();
    plan.abandon();
    throw;
  }
}

void arena_policy::impl::free_plan_blocks() noexcept {
  const free_stamp stamp = clock.on_free(plan.region_stream());
  for (const std::uintptr_t addr : plan_blocks) {
    const std::uint32_t id = blocks.take_live(addr);
    if (id == nil) continue;
    const std::size_t size = blocks.at(id).size;
    granules->on_free(addr, size, stamp, calls);
    blocks.release(id, stamp, clock);
  }
  plan_blocks.clear();
}

void arena_policy::impl::hand_over() {
  struct held_block {
    std::uintptr_t addr;
    std::size_t bytes, requested;
  };
  std::vector<held_block> live;
  live.reserve(plan.live_planned());
  plan.for_each_live([&](std::uintptr_t addr, std::size_t bytes, std::size_t requested) {
    live.push_back({addr, bytes, requested});
  });
  // Host memory for every block below first: once the ranges are freed,
  // each planned block must become the arena's, or its memory could be
  // handed out again while the caller holds it.
  blocks.prepare_for(live.size());
  free_plan_blocks();
  plan.region_freed();
  // Highest first: a split keeps the lower part in the node it cuts.
  std::sort(live.begin(), live.end(), [](const held_block& a, const held_block& b) { return a.addr > b.addr; });
  for (const held_block& h : live) {
    std::uint32_t id = nil;
    blocks.for_each_free_id([&](std::uint32_t i, const block_index::block& b) {
      if (b.addr <= h.addr && h.addr + h.bytes <= b.addr + b.size) id = i;
    });
    if (id == nil) continue;  // cannot happen: the ranges held every planned block
    // Its age counts from here: the plan kept no birth of its blocks.
    (void)blocks.allocate_at(id, h.addr, h.bytes, h.requested, {birth_now(), false});
    granules->on_allocate(h.addr, h.bytes);
  }
}

void arena_policy::impl::settle_left_plan() {
  if (plan.left_with_live()) {
    hand_over();
  } else if (plan.region_to_free()) {
    free_region();
  }
}

void arena_policy::impl::free_region() noexcept {
  free_plan_blocks();
  plan.region_freed();
}

free_result arena_policy::impl::free_planned(std::uintptr_t addr, std::size_t bytes, stream_t stream) noexcept {
  std::uint32_t si = free_stamp::none;
  try {
    si = clock.index_of(stream);
  } catch (const std::exception&) {
    // An untracked stream: below, its work is waited for.
  }
  const step_plan::freed f = plan.free_planned(addr, si);
  if (f.requested == 0) return {free_status::not_owned, 0};  // not a planned block
  ++calls;
  allocated -= f.bytes;
  if (si != plan.region_stream()) {
    // The region is reused in the order of the plan's stream: another
    // stream's work on this block must be done first.
    try {
      backend.synchronize_stream(stream);
    } catch (const std::exception& e) {
      logger().error("arena: synchronizing stream {} failed: {}", stream, e.what());
    }
  }
  note(addr, f.bytes, si, /*is_free=*/true, false);
  if (plan.region_to_free()) free_region();
  return {bytes == f.requested ? free_status::ok : free_status::size_mismatch, f.requested};
}

// Inline: on every allocation and free while the plan learns, so the
// common case (one event appended to the history) makes no call.
[[gnu::always_inline]] inline void arena_policy::impl::note(std::uintptr_t addr, std::size_t size, std::uint32_t si,
                                                             bool is_free, bool planned) noexcept {
  const auto units = static_cast<std::uint32_t>(size / block_index::unit);
  try {
    if (is_free) {
      plan.after_free(addr, units, si);
    } else {
      plan.after_allocate(addr, units, si, planned);
    }
  } catch (const std::exception&) {
    stop_planning();
  }
}

void arena_policy::impl::stop_planning() noexcept {
  plan.leave();
  plan.enable(false);
  if (plan.region_to_free()) free_region();
}

// The longest mapped part of a free block is its longest overlap with a
// run of mapped granules: free blocks and runs, both in address order, are
// walked together (O(blocks + spans log spans); reading every granule of
// every free block, the unmapped rest of the range included, took about
// 260 us a pool state on an 80 GiB device).
std::size_t arena_policy::impl::largest_free() const {
  std::size_t best = 0;
  if (!granules) {
    blocks.for_each_free([&](const block_index::block& b) { best = std::max(best, b.size); });
    return best;
  }
  const std::vector<std::pair<std::uintptr_t, std::uintptr_t>> runs = granules->mapped_run_list();
  std::size_t r = 0;  // the first run that ends after the blocks walked so far
  blocks.for_each_in_order([&](const block_index::block& b) {
    if (!b.is_free) return;
    const std::uintptr_t lo = b.addr, hi = b.addr + b.size;
    while (r < runs.size() && runs[r].second <= lo) ++r;
    for (std::size_t k = r; k < runs.size() && runs[k].first < hi; ++k) {
      best = std::max(best, std::min(hi, runs[k].second) - std::max(lo, runs[k].first));
    }
  });
  return best;
}

bool arena_policy::impl::live_over(std::uintptr_t addr, std::size_t bytes) const {
  const std::uintptr_t end = addr + bytes;
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> parts;
  blocks.for_each_in_order([&](const block_index::block& b) {
    if (b.is_free || b.addr >= end || b.addr + b.size <= addr) return;
    if (std::binary_search(plan_blocks.begin(), plan_blocks.end(), b.addr)) return;  // a plan's range
    parts.emplace_back(b.addr, b.addr + b.size);
  });
  plan.live_blocks_in(addr, end, parts);
  return util::covers(parts, addr, end);
}

out_of_memory arena_policy::impl::oom(std::size_t requested) const {
  oom_details d;
  d.requested = requested;
  d.reserved = granules ? granules->held_bytes() : range;
  d.cached_free = d.reserved - allocated;
  try {
    d.largest_free_block = largest_free();  // may allocate: the runs, sorted
  } catch (const std::exception&) {
    // Out of host memory too: the out_of_memory goes on without the figure.
  }
  try {
    const memory_info info = backend.get_memory_info();
    d.device_free = info.free;
    d.device_total = info.total;
  } catch (const std::exception&) {
    // Leave device figures at zero; the other fields still explain the failure.
  }
  out_of_memory e(d, "arena");
  // A cap the user set is the likeliest cause where the device had the
  // memory: say so (arena_size:1 read as "the allocator declined").
  if (capped_at != 0 && granules->held_bytes() + requested > capped_at) {  // capped_at: with granules only
    e.add_note(fmt::format("the arena_size option caps this arena at {} ({} bytes)", util::human_bytes(capped_at),
                           capped_at));
  }
  return e;
}

arena_policy::arena_policy(const config& cfg, device_backend& backend)
    : impl_(std::make_unique<impl>(cfg, backend)) {}

arena_policy::~arena_policy() = default;

bool arena_policy::uses_virtual_memory() const noexcept { return impl_->granules.has_value(); }

std::size_t arena_policy::range_bytes() const noexcept { return impl_->range; }

std::size_t arena_policy::pooled_bytes() const noexcept {
  return impl_->granules ? impl_->granules->pooled_bytes() : 0;
}

void* arena_policy::do_allocate(std::size_t bytes, stream_t stream) {
  impl& s = *impl_;
  if (s.paused) [[unlikely]] {
    throw state_error(fmt::format("arena: cannot allocate {} bytes while paused (resume first)", bytes));
  }
  ++s.calls;
  const std::size_t size = round_up(bytes, block_index::unit);
  const std::uint32_t si = s.clock.index_of(stream);
  // A request of 2^41 bytes or more has no unit count the plan can hold:
  // best fit (and its out-of-memory answer) takes it.
  if (s.plan.enabled() && size / block_index::unit <= UINT32_MAX) {
    const auto units = static_cast<std::uint32_t>(size / block_index::unit);
    step_plan::next n = s.plan.before_allocate(units, si);
    if (n == step_plan::next::need_region) {
      // The old layout's ranges, if any: the plan is laid out again.
      if (s.plan.regrowing() && s.plan.has_region()) s.free_plan_blocks();
      if (s.start_plan()) n = s.plan.before_allocate(units, si);
    }
    if (n == step_plan::next::place && s.plan.waiting() && !s.mapped_fit(size, si)) {
      // Between the steps of a plan that waits (an evaluation between
      // training steps): best fit would map memory for this block while
      // the plan's ranges sit idle; a gap of theirs serves it instead (the
      // live declm job with evaluations held 1.015 of its live bytes).
      n = s.plan.in_gap(units, si);
    }
    if (n == step_plan::next::serve) {
      const std::uintptr_t addr = s.plan.serve(units, bytes);
      s.note(addr, size, si, /*is_free=*/false, /*planned=*/true);
      s.allocated += size;
      return reinterpret_cast<void*>(addr);
    }
    s.settle_left_plan();
    std::uintptr_t addr = 0;
    try {
      addr = s.place(size, si, bytes);
    } catch (const out_of_memory&) {
      // The plan's region, idle between steps, is memory the arena may take.
      if (!s.plan.has_region()) throw;
      s.plan.leave();
      s.settle_left_plan();  // a waiting (or active) plan's free gaps become the arena's
      addr = s.place(size, si, bytes);
    }
    s.note(addr, size, si, /*is_free=*/false, /*planned=*/false);
    s.allocated += size;
    return reinterpret_cast<void*>(addr);
  }
  const std::uintptr_t addr = s.place(size, si, bytes);
  s.allocated += size;
  return reinterpret_cast<void*>(addr);
}

free_result arena_policy::do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept {
  impl& s = *impl_;
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  if (s.plan.in_region(addr)) {
    const free_result r = s.free_planned(addr, bytes, stream);
    if (r.status != free_status::not_owned) return r;
    // Not a planned block: one of the arena's own, unless it is one of the
    // plan's ranges (which no caller was given).
    if (std::binary_search(s.plan_blocks.begin(), s.plan_blocks.end(), addr)) return r;
  }
  // The size comes with the table's entry: the granules' counts below do
  // not wait for the block's node, which release() reads.
  const block_index::taken live = s.blocks.take_sized(addr);
  const std::uint32_t id = live.id;
  if (id == nil) return {free_status::not_owned, 0};
  ++s.calls;
  const std::size_t size = live.size;
  const std::size_t requested = s.blocks.at(id).requested;
  s.learn_lifetime(s.blocks.at(id));
  free_stamp stamp;
  try {
    stamp = s.clock.on_free(s.clock.index_of(stream));
  } catch (const std::exception&) {
    // No room to track a new stream: make the free complete instead.
    try {
      s.backend.synchronize_stream(stream);
    } catch (const std::exception& e) {
      logger().error("arena: synchronizing stream {} failed: {}", stream, e.what());
    }
  }
  bool trim = false;
  if (s.granules) {
    trim = s.granules->on_free(addr, size, stamp, s.calls) && s.granules->cached_bytes() > s.threshold &&
           *s.granules->oldest_cached() + s.release_delay <= s.calls;
  }
  s.blocks.release(id, stamp, s.clock);
  s.allocated -= size;
  if (s.plan.enabled()) s.note(addr, size, stamp.stream, /*is_free=*/true, false);
  if (trim) s.trim();
  return {bytes == requested ? free_status::ok : free_status::size_mismatch, requested};
}

void arena_policy::do_stream_ending(stream_t stream) { impl_->clock.end_stream(stream); }

std::optional<free_result> arena_policy::do_check_free(void* ptr, std::size_t bytes) const {
  const impl& s = *impl_;
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  // As do_deallocate looks: a planned block first; the plan's ranges are
  // live blocks of the arena that no caller was given.
  std::size_t requested = s.plan.in_region(addr) ? s.plan.live_requested(addr) : 0;
  if (requested == 0 && !std::binary_search(s.plan_blocks.begin(), s.plan_blocks.end(), addr)) {
    if (const std::uint32_t id = s.blocks.find_live(addr); id != nil) requested = s.blocks.at(id).requested;
  }
  if (requested == 0) return free_result{free_status::not_owned, 0};
  return free_result{bytes == requested ? free_status::ok : free_status::size_mismatch, requested};
}

std::size_t arena_policy::do_allocation_size(std::size_t bytes) const noexcept {
  return round_up(bytes, block_index::unit);
}

pool_state arena_policy::do_state() const {
  const impl& s = *impl_;
  pool_state p;
  p.allocated = s.allocated;
  p.reserved = s.granules ? s.granules->mapped_bytes() : s.range;
  p.cached_free = p.reserved > p.allocated ? p.reserved - p.allocated : 0;  // 0 while paused
  p.largest_free_block = s.largest_free();
  p.segments = s.granules ? s.granules->mapped_runs() : 1;
  p.retries = s.retries;
  if (s.granules) {
    const arena_detail::granule_map::detached d = s.granules->detached_exports();
    p.pause_detached_exports = d.handles;
    p.pause_detached_export_bytes = d.bytes;
  }
  p.plan = s.plan.stats();
  return p;
}

// The mapped runs of granules are the segments (the fallback block is one);
// the blocks of the index, clipped to them, tile them. A free block with
// pending frees is cut into its clean front, its dirty part (pending on the
// stream that freed it) and its clean back, as find_fit sees it.
memory_snapshot arena_policy::do_memory_map() const {
  const impl& s = *impl_;
  memory_snapshot snap;
  snap.available = true;
  snap.allocator = std::string(policy_name);
  const auto add_segment = [&](std::uintptr_t address, std::size_t bytes) {
    memory_segment seg;
    seg.address = address;
    seg.size = bytes;
    seg.pool = s.granules ? "mapped" : "fallback block";
    snap.segments.push_back(std::move(seg));
  };
  if (s.granules) {
    s.granules->for_each_mapped_run(add_segment);
  } else {
    add_segment(reinterpret_cast<std::uintptr_t>(s.raw), s.range);
  }
  if (snap.segments.empty()) return snap;

  std::size_t next_segment = 0;  // pieces come in address order
  const auto place = [&](std::uintptr_t lo, std::uintptr_t hi, const memory_block& kind) {
    auto& segs = snap.segments;
    while (next_segment < segs.size() && segs[next_segment].address + segs[next_segment].size <= lo) ++next_segment;
    for (std::size_t i = next_segment; i < segs.size() && segs[i].address < hi; ++i) {
      const std::uintptr_t from = std::max(lo, segs[i].address);
      const std::uintptr_t to = std::min(hi, segs[i].address + segs[i].size);
      if (from >= to) continue;
      memory_block piece = kind;
      piece.address = from;
      piece.size = to - from;
      segs[i].blocks.push_back(piece);
    }
  };
  // The plan's ranges are live blocks of the index; what is live in them is
  // the planned blocks, the rest is free (for the plan's step).
  struct planned {
    std::uintptr_t addr;
    std::size_t bytes, requested;
  };
  std::vector<planned> in_plan;
  if (!s.plan_blocks.empty()) {
    s.plan.for_each_live([&](std::uintptr_t a, std::size_t b, std::size_t r) { in_plan.push_back({a, b, r}); });
    std::sort(in_plan.begin(), in_plan.end(), [](const planned& x, const planned& y) { return x.addr < y.addr; });
  }
  s.blocks.for_each_in_order([&](const block_index::block& b) {
    const std::uintptr_t end = b.addr + b.size;
    if (!b.is_free && std::binary_search(s.plan_blocks.begin(), s.plan_blocks.end(), b.addr)) {
      std::uintptr_t at = b.addr;
      auto it = std::lower_bound(in_plan.begin(), in_plan.end(), b.addr,
                                 [](const planned& x, std::uintptr_t a) { return x.addr < a; });
      for (; it != in_plan.end() && it->addr < end; ++it) {
        if (it->addr > at) place(at, it->addr, memory_block{.use = block_use::free});
        place(it->addr, it->addr + it->bytes, memory_block{.requested = it->requested, .use = block_use::live});
        at = it->addr + it->bytes;
      }
      if (at < end) place(at, end, memory_block{.use = block_use::free});
      return;
    }
    if (!b.is_free) {
      place(b.addr, end, memory_block{.requested = b.requested, .use = block_use::live});
      return;
    }
    if (b.stamp.stream == free_stamp::none || s.clock.complete(b.stamp)) {
      place(b.addr, end, memory_block{.use = block_use::free});
      return;
    }
    const std::uintptr_t dirty_lo = std::clamp(b.dirty_lo, b.addr, end);
    const std::uintptr_t dirty_hi = std::clamp(b.dirty_hi, dirty_lo, end);
    place(b.addr, dirty_lo, memory_block{.use = block_use::free});
    place(dirty_lo, dirty_hi, memory_block{.use = block_use::pending, .stream = s.clock.stream_of(b.stamp.stream)});
    place(dirty_hi, end, memory_block{.use = block_use::free});
  });
  return snap;
}

void arena_policy::do_release_cached() {
  impl& s = *impl_;
  if (!s.granules) return;
  s.plan.leave();  // the region goes back once no planned block is live
  if (s.plan.region_to_free()) s.free_region();
  s.clock.synchronize_all();
  s.granules->release_unused();
}

bool arena_policy::do_pause(pause_keep keep) {
  impl& s = *impl_;
  if (!s.granules) {
    throw invalid_argument("arena: pause needs virtual memory; this arena is one raw block (the fallback)");
  }
  if (s.paused) throw state_error("arena: pause: already paused");
  s.clock.synchronize_all();
  s.paused = true;  // before the map's calls: a failure midway may leave spans paused
  try {
    if (!s.granules->pause(keep == pause_keep::host, nullptr)) {
      s.paused = false;
      return false;
    }
  } catch (...) {
    s.paused = s.granules->paused();  // the map mapped back what it could
    throw;
  }
  return true;
}

bool arena_policy::do_resume() {
  impl& s = *impl_;
  if (!s.paused) throw state_error("arena: resume: not paused");
  if (!s.granules->resume(nullptr)) return false;
  s.paused = false;
  return true;
}

bool arena_policy::do_paused() const { return impl_->paused; }

shared_memory arena_policy::do_share(void* ptr, std::size_t bytes) const {
  const impl& s = *impl_;
  const auto a = reinterpret_cast<std::uintptr_t>(ptr);
  const auto base = reinterpret_cast<std::uintptr_t>(s.raw);
  bytes = std::max<std::size_t>(bytes, 1);
  if (a < base || a - base >= s.range || bytes > s.range - (a - base)) {
    throw invalid_argument(fmt::format("arena: share({}, {}): not memory of this arena", ptr, bytes));
  }
  // Free or cached memory would go to the next allocation while another
  // process used it.
  if (!s.live_over(a, bytes)) {
    throw invalid_argument(
        fmt::format("arena: share({}, {}): not live memory of this arena (a free or cached range)", ptr, bytes));
  }
  shared_memory out;
  if (!s.granules) {  // the fallback block: one raw allocation
    out.base = s.raw;
    out.bytes = s.range;
    out.offset = a - base;
    return out;
  }
  if (s.paused) throw state_error(fmt::format("arena: share({}, {}): the arena is paused", ptr, bytes));
  const std::vector<arena_detail::granule_map::span_view> spans = s.granules->spans_under(a, bytes);
  if (spans.empty()) {
    throw invalid_argument(fmt::format("arena: share({}, {}): not live memory of this arena", ptr, bytes));
  }
  out.base = reinterpret_cast<void*>(spans.front().addr);
  out.offset = a - spans.front().addr;
  out.handles.reserve(spans.size());
  for (const auto& span : spans) {
    const exported_handle e = s.backend.export_physical(span.handle);
    out.handles.push_back({e.fd, e.serial, span.bytes});
    out.bytes += span.bytes;
  }
  return out;
}

void arena_policy::do_enable_peer_access(int peer) {
  impl& s = *impl_;
  if (peer < 0 || peer == s.backend.device()) {
    throw invalid_argument(fmt::format("arena: enable_peer_access({}): a peer is another device's ordinal", peer));
  }
  if (!s.granules) {  // the fallback block is a plain device allocation: the runtime's peer access covers it
    s.backend.check_access_peer(peer);
    return;
  }
  const bool added = std::find(s.backend.access_peers().begin(), s.backend.access_peers().end(), peer) ==
                     s.backend.access_peers().end();
  s.backend.add_access_peer(peer);  // every later set_access grants it
  try {
    s.granules->grant_access_again();
  } catch (...) {
    // A peer whose grants fail must not make every later mapping fail: the
    // backend forgets it (spans already granted keep their access).
    if (added) s.backend.remove_access_peer(peer);
    throw;
  }
}

std::size_t arena_policy::paused_bytes() const noexcept {
  return impl_->granules ? impl_->granules->paused_bytes() : 0;
}

device_backend& arena_policy::do_backend() const noexcept { return impl_->backend; }

std::string_view arena_policy::do_name() const noexcept { return policy_name; }

}  // namespace fragctl
