// The arena's online plan of a repeating step (docs/policies/arena.md,
// "The steady-state plan").
//
// A training or inference loop repeats itself: once its shapes stop
// changing, every step asks for the same sizes in the same order and frees
// them at the same points. Best fit spreads such a step over more address
// space than is ever live at once, so the arena, holding only about the live
// bytes, re-stitches pages to follow the blocks every step (thousands of
// driver calls per step on a decoder LM). The plan removes that: it learns
// the step and serves it from ranges laid out for it, mapped once.
//
// Learning. Every allocation and free is appended to a history (address,
// size, stream). Each time the allocations grew by an eighth (at least 256),
// the history's allocation *shapes* are searched for a period. A shape is
// the allocation's stream and the allocations freed since the one before
// it, each named by how many allocations back it was made, not its size:
// the steps of one loop at other sequence lengths or image sizes have the
// same shapes (a family). P is a period when the last 2P shapes are two
// equal halves (each P tried in O(1) by the shapes' prefix hashes, O(n)
// a search, an equal pair of hashes confirmed shape by shape) and the live
// bytes come back over it to within 1/256 of the period's rise (a step
// frees what it allocates, but what outlives it, such as its input batch,
// may differ in size from step to step; a run of layers, whose forward
// keeps each layer's output, does not come back); the shortest such P. The
// step's phase is the first allocation after the period's highest point
// with the live bytes back at its low: between two steps, where only what
// outlives a step (parameters, optimizer state) is live. No step marker is
// needed.
//
// Planning. The period that ends at that phase is one step. Its blocks that
// are freed within it, on the stream that allocated them, are *planned*,
// each at the largest size seen at its point of the step over the repeats
// in the history; the others (what outlives the step) are not. A plan is
// started only if best fit made at least as many driver calls in the last
// repeat (later: in the step that just ended, or over the steps in a row at
// its shape that the plan would have served: as many allocations, the same
// first allocation, each planned block no larger than its slot) as mapping
// the new range would cost, and only under the memory held's high-water
// mark; else it waits for the next step start (defer). A step start is
// found by the live bytes (back at the step's low after rising a quarter
// of the way above it), not by counting allocations: a step of another
// length may come between the plan's repeats. At the step start the
// planned blocks, each live over an interval of allocation indices, are
// laid out greedily by size, largest first, each at the lowest offset where
// it overlaps no block placed before it whose interval meets its own: in the
// arena's free holes inside spans live blocks touch (the *bins*, memory no
// steal could move), then in one new range (lay_out). The used bins and the
// new range are the plan's ranges: live blocks of the arena, mapped once,
// that no trim or steal touches. A plan that would raise the memory held
// above its high-water mark is not started (the arena checks).
//
// Serving. From then on, allocation t of the step is served at its planned
// address when its stream is the plan's, its size at most its slot's, and
// every planned free due before it has happened; a free at an address of a
// live planned block is that block's. Reuse within the ranges is on one
// stream, so stream order makes it safe at once. A step whose first
// allocation is larger than its slot is laid out again before anything of
// it is live (resize_for: each slot's size following the first
// allocation's as a power fitted on the two largest steps), and may raise
// the memory held by as much as its planned live bytes grow, if its
// history bears the fit out: the same powers give the third largest
// step's sizes to within 1/8 where there is one, and the step's first
// allocation is no further above the largest than the steps the fit holds
// for lie apart, and a sixteenth (a step whose first allocation varies on
// its own, as a generation request's prompt embedding does beside its
// batch and cache, is not predicted by two steps). A layout not borne out
// may not raise the memory held; refused, the plan learns anew with the
// step in its history. Anything else
// that differs (a larger block later in the step, a free later or earlier
// than planned, another stream) takes the step off the plan.
//
// Waiting. A step of another shape (a short sequence whose attention
// allocates otherwise: a free out of line, another stream, or a block more
// than 16 times its slot) that departs after the plan served whole steps
// does not end it: the plan keeps its ranges and its live blocks, serves
// the rest of the step's allocations on its stream above the step's floor
// in the ranges' free gaps (best fit among the gaps around the blocks live
// there), and is back at the next step start (found by the live bytes, as
// pending finds it) with no block of its own live. Eight departures with no
// whole step between, an allocation no gap holds, or a block up to 16 times
// its slot (a larger step) leave it: from there the arena places blocks as
// before; blocks still live in the ranges are handed to the arena at their
// addresses (left_with_live), the ranges are freed back to the arena
// (their pages become cached spans, reused by stitching) and learning goes
// on. Unplanned allocations in a planned step go through the arena as
// before. At the floor (between steps: an evaluation between training
// steps, the next batch) a waiting plan's blocks go to best fit, unless
// best fit would have to map memory for one: then a gap of the idle ranges
// serves it if one holds it (the arena asks, in_gap), not new memory beside
// them.
//
// Not thread-safe, like the arena. The hot calls make no backend call and
// no heap allocation beyond the history's growth (amortized); the map of
// live planned blocks is reserved when a plan is made.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "allocator_policies/arena/block_index.hpp"
#include "allocator_policies/arena/layout.hpp"
#include "fragctl/device_allocator.hpp"

