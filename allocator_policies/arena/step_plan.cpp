#include "allocator_policies/arena/step_plan.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "fragctl/log.hpp"

namespace fragctl::arena_detail {

namespace {

constexpr std::uint32_t never = UINT32_MAX;
/// The live bytes at a step's start may differ between two repeats by at
/// most 1/live_slack of the step's rise above them (what outlives a step,
/// e.g. its input batch, may differ in size from one step to the next).
constexpr std::int64_t live_slack = 256;
/// An allocation more than this many times its slot's size is taken for a
/// step of another shape (the plan waits), not a larger one (it is left).
constexpr std::uint32_t other_shape_growth = 16;

// Folds v into the hash h (an allocation's key: its stream and the frees
// before it, step_plan::extend_scan).
constexpr std::uint64_t mix(std::uint64_t h, std::uint64_t v) noexcept {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdULL;
}

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
        skip_starts_ = 0;
        back_offs_ = 0;
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
  if (units > s.units && (s.planned || t_ == 0)) {
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

void step_plan::note_shape_run(std::uint32_t first_units) noexcept {
  if (step_seen_) {
    // The step begun at the last start just ended. In the run if the plan
    // would have served it whole: as many allocations as the plan's step,
    // each on its slot's stream and no larger than its slot (a step whose
    // sizes outgrow the layout, as decoding's do at one first allocation,
    // would leave the plan at once). The history may have been cut since.
    bool fits = allocs_ - run_start_allocs_ == plan_period_ && run_start_event_ <= history_.size();
    for (std::size_t i = run_start_event_, t = 0; fits && i < history_.size(); ++i) {
      const event& e = history_[i];
      if (e.is_free != 0) continue;
      fits = t < slots_.size() && e.units <= slots_[t].units && e.stream == slots_[t].stream;
      ++t;
    }
    // And at the shape of the step before it (the same first allocation).
    if (fits && run_steps_ != 0 && run_first_ == run_prev_first_) {
      ++run_steps_;
      run_calls_ += recent_calls_;
    } else if (fits) {
      run_steps_ = 1;
      run_calls_ = recent_calls_;
    } else {
      forget_shape_run();
    }
    run_prev_first_ = run_first_;
  }
  run_start_allocs_ = allocs_;
  run_start_event_ = history_.size();
  run_first_ = first_units;
}

void step_plan::record_rare(bool is_free) {
  if (history_.size() >= history_cap) {
    history_.clear();
    call_marks_.clear();
    scan_ = history_scan{};
    min_period_ = initial_min_period;  // learning starts over, periods that failed included
    allocs_ = 0;
    next_check_ = 256;
  }
  if (!is_free && allocs_ % 256 == 0) call_marks_.push_back(read_calls_ != nullptr ? read_calls_(read_ctx_) : 0);
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

void step_plan::extend_scan() {
  history_scan& h = scan_;
  for (std::size_t e = h.events; e < history_.size(); ++e) {
    const event& ev = history_[e];
    if (ev.is_free) {
      h.live -= ev.units;
      if (const std::uint32_t a = h.open.take(ev.addr); a != nil) {
        // Freed on another stream than it was allocated on: never planned.
        h.freed_at[a] = history_[h.at[a]].stream == ev.stream ? static_cast<std::uint32_t>(e) : never - 1;
        h.frees = mix(h.frees, h.keys.size() - a);
      } else {
        h.frees = mix(h.frees, 0);  // made before the history
      }
      continue;
    }
    (void)h.open.take(ev.addr);  // allocated again with no free between: the latest allocation holds it
    if (h.open.size() >= h.open.room()) h.open.reserve(2 * h.open.size() + 64);
    h.open.insert(ev.addr, static_cast<std::uint32_t>(h.keys.size()));
    h.keys.push_back(mix(h.frees, ev.stream + 1));
    if (h.prefix.empty()) h.prefix.push_back(0);
    h.prefix.push_back(h.prefix.back() * hash_base + h.keys.back());
    h.frees = 0;
    h.at.push_back(static_cast<std::uint32_t>(e));
    h.freed_at.push_back(never);
    h.live_before.push_back(h.live);
    h.live += ev.units;
  }
  h.events = history_.size();
}

bool step_plan::detect() {
  next_check_ = allocs_ + std::max<std::uint64_t>(256, allocs_ / 8);
  const std::size_t n = allocs_;
  if (n < 2 * min_period_) return false;
  extend_scan();
  const std::vector<std::uint64_t>& keys = scan_.keys;
  const std::vector<std::uint32_t>& at = scan_.at;
  const std::vector<std::uint32_t>& freed_at = scan_.freed_at;
  const std::vector<std::int64_t>& live_before = scan_.live_before;
  // Periods P whose last two repeats are equal: the last P keys are the P
  // before them. Each P is tried in O(1) by the keys' prefix hashes
  // (scan_.prefix, kept as the history grows), and a P whose hashes agree
  // is confirmed key by key, so a collision costs time, never a wrong
  // period. A search (every time the allocations grew by an eighth) reads
  // the hashes of up to n/2 periods and writes nothing, where a Z-array of
  // the whole reversed history was built for each.
  const std::uint64_t* const prefix = scan_.prefix.data();
  const auto halves_equal = [&](std::size_t p, std::uint64_t base_to_p) noexcept {
    if (prefix[n - p] - prefix[n - 2 * p] * base_to_p != prefix[n] - prefix[n - p] * base_to_p) return false;
    return std::equal(keys.begin() + static_cast<std::ptrdiff_t>(n - 2 * p),
                      keys.begin() + static_cast<std::ptrdiff_t>(n - p),
                      keys.begin() + static_cast<std::ptrdiff_t>(n - p));
  };
  std::uint64_t base_to_p = 1;  // hash_base^p for the p at hand
  for (std::size_t i = 0; i < min_period_; ++i) base_to_p *= hash_base;
  // Of the candidates, the shortest over which the live bytes come back to
  // where they were: a step frees what it allocates, where a run of
  // layers (forward keeps each layer's output, backward frees it) does not,
  // and two or more steps are a multiple of it.
  // The step starts where the live bytes are lowest in its last repeat.
  std::size_t period = 0, low_at = 0, top = 0;
  std::int64_t rise = 0;
  // The lowest and highest live bytes over the last p allocations (the
  // first of equals), kept as p grows: each p adds the allocation n - p,
  // the earliest of the window, which takes a tie.
  std::size_t low = n - min_period_, hi = n - min_period_;
  for (std::size_t a = n - min_period_; a < n; ++a) {
    if (live_before[a] < live_before[low]) low = a;
    if (live_before[a] > live_before[hi]) hi = a;
  }
  for (std::size_t p = min_period_; p <= n / 2 && period == 0; ++p, base_to_p *= hash_base) {
    if (p > min_period_) {
      const std::size_t a = n - p;
      if (live_before[a] <= live_before[low]) low = a;
      if (live_before[a] >= live_before[hi]) hi = a;
    }
    if (!halves_equal(p, base_to_p)) continue;
    const std::int64_t high = live_before[hi];
    if (std::abs(live_before[low] - live_before[low - p]) <= (high - live_before[low]) / live_slack) {
      period = p;
      low_at = low;
      top = hi;
      rise = high - live_before[low];
    }
  }
  if (period == 0) return false;
  // The step starts at the first allocation after the period's highest
  // point with the live bytes back at its low (within the slack: two
  // allocations at the low, such as a step's inputs, are told apart the
  // same way when the plan starts).
  const std::int64_t slack = rise / live_slack, arm = rise / 4;
  std::size_t m = low_at;
  for (std::size_t i = 1; i <= period; ++i) {
    const std::size_t a = n - period + (top - (n - period) + i) % period;
    if (live_before[a] <= live_before[low_at] + slack) {
      m = a;
      break;
    }
  }
  const std::size_t first = m - period;
  const std::uint32_t end_event = at[m];
  // How far back the history repeats with this period, past a few keys
  // that differ (two a repeat: what a step frees of the one before it is
  // named by its distance, which a step of another length changes).
  // Counted from the end: key n-1-i against key n-1-period-i.
  const auto back = [&](std::size_t i) noexcept { return keys[n - 1 - i]; };
  std::size_t same = 0;
  for (std::size_t missed = 0; period + same < n; ++same) {
    if (back(same) != back(period + same) && ++missed > 2 + 2 * (same / period)) break;
  }
  stream_ = history_[at[first]].stream;
  // The step's slots; planned ones live over [t, due) in allocation indices,
  // at the largest size seen at their point of the step over every repeat
  // of it in the history (the allocations from n - period - same on
  // repeat with that period).
  slots_.assign(period, slot{});
  seen_.assign(period, 0);
  due_in_gap_.assign(period + 1, 0);
  for (std::size_t a = n - period - same; a < n; ++a) {
    const std::size_t t = (a + period - first % period) % period;
    slots_[t].units = std::max(slots_[t].units, history_[at[a]].units);
  }
  // The repeats wholly in the history, by the size of their first
  // allocation: the three largest, for resize_for() (the third checks the
  // fit of the other two).
  std::size_t r_hi = first, r_lo = first, r_third = first;
  x_hi_ = x_lo_ = x_third_ = 0;
  for (std::size_t k = m + period <= n ? m : first; k >= n - period - same; k -= period) {
    const std::uint32_t x = history_[at[k]].units;
    if (const int rank = rank_among_largest(x); rank >= 0) {
      move_in(rank, x_hi_, x_lo_, x_third_, x);
      move_in(rank, r_hi, r_lo, r_third, k);
    }
    if (k < period) break;
  }
  items_.clear();
  std::uint64_t step_bytes = 0;
  for (std::size_t t = 0; t < period; ++t) {
    const std::size_t a = first + t;
    slot& s = slots_[t];
    s.stream = history_[at[a]].stream;
    s.hi = history_[at[r_hi + t]].units;
    s.lo = x_lo_ != 0 ? history_[at[r_lo + t]].units : s.hi;
    s.third = x_third_ != 0 ? history_[at[r_third + t]].units : 0;
    const std::uint32_t f = freed_at[a];
    s.planned = f < end_event && history_[at[a]].stream == stream_;
    if (!s.planned) continue;
    // The gap its free falls in: the allocations of the step before it.
    const auto gap = std::lower_bound(at.begin() + static_cast<std::ptrdiff_t>(first),
                                      at.begin() + static_cast<std::ptrdiff_t>(m + 1), f);
    s.due = static_cast<std::uint32_t>(gap - (at.begin() + static_cast<std::ptrdiff_t>(first)));
    ++due_in_gap_[s.due];
    const std::uint64_t bytes = std::uint64_t{s.units} * block_index::unit;
    step_bytes += bytes;
    items_.push_back({static_cast<std::uint32_t>(t), s.due, bytes});
  }
  if (items_.empty()) return false;
  plan_period_ = period;
  plan_steps_ = 0;  // a new plan: start() keeps the count only for a plan laid out again
  // The step's floor, in the live units counted since the start (the
  // history's may have started later), and how far a repeat may differ.
  floor_ = live_units_ - (scan_.live - live_before[low_at]);
  floor_slack_ = slack;
  floor_arm_ = arm;
  // Past the highest point of this repeat with its start behind: the next
  // start comes after the next highest point.
  risen_ = m < top;
  step_seen_ = false;
  forget_shape_run();
  recent_calls_ = (read_calls_ != nullptr ? read_calls_(read_ctx_) : 0) - call_marks_[(n - period) / 256];
  mode_ = mode::pending;
  rearm_pending();
  live_.reserve(items_.size());
  occupied_.reserve(items_.size());  // off_plan() fills it with the live planned blocks
  ++figures_.steps_detected;
  log_noexcept(spdlog::level::debug,
               "arena step plan: a step of {} allocations found at allocation {} ({} repeats' worth of history "
               "alike), {} planned blocks, {} bytes allocated in it",
               period, n, (period + same) / period, items_.size(), step_bytes);
  figures_.step_allocations = period;
  figures_.step_planned_bytes = step_bytes;
  return true;
}

}  // namespace fragctl::arena_detail
