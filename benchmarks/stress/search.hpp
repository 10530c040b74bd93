// The two searches of the fragmentation stress benchmark, over any probe
// "does the workload complete?". Header-only, standard C++ only: bench_stress
// and torch_replay share it. Both assume the probe is monotone (completes
// below a threshold scale, above a threshold cap); where an allocator is not,
// the answer is one point where it flips.
#pragma once

#include <cstddef>
#include <functional>

namespace fragctl::bench::search {

struct scale_result {
  bool found = false;  ///< some scale in [min, max] completed
  double scale = 0;    ///< the largest scale seen to complete
  int probes = 0;
};

/// Largest scale in [min, max] for which `completes` holds: doubling (or
/// halving) from `start` until it flips, then bisection until the gap is
/// below `relative` of the answer.
inline scale_result largest_scale(const std::function<bool(double)>& completes, double start, double min,
                                  double max, double relative = 0.01) {
  scale_result r;
  const auto probe = [&](double x) {
    ++r.probes;
    return completes(x);
  };
  double good = 0, bad = 0;
  if (probe(start)) {
    good = start;
    for (double x = start * 2; x <= max; x *= 2) {
      if (!probe(x)) {
        bad = x;
        break;
      }
      good = x;
    }
    if (bad == 0) return {true, good, r.probes};
  } else {
    bad = start;
    for (double x = start / 2; x >= min; x /= 2) {
      if (probe(x)) {
        good = x;
        break;
      }
      bad = x;
    }
    if (good == 0) return {false, 0, r.probes};
  }
  while ((bad - good) > relative * good) {
    const double mid = (good + bad) / 2;
    if (probe(mid)) {
      good = mid;
    } else {
      bad = mid;
    }
  }
  return {true, good, r.probes};
}

struct cap_result {
  bool found = false;  ///< some cap up to the limit completed
  std::size_t cap = 0;  ///< the smallest cap seen to complete (a multiple of step)
  int probes = 0;
};

/// Smallest cap, a multiple of `step`, in (fails, ...] for which `completes`
/// holds. `fails` is a cap known to fail (e.g. the peak live bytes minus
/// one); `completes_at` one expected to complete (e.g. the uncapped peak
/// reserved), raised by a quarter up to three times if it does not.
inline cap_result smallest_cap(const std::function<bool(std::size_t)>& completes, std::size_t fails,
                               std::size_t completes_at, std::size_t step) {
  cap_result r;
  const auto probe = [&](std::size_t cap) {
    ++r.probes;
    return completes(cap);
  };
  const auto round_up = [&](std::size_t x) { return (x + step - 1) / step * step; };
  std::size_t good = round_up(completes_at);
  bool ok = probe(good);
  for (int i = 0; i < 3 && !ok; ++i) {
    fails = good;
    good = round_up(good + good / 4);
    ok = probe(good);
  }
  if (!ok) return {false, 0, r.probes};
  std::size_t bad = fails / step * step;
  while (good - bad > step) {
    std::size_t mid = (bad + good) / 2 / step * step;
    if (mid <= bad) mid = bad + step;
    if (probe(mid)) {
      good = mid;
    } else {
      bad = mid;
    }
  }
  return {true, good, r.probes};
}

}  // namespace fragctl::bench::search