namespace fragctl::arena_detail {

class step_plan {
 public:
  /// What the plan did so far (pool_state::plan).
  using figures = step_plan_state;

  /// What the arena should do with the allocation at hand.
  enum class next : std::uint8_t {
    place,       ///< its own placement (not planned)
    serve,       ///< serve() gives its address
    need_region  ///< a plan starts here: map region_bytes() and call start(base), then serve()
  };

  step_plan() = default;

  [[nodiscard]] bool enabled() const noexcept { return enabled_; }
  void enable(bool on) noexcept { enabled_ = on; }

  /// Before an allocation of `units` (512-byte units) on stream `stream`.
  /// Inline while learning (every allocation until a plan is found).
  [[nodiscard]] next before_allocate(std::uint32_t units, std::uint32_t stream) noexcept {
    if (mode_ == mode::learning || mode_ == mode::draining) return next::place;
    return before_allocate_planning(units, stream);
  }
  /// The address of the planned allocation before_allocate() answered serve
  /// for: `units` 512-byte units (at most its slot's), `requested` bytes.
  [[nodiscard]] std::uintptr_t serve(std::uint32_t units, std::size_t requested);
  /// After any allocation (planned or not), for the history.
  void after_allocate(std::uintptr_t addr, std::uint32_t units, std::uint32_t stream, bool planned) {
    if (!planned) figures_.unplanned_bytes += std::uint64_t{units} * block_index::unit;
    record(addr, units, stream, false);
    if (mode_ == mode::learning && allocs_ >= next_check_) [[unlikely]] (void)detect();
  }

  /// Whether `addr` may be a planned block (within the hull of the plan's ranges).
  [[nodiscard]] bool in_region(std::uintptr_t addr) const noexcept {
    return addr - region_ < region_bytes_;  // unsigned: false below the region
  }
  /// Frees the planned block at `addr` (in_region) on `stream`. Returns its
  /// requested size, or 0 when no planned block starts there. `same_stream`
  /// is false when the caller must wait for the free before the region's
  /// memory is reused (another stream than the plan's).
  struct freed {
    std::size_t bytes = 0;      // rounded
    std::size_t requested = 0;  // 0: not a live planned block
  };
  [[nodiscard]] freed free_planned(std::uintptr_t addr, std::uint32_t stream) noexcept;
  /// The requested size of the live planned block at `addr`; 0 when none starts there.
  [[nodiscard]] std::size_t live_requested(std::uintptr_t addr) const noexcept {
    const auto it = live_.find(addr);
    return it == live_.end() ? 0 : it->second.requested;
  }
  /// Appends the live planned blocks that meet [lo, hi) to `out`, as
  /// [start, end) ranges (O(live planned blocks)).
  void live_blocks_in(std::uintptr_t lo, std::uintptr_t hi,
                      std::vector<std::pair<std::uintptr_t, std::uintptr_t>>& out) const;
  /// After any free the arena made itself (not a planned block), for the history.
  void after_free(std::uintptr_t addr, std::uint32_t units, std::uint32_t stream) {
    record(addr, units, stream, true);
  }

