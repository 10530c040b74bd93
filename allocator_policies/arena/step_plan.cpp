#include "allocator_policies/arena/step_plan.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "fragctl/log.hpp"

namespace fragctl::arena_detail {

namespace {

/// An allocation more than this many times its slot's size is taken for a
/// step of another shape (the plan waits), not a larger one (it is left).
constexpr std::uint32_t other_shape_growth = 16;

}  // namespace

step_plan::next step_plan::before_allocate_planning(std::uint32_t units, std::uint32_t stream) noexcept {
  switch (mode_) {
    case mode::learning:
    case mode::draining:
      return next::place;
    case mode::waiting:
      // Left for a step of another shape, its ranges kept: back on the plan
      // at the next step start (found as pending finds it) with no planned
      // block live.
      if (!at_step_start(stream) || live_planned_ != 0) {
        // Within the step, on the plan's stream: in the ranges' free memory
        // if a gap holds it (no new memory for the other shape), else best fit.
        return in_ranges(units, stream);
      }
      risen_ = false;
      mode_ = mode::active;
      t_ = 0;
      freed_in_gap_ = 0;
      step_start_calls_ = read_calls_ != nullptr ? read_calls_(read_ctx_) : 0;
      log_noexcept(spdlog::level::debug, "arena step plan: back on its layout at allocation {}", allocs_);
      break;
    case mode::pending:
      // The plan starts at a step's start: the first allocation on its
      // stream with the live bytes back at the step's floor after they
      // rose well above it (a step of another length between the plan's
      // repeats moves the start; counting allocations would miss it).
      if (at_floor()) {
        rearm_pending();
      } else if (plan_steps_ != 0 && allocs_ > pending_until_) {
        // A plan that served steps, then eight of its periods without the
        // live bytes back at its floor: what outlives a step grew, and no
        // step start will be found again. Learn anew. (One that never
        // served waits: giving up the wrong early plans of a job again and
        // again costs more than it saves; the live lora trace, 2 ms lag:
        // 19,788 calls against 15,049.)
        abandon();
        next_check_ = allocs_;
        return next::place;
      }
      if (!at_step_start(stream)) return next::place;
      risen_ = false;
      if (read_calls_ != nullptr) {
        // What best fit made in the step that just ended, once one has
        // ended since the plan was found (before: its last repeat's).
        const std::uint64_t calls = read_calls_(read_ctx_);
        if (step_seen_) recent_calls_ = calls - seen_start_calls_;
        seen_start_calls_ = calls;
      }
      note_shape_run(units);
      step_seen_ = true;
      if (skip_starts_ != 0) {
        // Backed off (defer): at the same shape the answer is the same.
        if (in_shape_run() && run_first_ == run_prev_first_) {
          --skip_starts_;
          return next::place;
        }
        forget_back_off();
      }
      if (units > slots_[0].units && !regrowing_) {
        // The step about to be planned is larger than the layout: sized
        // for it as a larger step of a plan is (it may grow the memory
        // held as its live bytes grow), or, by sizes the history cannot
        // foresee, planned once it is in the history.
        std::uint64_t live = 0;
        try {
          live = live_peak();
        } catch (...) {  // out of host memory: best fit instead of std::terminate
          abandon();
          next_check_ = allocs_ + plan_period_;
          return next::place;
        }
        if (!resize_for(units)) {
          abandon();
          next_check_ = allocs_ + plan_period_;
          return next::place;
        }
        prev_layout_bytes_ = 0;
        prev_layout_live_ = live;
        regrowing_ = true;
      }
      return next::need_region;
    case mode::active:
      break;
  }
  if (t_ == plan_period_) step_boundary();
  if (mode_ != mode::active) return next::place;
  const slot& s = slots_[t_];
  if (s.stream != stream || freed_in_gap_ != due_in_gap_[t_]) {
    off_plan(false, s.stream != stream ? "an allocation on another stream" : "a free due earlier not made yet");
    return in_ranges(units, stream);
  }
  if (outgrows(s, t_, units)) {
    // A larger member of the family than any the plan was laid out for:
    // at the step's start (its first allocation, planned or not), laid out
    // again for it; else left.
    if (t_ == 0 && live_planned_ == 0 && resize_for(units)) {
      prev_layout_bytes_ = layout_bytes_;
      prev_layout_live_ = layout_live_;
      regrowing_ = true;
      mode_ = mode::pending;
      return next::need_region;
    }
    if (s.planned) {
      log_noexcept(spdlog::level::debug,
                   "arena step plan: allocation {} (the step's {}), {} units, outgrows its slot of {}", allocs_, t_,
                   units, s.units);
      // Many times its slot (2,000 times on the live declm trace): a step
      // of another shape whose allocations came out of line with the
      // plan's, not a larger block of the family.
      const bool larger = units / other_shape_growth <= s.units;
      off_plan(larger, larger ? "a block larger than its slot" : "a block many times its slot");
      return in_ranges(units, stream);
    }
  }
  seen_[t_] = units;
  if (!s.planned) {
    ++t_;
    freed_in_gap_ = 0;
    return next::place;
  }
  return next::serve;
}

step_plan::next step_plan::in_gap(std::uint32_t units, std::uint32_t stream) noexcept {
  if (mode_ != mode::waiting || stream != stream_) return next::place;
  waiting_addr_ = find_gap(std::uint64_t{units} * block_index::unit);
  return waiting_addr_ != 0 ? next::serve : next::place;
}

step_plan::next step_plan::in_ranges(std::uint32_t units, std::uint32_t stream) noexcept {
  if (mode_ != mode::waiting || stream != stream_ || at_floor()) return next::place;
  if (in_gap(units, stream) == next::serve) return next::serve;
  // No gap holds it: the plan is left as before (its live blocks become the
  // arena's and its ranges serve the step), not new memory beside them.
  log_noexcept(spdlog::level::debug,
               "arena step plan: left while waiting, at allocation {}: no gap of its ranges holds {} units", allocs_,
               units);
  mode_ = mode::draining;
  departures_ = 0;
  return next::place;
}

std::uintptr_t step_plan::find_gap(std::uint64_t bytes) const noexcept {
  // Best fit over the ranges' gaps around the blocks live in them (sorted):
  // the smallest gap that holds it, lowest first among equals.
  std::uintptr_t best = 0;
  std::uint64_t best_len = UINT64_MAX;
  const auto consider = [&](std::uintptr_t at, std::uintptr_t end) {
    if (end >= at + bytes && end - at < best_len) {
      best = at;
      best_len = end - at;
    }
  };
  auto o = occupied_.begin();
  for (const auto& [lo, hi] : ranges_) {
    while (o != occupied_.end() && o->second <= lo) ++o;
    std::uintptr_t at = lo;
    for (; o != occupied_.end() && o->first < hi; ++o) {
      if (o->first > at) consider(at, o->first);
      at = std::max<std::uintptr_t>(at, o->second);
    }
    if (hi > at) consider(at, hi);
  }
  return best;
}

std::uintptr_t step_plan::serve(std::uint32_t units, std::size_t requested) {
  if (mode_ == mode::waiting) {
    const std::uintptr_t addr = waiting_addr_;
    const std::size_t bytes = static_cast<std::size_t>(units) * block_index::unit;
    const std::pair<std::uintptr_t, std::uintptr_t> span{addr, addr + bytes};
    occupied_.reserve(occupied_.size() + 1);  // a throw here or below changes nothing
    live_[addr] = live_slot{never, bytes, requested};
    occupied_.insert(std::upper_bound(occupied_.begin(), occupied_.end(), span), span);
    ++live_planned_;
    figures_.unplanned_bytes += bytes;
    return addr;
  }
  const slot& s = slots_[t_];
  const std::uintptr_t addr = s.offset;
  const std::size_t bytes = static_cast<std::size_t>(units) * block_index::unit;
  live_[addr] = live_slot{t_, bytes, requested};  // room reserved in start()
  ++live_planned_;
  figures_.planned_bytes += bytes;
  ++t_;
  freed_in_gap_ = 0;
  return addr;
}

step_plan::freed step_plan::free_planned(std::uintptr_t addr, std::uint32_t stream) noexcept {
  const auto it = live_.find(addr);
  if (it == live_.end()) return {};
  const live_slot ls = it->second;
  live_.erase(it);
  --live_planned_;
  if (mode_ == mode::waiting) {
    const auto o = std::lower_bound(occupied_.begin(), occupied_.end(),
                                    std::pair<std::uintptr_t, std::uintptr_t>{addr, 0});
    if (o != occupied_.end() && o->first == addr) occupied_.erase(o);
  }
  if (mode_ == mode::active && ls.t != never) {
    if (stream == stream_ && slots_[ls.t].due == t_) {
      ++freed_in_gap_;
    } else {
      off_plan(false, stream != stream_ ? "a free on another stream" : "a free out of its planned place");
    }
  }
  return {ls.bytes, ls.requested};
}

void step_plan::live_blocks_in(std::uintptr_t lo, std::uintptr_t hi,
                               std::vector<std::pair<std::uintptr_t, std::uintptr_t>>& out) const {
  for (const auto& [addr, block] : live_) {
    if (addr < hi && addr + block.bytes > lo) out.emplace_back(addr, addr + block.bytes);
  }
}

void step_plan::start(const std::vector<bin>& bins, std::uintptr_t base) {
  // The ranges, for a step of another shape (waiting); first, so that a
  // throw leaves the plan as it was.
  ranges_.clear();
  std::uint64_t held = plan_extent_;
  for (const bin& b : bins) {
    if (b.used == 0) continue;
    const std::uint64_t used = round_up(b.used, block_index::unit);
    ranges_.emplace_back(b.base, b.base + used);
    held += used;
  }
  if (plan_extent_ != 0) ranges_.emplace_back(base, base + round_up(plan_extent_, block_index::unit));
  std::sort(ranges_.begin(), ranges_.end());
  std::uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (slot& s : slots_) {
    if (!s.planned) continue;
    s.offset += s.bin < bins.size() ? bins[s.bin].base : base;
    lo = std::min<std::uintptr_t>(lo, s.offset);
    hi = std::max<std::uintptr_t>(hi, s.offset + std::uint64_t{s.units} * block_index::unit);
  }
  region_ = lo;
  region_bytes_ = hi - lo;
  forget_shape_run();  // judged anew if the plan is laid out again or left
  mode_ = mode::active;
  t_ = 0;
  freed_in_gap_ = 0;
  figures_.region_bytes = held;
  step_start_calls_ = read_calls_ != nullptr ? read_calls_(read_ctx_) : 0;
  if (!regrowing_) plan_steps_ = 0;
  regrowing_ = false;
}

std::uint64_t step_plan::lay_out(std::vector<bin>& bins) {
  // Greedy by size (layout.hpp): largest first, each in the first bin, at
  // the lowest offset, free of the blocks placed so far whose lives meet its
  // own; what no bin holds goes to a new range.
  std::vector<std::uint64_t> bin_bytes(bins.size());
  for (std::size_t b = 0; b < bins.size(); ++b) bin_bytes[b] = bins[b].bytes;
  std::vector<layout_place> places;
  std::vector<std::uint64_t> used;
  const std::uint64_t extent = greedy_layout(items_, bin_bytes, places, used);
  for (std::size_t i = 0; i < items_.size(); ++i) {
    slot& s = slots_[items_[i].t];
    s.bin = places[i].bin;
    s.offset = places[i].offset;
  }
  plan_extent_ = extent;
  layout_bytes_ = extent;
  for (std::size_t b = 0; b < bins.size(); ++b) {
    bins[b].used = used[b];
    layout_bytes_ += used[b];
  }
  layout_live_ = live_peak();
  return extent;
}

std::uint64_t step_plan::live_peak() const {
  std::vector<std::int64_t> change(slots_.size() + 2, 0);
  for (const item& it : items_) {
    change[it.t] += static_cast<std::int64_t>(it.bytes);
    change[it.due] -= static_cast<std::int64_t>(it.bytes);
  }
  std::int64_t live = 0, most = 0;
  for (const std::int64_t c : change) most = std::max(most, live += c);
  return static_cast<std::uint64_t>(most);
}

bool step_plan::resize_for(std::uint32_t units) noexcept {
  if (x_lo_ == 0 || units <= x_hi_) return false;
  // Each slot's size as a power of the first allocation's, the power taken
  // from the two largest repeats (0: a size that does not follow it, 1:
  // linear, 2: a sequence length's attention scores), with a margin of
  // 1/256 and one unit for the rounding to units.
  const double ratio = static_cast<double>(units) / x_hi_;
  const double span = std::log(static_cast<double>(x_hi_) / x_lo_);
  const auto power = [&](const slot& s) {
    if (s.hi <= s.lo || s.lo == 0) return 0.0;
    return std::clamp(std::log(static_cast<double>(s.hi) / s.lo) / span, 0.0, 3.0);
  };
  const auto wanted = [&](const slot& s) {
    return std::ceil(s.hi * std::pow(ratio, power(s)) * (1.0 + 1.0 / 256)) + 1;
  };
  // The fit borne out, or a guess. The powers are measured between the
  // two largest repeats and, where the history holds a third, checked on
  // it: from the next largest's sizes they must give the third's to within
  // 1/8 (the sum of the planned slots' misses against the sum of their
  // sizes). They are trusted no further above the largest repeat than the
  // repeats they hold for lie apart (x_hi / x_lo, or x_hi / x_third when
  // the third bears them out), and a sixteenth. Where the first allocation
  // does not follow the rest of the step (the live generation job: a
  // request's prompt embedding against its batch's cache and logits), two
  // repeats fit anything: laid out so, a request smaller than the job's
  // largest, its embedding 2.4 times the largest repeat's (the two 2 apart),
  // mapped 28.7 GB for a step of at most 22.2 (1.416 of the live bytes
  // over 64 requests).
  double range = static_cast<double>(x_hi_) / x_lo_;
  bool fits = true;
  if (x_third_ != 0 && x_third_ < x_lo_) {
    const double down = std::log(static_cast<double>(x_third_) / x_lo_);
    double sizes = 0, missed = 0;
    for (const slot& s : slots_) {
      if (!s.planned) continue;
      sizes += s.third;
      missed += std::abs(s.lo * std::exp(power(s) * down) - s.third);
    }
    fits = missed <= sizes / 8;
    range = static_cast<double>(x_hi_) / x_third_;
  }
  regrow_borne_out_ = fits && ratio <= range * (1.0 + 1.0 / 16);
  log_noexcept(spdlog::level::debug,
               "arena step plan: a larger step at allocation {}: its first allocation {:.3f} times the largest "
               "repeat's ({} units), repeats {:.3f} apart, the third {}: {}",
               allocs_, ratio, x_hi_, range,
               x_third_ == 0 || x_third_ >= x_lo_ ? "absent" : fits ? "borne out" : "missed",
               regrow_borne_out_ ? "borne out" : "a guess");
  // All or nothing: an active plan that cannot be resized goes on with its
  // layout, so no slot may grow beyond the room it was laid out in (a slot
  // grown before a later one failed served a block over its neighbours:
  // the live declm trace with evaluations, a 188 MB block over a 23 MB
  // parameter).
  for (const slot& s : slots_) {
    if (s.planned && wanted(s) > 0xffffffffu) return false;
  }
  for (slot& s : slots_) {
    if (s.planned) s.units = std::max(s.units, static_cast<std::uint32_t>(wanted(s)));
  }
  for (item& it : items_) it.bytes = std::uint64_t{slots_[it.t].units} * block_index::unit;
  slots_[0].units = std::max(slots_[0].units, units);
  return true;
}

void step_plan::abandon() noexcept {
  log_noexcept(spdlog::level::debug, "arena step plan: given up at allocation {}{}", allocs_,
               regrowing_ ? " (a larger step's layout): planned again once this step is in the history" : "");
  if (regrowing_) {
    // The ranges of the plan laid out again are freed: plan once this step
    // is in the history, as off_plan does for a larger step.
    regrowing_ = false;
    region_freed();
    next_check_ = allocs_ + plan_period_;
    ++figures_.dropped;
    return;
  }
  mode_ = mode::learning;
  next_check_ = allocs_ * 2;  // not again soon
  ++figures_.dropped;
  figures_.step_allocations = 0;
  figures_.step_planned_bytes = 0;
}

void step_plan::defer(bool back_off) noexcept {
  // 1, 2, 4, ... starts left out after 1, 2, 3, ... such refusals in a row.
  back_offs_ = back_off ? std::min(back_offs_ + 1, max_back_offs) : 0;
  skip_starts_ = back_off ? std::uint32_t{1} << (back_offs_ - 1) : 0;
  if (back_off) {
    log_noexcept(spdlog::level::debug,
                 "arena step plan: waits for the next step start (allocation {}), at this shape for {} more after it",
                 allocs_, skip_starts_);
  } else {
    log_noexcept(spdlog::level::debug, "arena step plan: waits for the next step start (allocation {})", allocs_);
  }
  // Kept for the next step's start, where it is judged again with the
  // driver calls best fit made in that step.
  if (regrowing_) {
    regrowing_ = false;
    if (region_bytes_ != 0) region_freed();  // the old layout's ranges are gone
  }
  mode_ = mode::pending;
  risen_ = false;
  rearm_pending();
}

void step_plan::leave() noexcept {
  if (mode_ == mode::waiting) {
    mode_ = mode::draining;
    departures_ = 0;
  }
  if (mode_ == mode::active) {
    departures_ = max_departures;  // drained, not kept
    off_plan(false, "left by the arena (out of memory, or its cache released)");
  }
  if (mode_ == mode::pending) abandon();
}

void step_plan::off_plan(bool larger, const char* why) noexcept {
  ++figures_.dropped;
  const bool waits = !larger && plan_steps_ != 0 && departures_ < max_departures;
  log_noexcept(spdlog::level::debug,
               "arena step plan: off its layout at allocation {} (the step's {} of {}), after {} whole steps "
               "served: {}; {}",
               allocs_, t_, plan_period_, plan_steps_, why,
               waits ? "taken for a step of another shape, its ranges kept (waiting)" : "left, its ranges handed back");
  if (waits) {
    // A step of another shape (a short sequence whose attention allocates
    // otherwise) after whole steps served: the layout is kept for the steps
    // of the plan's shape that follow. The rest of this step goes in the
    // ranges' free gaps (in_ranges); the plan's live blocks stay where they
    // are.
    ++departures_;
    mode_ = mode::waiting;
    occupied_.clear();
    for (const auto& [addr, ls] : live_) occupied_.emplace_back(addr, addr + ls.bytes);
    std::sort(occupied_.begin(), occupied_.end());
    // Left within the step (its live bytes may never rise a quarter of
    // the plan's way): the next step start is the next time they are back
    // at the floor.
    risen_ = t_ > 0 || live_units_ > floor_ + floor_arm_;
    return;
  }
  mode_ = mode::draining;
  departures_ = 0;
  if (larger) {
    // The period was right; the sizes grew. Plan again as soon as this step
    // is in the history (right after its last allocation: the next step then
    // starts on the new plan), with its sizes among the largest seen.
    next_check_ = allocs_ + (plan_period_ - t_);
    return;
  }
  // A plan that never served a whole step had the wrong period (a layer's,
  // not the step's): look for longer ones from now on.
  if (plan_steps_ == 0) min_period_ = plan_period_ + 1;
}

void step_plan::region_freed() noexcept {
  region_ = 0;
  plan_extent_ = 0;
  region_bytes_ = 0;
  // Blocks still live (hand_over) are the arena's from now on: counted as
  // planned, they would keep every later plan from its ranges' release
  // (region_to_free) and from waiting's return (live_planned_ != 0).
  live_.clear();
  live_planned_ = 0;
  mode_ = mode::learning;
  figures_.region_bytes = 0;
  figures_.step_allocations = 0;
  figures_.step_planned_bytes = 0;
}

void step_plan::step_boundary() noexcept {
  if (freed_in_gap_ != due_in_gap_[plan_period_]) {
    off_plan(false, "the step's last frees not as planned");
    return;
  }
  ++figures_.planned_steps;
  ++plan_steps_;
  departures_ = 0;
  // The step's sizes, for resize_for(): kept when its first allocation is
  // the largest yet or the largest below it.
  const std::uint32_t x = seen_[0];
  if (const int rank = rank_among_largest(x); rank >= 0) {
    move_in(rank, x_hi_, x_lo_, x_third_, x);
    for (std::size_t t = 0; t < slots_.size(); ++t) {
      move_in(rank, slots_[t].hi, slots_[t].lo, slots_[t].third, seen_[t]);
    }
  }
  const std::uint64_t calls = read_calls_ != nullptr ? read_calls_(read_ctx_) : 0;
  const std::uint64_t in_step = calls - step_start_calls_;
  figures_.last_step_driver_calls = in_step;
  log_noexcept(spdlog::level::trace, "arena step plan: served a step ending at allocation {}, {} driver calls in it",
               allocs_, in_step);
  figures_.planned_step_driver_calls += in_step;
  step_start_calls_ = calls;
  t_ = 0;
  freed_in_gap_ = 0;
}

}  // namespace fragctl::arena_detail
