// step_plan's learning (step_plan.hpp, "Learning"): the history of
// allocations and frees, the search for a period in it (detect), and, while
// a plan waits for its start, the steps in a row at one shape whose best
// fit calls pay for it (note_shape_run).
#include "allocator_policies/arena/step_plan.hpp"

#include <algorithm>
#include <cstdlib>

#include "fragctl/log.hpp"

namespace fragctl::arena_detail {

namespace {

/// The live bytes at a step's start may differ between two repeats by at
/// most 1/live_slack of the step's rise above them (what outlives a step,
/// e.g. its input batch, may differ in size from one step to the next).
constexpr std::int64_t live_slack = 256;

// Folds v into the hash h (an allocation's key: its stream and the frees
// before it, step_plan::extend_scan).
constexpr std::uint64_t mix(std::uint64_t h, std::uint64_t v) noexcept {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdULL;
}

}  // namespace

void step_plan::record_rare(bool is_free) {
  if (history_.size() >= history_cap) {
    history_.clear();
    call_marks_.clear();
    scan_ = history_scan{};
    min_period_ = initial_min_period;  // learning starts over, periods that failed included
    allocs_ = 0;
    next_check_ = 256;
    run_start_event_ = no_event;  // the step begun there is not whole
  }
  if (!is_free && allocs_ % 256 == 0) call_marks_.push_back(read_calls_ != nullptr ? read_calls_(read_ctx_) : 0);
}

void step_plan::note_shape_run(std::uint32_t first_units) noexcept {
  if (step_seen_) {
    // The step begun at the last start just ended. In the run if the plan
    // would have served it whole: as many allocations as the plan's step,
    // each on its slot's stream and, if planned, no larger than it (a step
    // whose sizes outgrow the layout, as decoding's do at one first
    // allocation, would leave the plan at once). A step across the
    // history's cut is not whole (record_rare).
    bool fits = run_start_event_ <= history_.size();
    std::uint32_t t = 0;
    for (std::size_t i = run_start_event_; fits && i < history_.size(); ++i) {
      const event& e = history_[i];
      if (e.is_free != 0) continue;
      // Served as the plan serves (before_allocate_planning).
      fits = t < slots_.size() && e.stream == slots_[t].stream && !outgrows(slots_[t], t, e.units);
      ++t;
    }
    fits = fits && t == plan_period_;
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
  run_start_event_ = history_.size();
  run_first_ = first_units;
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