  /// A free range the plan may lay blocks out in (mapped free memory of the
  /// arena at the step's start), and how much of it the layout used.
  struct bin {
    std::uintptr_t base = 0;
    std::uint64_t bytes = 0;
    std::uint32_t block = 0;  // the arena's free block it lies in
    std::uint64_t used = 0;   // set by lay_out: the layout's extent in it
  };
  /// Lays the step's planned blocks out in `bins` (tried in order) and, for
  /// what fits none, in a new range after them; returns that range's bytes
  /// (0: the bins hold everything). Sets each bin's `used`.
  [[nodiscard]] std::uint64_t lay_out(std::vector<bin>& bins);
  /// The most bytes of planned blocks live at once in the step (what any
  /// layout holds at least; O(step), before the costlier lay_out).
  [[nodiscard]] std::uint64_t live_peak() const;
  /// The ranges are the arena's now (the used bins, and the new range at
  /// `base` if lay_out asked for one): the plan begins with this allocation.
  void start(const std::vector<bin>& bins, std::uintptr_t base);
  /// Whether the pending plan is the current one laid out again for a
  /// larger step (the old ranges are the caller's to free before mapping
  /// the new ones), and the old layout's bytes and live peak, to hold the
  /// new one to the same packing.
  [[nodiscard]] bool regrowing() const noexcept { return regrowing_; }
  /// Whether the sizes the plan was last laid out again with are borne out
  /// by its history (resize_for): the fit of the two largest repeats gives
  /// the third largest's sizes to within 1/8 where there is a third, and
  /// the step's first allocation is no further above the largest than the
  /// repeats the fit holds for lie apart, and a sixteenth. Only then may a
  /// regrow raise the memory held above its high-water mark.
  [[nodiscard]] bool regrow_borne_out() const noexcept { return regrow_borne_out_; }
  [[nodiscard]] std::uint64_t layout_bytes() const noexcept { return layout_bytes_; }
  [[nodiscard]] std::uint64_t layout_live() const noexcept { return layout_live_; }
  [[nodiscard]] std::uint64_t previous_layout_bytes() const noexcept { return prev_layout_bytes_; }
  [[nodiscard]] std::uint64_t previous_layout_live() const noexcept { return prev_layout_live_; }
  /// The region could not be had: forget the plan.
  void abandon() noexcept;
  /// The plan would not pay for its start, or would raise the memory held
  /// above its high-water mark: keep it for the next step's start. With
  /// `back_off` (in a run of steps at one shape, a laid-out plan that
  /// passes the mark, which the next steps at that shape will most likely
  /// pass too), the next 1, 2, 4, ... up to 64 step starts at that shape
  /// are not judged after the 1st, 2nd, 3rd, ... such refusal in a row, so
  /// that a long run lays its step out about once in 64 steps, not at
  /// every start (a layout of kvgen's step takes 36 ms); a step of another
  /// shape is judged at its start.
  void defer(bool back_off = false) noexcept;
  /// Whether the plan's ranges are to be given back: the plan was left and
  /// no planned block is live. The caller frees them and calls region_freed().
  [[nodiscard]] bool region_to_free() const noexcept {
    return mode_ == mode::draining && live_planned_ == 0 && region_bytes_ != 0;
  }
  /// Whether the plan was left while planned blocks are live: the caller
  /// makes them blocks of its own (hand_over in the arena), frees the
  /// ranges and calls region_freed(), so that the rest of the ranges serves
  /// the step's other blocks at once instead of new memory.
  [[nodiscard]] bool left_with_live() const noexcept {
    return mode_ == mode::draining && live_planned_ != 0 && region_bytes_ != 0;
  }
  /// Calls f(addr, bytes, requested) for every live planned block, in no order.
  template <class F>
  void for_each_live(F&& f) const {
    for (const auto& [addr, ls] : live_) f(addr, ls.bytes, ls.requested);
  }
  /// Whether the plan holds ranges of the arena.
  [[nodiscard]] bool has_region() const noexcept { return region_bytes_ != 0; }
  [[nodiscard]] std::uint32_t region_stream() const noexcept { return stream_; }
  /// Leaves the plan now (release_cached, an out-of-memory): region_to_free()
  /// then names the region as soon as no planned block is live.
  void leave() noexcept;
  void region_freed() noexcept;

  /// Driver memory calls so far, read at each step start of a plan.
  void set_call_counter(std::uint64_t (*read)(const void*), const void* ctx) noexcept {
    read_calls_ = read;
    read_ctx_ = ctx;
  }

  /// Driver memory calls the job made over the detected step's last repeat
  /// (to within 256 allocations): what best fit costs a step, against what
  /// starting the plan would cost.
  [[nodiscard]] std::uint64_t recent_step_calls() const noexcept { return recent_calls_; }
  /// The driver calls best fit made over the steps in a row, up to the one
  /// that just ended, that the plan would have served whole (as many
  /// allocations as its step, each on its slot's stream and no larger than
  /// its slot) at the shape of that one (the same first allocation: the
  /// job's input at one shape; its inner sizes may still vary within the
  /// slots, as a mixture of experts' routing does). Best fit makes them
  /// again at each such step, so a plan whose range costs no more calls
  /// than they add up to pays for itself (rent or buy; at worst, a job
  /// that changes shape just after the plan starts, it spends twice what
  /// best fit alone would). A job whose shapes vary per step seldom
  /// repeats one for long, and is judged by the last step alone.
  [[nodiscard]] std::uint64_t shape_run_calls() const noexcept { return run_calls_; }
  /// Whether the last start was judged on more than one step at that shape.
  [[nodiscard]] bool in_shape_run() const noexcept { return run_steps_ > 1; }
  /// A start refused (start_plan): counted by reason in the figures.
  void start_refused(bool for_calls, bool for_memory) noexcept {
    figures_.starts_refused_calls += for_calls ? 1 : 0;
    figures_.starts_refused_memory += for_memory ? 1 : 0;
  }

  [[nodiscard]] const figures& stats() const noexcept { return figures_; }
  [[nodiscard]] bool serving() const noexcept { return mode_ == mode::active; }
  /// Whether the plan waits (left for a step of another shape, its ranges kept).
  [[nodiscard]] bool waiting() const noexcept { return mode_ == mode::waiting; }
  /// Waiting, on the plan's stream: serve() gives a gap of the ranges that
  /// holds `units` (at the step's floor too), else place; nothing else changes.
  [[nodiscard]] next in_gap(std::uint32_t units, std::uint32_t stream) noexcept;
  /// Planned blocks live now.
  [[nodiscard]] std::uint32_t live_planned() const noexcept { return live_planned_; }

 private:
  // waiting: left for a step of another shape with the ranges kept, back
  // on the plan at the next step start.
  enum class mode : std::uint8_t { learning, pending, active, waiting, draining };
  struct event {
    std::uintptr_t addr;
    std::uint32_t units;
    std::uint16_t stream;
    std::uint8_t is_free;
  };
  /// One allocation of the planned step.
  struct slot {
    std::uint32_t units;   // the largest size seen at this point of the step (512-byte units)
    std::uint32_t hi, lo;  // its sizes in the repeats of the largest and next largest first allocation
    std::uint32_t stream;
    std::uint64_t offset;  // in its bin (lay_out), then its address (start); planned only
    std::uint32_t bin;     // planned only
    std::uint32_t due;     // gap (allocation index) its free is due before; planned only
    std::uint32_t third;   // its size in the repeat of the third largest first allocation (while x_third_ != 0)
    bool planned;
  };
  /// Whether allocation `t` of a step, of `units`, is larger than the plan
  /// serves at slot `s`: a planned slot's size, or the step's first
  /// allocation's (an unplanned block goes to best fit at any size).
  [[nodiscard]] static bool outgrows(const slot& s, std::uint32_t t, std::uint32_t units) noexcept {
    return units > s.units && (s.planned || t == 0);
  }
  struct live_slot {
    std::uint32_t t;
    std::size_t bytes;
    std::size_t requested;
  };

  /// No index: an allocation not freed yet (history_scan), a live planned
  /// block served outside the step's slots (live_slot).
  static constexpr std::uint32_t never = UINT32_MAX;
  /// History events kept at most; beyond it learning starts over.
  static constexpr std::size_t history_cap = std::size_t{1} << 20;
  /// Appends an event to the history. Inline but for what happens once in
  /// 256 allocations (the driver call mark) or at the cap (record_rare).
  void record(std::uintptr_t addr, std::uint32_t units, std::uint32_t stream, bool is_free) {
    if (history_.size() >= history_cap || (!is_free && allocs_ % 256 == 0)) [[unlikely]] record_rare(is_free);
    live_units_ += is_free ? -std::int64_t{units} : std::int64_t{units};
    history_.push_back({addr, units, static_cast<std::uint16_t>(stream), static_cast<std::uint8_t>(is_free)});
    if (!is_free) ++allocs_;
  }
  /// record()'s rare part, before the event is appended: learning starts
  /// over at the history's cap; the driver call mark every 256 allocations.
  void record_rare(bool is_free);
  /// The live bytes are back at the step's floor (within its slack).
  [[nodiscard]] bool at_floor() const noexcept { return live_units_ <= floor_ + floor_slack_; }
  /// Whether an allocation on `stream` comes at a step start: on the plan's
  /// stream, at the floor, after the live bytes rose above floor_ +
  /// floor_arm_ (noted in risen_, which the caller clears when it starts).
  [[nodiscard]] bool at_step_start(std::uint32_t stream) noexcept {
    if (live_units_ > floor_ + floor_arm_) risen_ = true;
    return risen_ && at_floor() && stream == stream_;
  }
  /// before_allocate() past learning: a plan pending or active.
  [[nodiscard]] next before_allocate_planning(std::uint32_t units, std::uint32_t stream) noexcept;
  /// Looks for a period in the history and plans it; whether a plan is pending.
  bool detect();
  /// Leaves the plan. `larger`: the step asked for more than its slot (a
  /// larger member of the family), not for another shape.
  /// Off the layout within a step, for `why` (a fixed text, for the log).
  void off_plan(bool larger, const char* why) noexcept;
  /// At the start of a step whose first allocation (`units`) is larger than
  /// any of its repeats so far: sizes every slot for it, from how each
  /// slot's size followed the first allocation's over the two largest
  /// repeats; false when the history holds no second size to follow.
  bool resize_for(std::uint32_t units) noexcept;
  void step_boundary() noexcept;
  /// Where a repeat whose first allocation is `x` units ranks among the
  /// three largest kept (x_hi_, x_lo_, x_third_): 0, 1 or 2, or -1 when
  /// it is none of them (as large as one, or smaller than the third).
  [[nodiscard]] int rank_among_largest(std::uint32_t x) const noexcept {
    if (x > x_hi_) return 0;
    if (x < x_hi_ && x > x_lo_) return 1;
    if (x < x_lo_ && x > x_third_) return 2;
    return -1;
  }
  /// Puts `v` at `rank` (rank_among_largest) of the three largest's values
  /// `hi`, `lo`, `third`, moving those below it down one.
  template <class T>
  static void move_in(int rank, T& hi, T& lo, T& third, T v) noexcept {
    if (rank <= 1) third = lo;
    if (rank == 0) lo = hi;
    (rank == 0 ? hi : rank == 1 ? lo : third) = v;
  }

  /// What detect() reads of the history, for each allocation: its key, its
  /// event, its free's event (never: not freed yet) and the live units
  /// before it. A fold over the history from its start, kept between calls
  /// and extended by the events recorded since (cleared with the history),
  /// so each event is read once, not at every search.
  struct history_scan {
    std::size_t events = 0;  // history events folded in
    std::int64_t live = 0;
    // An allocation's key is its shape, not its size: its stream and the
    // allocations freed since the one before it, each named by how many
    // allocations back it was made (hashed in order into `frees`). Steps of
    // one loop at other sequence lengths (image sizes, batch sizes) have the
    // same keys; the sizes are the family's, taken at their largest.
    std::uint64_t frees = 0;
    std::vector<std::uint64_t> keys;
    /// prefix[i]: the polynomial hash (mod 2^64, base hash_base) of keys
    /// [0, i); one more entry than keys once there is one.
    std::vector<std::uint64_t> prefix;
    std::vector<std::uint32_t> at, freed_at;
    std::vector<std::int64_t> live_before;
    address_table open;  // allocations not freed yet, by address
  };
  /// Folds the events recorded since the last call into scan_.
  void extend_scan();
  /// The base of the keys' prefix hashes: odd, so no power of it is 0 mod
  /// 2^64 and a key far back still counts in a hash.
  static constexpr std::uint64_t hash_base = 0x100000001b3ULL;

  bool enabled_ = true;
  mode mode_ = mode::learning;
  std::vector<event> history_;
  history_scan scan_;
  std::uint64_t allocs_ = 0;       // allocations in history_
  std::uint64_t next_check_ = 256;
  static constexpr std::uint64_t initial_min_period = 32;
  std::uint64_t min_period_ = initial_min_period;  // raised past a period whose plan failed
  // The plan.
  std::vector<slot> slots_;
  std::vector<std::uint32_t> due_in_gap_;  // planned frees due in each gap [0, P]
  std::vector<std::uint32_t> seen_;        // the sizes of the step being served, by slot
  using item = layout_item;  // lives over allocations [t, due) of the step
  std::vector<item> items_;  // the planned blocks, for lay_out
  std::uint64_t plan_extent_ = 0;
  std::uint32_t x_hi_ = 0, x_lo_ = 0;  // the largest and next largest first allocation of a repeat (units)
  std::uint32_t x_third_ = 0;          // the third largest (0: none)
  bool regrowing_ = false;
  bool regrow_borne_out_ = false;      // the last resize_for's fit predicted the third largest repeat
  std::uint64_t layout_bytes_ = 0, layout_live_ = 0;            // of the last lay_out
  std::uint64_t prev_layout_bytes_ = 0, prev_layout_live_ = 0;  // of the layout before a regrow
  std::uint64_t plan_period_ = 0;
  // Pending: the plan starts at the next step start, the first allocation
  // with the live units at most floor_ + floor_slack_ after they rose above
  // floor_ + floor_arm_.
  std::int64_t live_units_ = 0;  // live 512-byte units (all allocations seen)
  std::int64_t floor_ = 0, floor_slack_ = 0, floor_arm_ = 0;
  bool risen_ = false;
  std::uint64_t pending_until_ = 0;  // pending: abandoned past this allocation with the live bytes never at the floor
  /// Periods a pending plan that served steps waits for the live bytes to
  /// come back to its floor before it is abandoned.
  static constexpr std::uint64_t pending_periods = 8;
  void rearm_pending() noexcept { pending_until_ = allocs_ + pending_periods * plan_period_; }
  bool step_seen_ = false;               // a step start was seen since the plan was found
  std::uint64_t seen_start_calls_ = 0;   // driver calls at that step start
  std::uint32_t stream_ = 0;
  // Serving.
  std::uintptr_t region_ = 0;
  std::size_t region_bytes_ = 0;  // 0 while no region is mapped: in_region() false
  std::uint32_t t_ = 0;           // next allocation's index in the step
  std::uint32_t freed_in_gap_ = 0;
  std::uint32_t live_planned_ = 0;
  std::uint64_t step_start_calls_ = 0;
  std::uint64_t plan_steps_ = 0;  // steps the current plan served whole
  // Departures to waiting since the plan last served a whole step; at
  // max_departures the plan is left for good (its ranges given back).
  std::uint32_t departures_ = 0;
  // Waiting: the ranges [lo, hi), sorted, and the blocks live in them, sorted.
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges_, occupied_;
  std::uintptr_t waiting_addr_ = 0;  // where serve() puts the allocation at hand
  [[nodiscard]] std::uintptr_t find_gap(std::uint64_t bytes) const noexcept;
  /// Waiting, within a step, on the plan's stream: serve when a gap of the
  /// ranges holds `units` (find_gap), else place.
  [[nodiscard]] next in_ranges(std::uint32_t units, std::uint32_t stream) noexcept;
  static constexpr std::uint32_t max_departures = 8;
  absl::flat_hash_map<std::uintptr_t, live_slot> live_;
  std::uint64_t (*read_calls_)(const void*) = nullptr;
  std::vector<std::uint64_t> call_marks_;  // [k]: driver calls before history allocation 256k
  std::uint64_t recent_calls_ = 0;         // recent_step_calls()
  // shape_run_calls(): pending, at each step start, the step that just
  // ended (from the last start: history event run_start_event_, its first
  // allocation run_first_ units) and the one before it (run_prev_first_).
  void note_shape_run(std::uint32_t first_units) noexcept;
  void forget_back_off() noexcept {
    skip_starts_ = 0;
    back_offs_ = 0;
  }
  void forget_shape_run() noexcept {
    run_steps_ = 0;
    run_calls_ = 0;
    forget_back_off();
  }
  static constexpr std::size_t no_event = SIZE_MAX;
  std::size_t run_start_event_ = no_event;  // history_.size() at the last step start
  std::uint32_t run_first_ = 0;         // the first allocation's units of the step begun there
  std::uint32_t run_prev_first_ = 0;    // and of the step before it
  std::uint32_t run_steps_ = 0;         // steps in the run (0: none measured yet)
  std::uint64_t run_calls_ = 0;
  std::uint32_t skip_starts_ = 0;       // step starts left unjudged (defer's back_off)
  std::uint32_t back_offs_ = 0;         // refusals in a row that backed off
  static constexpr std::uint32_t max_back_offs = 7;  // at most 2^6 starts left out
  const void* read_ctx_ = nullptr;
  figures figures_;
};

}  // namespace fragctl::arena_detail
