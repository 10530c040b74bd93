// What one run of a stress workload through one allocator measured, and its
// JSON form (nlohmann-json). Header-only, no fragctl headers: bench_stress
// (fragctl) and torch_replay (PyTorch) report through it, so their results
// read alike.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"

namespace fragctl::bench {

/// Bytes over one step: peaks within the step and values at its end.
struct step_sample {
  std::size_t step = 0;
  std::size_t requested_peak = 0, reserved_peak = 0;
  std::size_t requested_end = 0, reserved_end = 0;
  std::int64_t alloc_ns = 0;  ///< sum of the wall times of the step's mallocs and frees
};

struct run_result {
  std::string scenario;
  std::string allocator;  ///< policy expression, or "torch-native" / "torch-expandable"
  std::string backend;
  double scale = 1;
  std::size_t cap = 0;  ///< reserved-bytes cap; 0 = none
  bool completed = false;
  long failed_step = -1;  ///< step of the first out-of-memory, -1 when none
  std::string failure;    ///< its message
  std::size_t peak_live = 0;  ///< the workload's own peak of live bytes
  std::size_t peak_requested = 0, peak_reserved = 0;
  double reserved_over_requested = 0;
  std::uint64_t backend_memory_calls = 0;
  std::uint64_t retries = 0;  ///< allocations that succeeded only after freeing cache
  std::uint64_t operations = 0;
  double median_ns = 0, p99_ns = 0;
  std::size_t steps = 0;          ///< steps completed
  double first_step_ns = 0;       ///< allocator time of the first step (warm-up)
  double step_ns_median = 0;      ///< median allocator time of the later steps
  std::vector<step_sample> series;
};

/// Median (mean of the middle two) and nearest-rank percentile; reorder `v`.
inline double median_of(std::vector<std::int64_t>& v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? static_cast<double>(v[m]) : (static_cast<double>(v[m - 1]) + static_cast<double>(v[m])) / 2;
}
inline double percentile_of(std::vector<std::int64_t>& v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  rank = std::clamp<std::size_t>(rank, 1, v.size()) - 1;
  return static_cast<double>(v[rank]);
}

/// Fills steps, first_step_ns and step_ns_median from the series.
inline void summarize_steps(run_result& r) {
  r.steps = r.series.size();
  if (r.series.empty()) return;
  r.first_step_ns = static_cast<double>(r.series.front().alloc_ns);
  std::vector<std::int64_t> later;
  for (std::size_t i = 1; i < r.series.size(); ++i) later.push_back(r.series[i].alloc_ns);
  r.step_ns_median = later.empty() ? r.first_step_ns : median_of(later);
}

/// A double as JSON: the number (nlohmann writes the shortest form that reads
/// back the same double), or null when not finite.
inline nlohmann::ordered_json json_number(double x) {
  return std::isfinite(x) ? nlohmann::ordered_json(x) : nlohmann::ordered_json(nullptr);
}

/// One JSON object; `with_series` adds "series" as rows of
/// [step, requested_peak, reserved_peak, requested_end, reserved_end, alloc_ns].
inline nlohmann::ordered_json to_json_value(const run_result& r, bool with_series) {
  nlohmann::ordered_json j = {
      {"scenario", r.scenario},
      {"allocator", r.allocator},
      {"backend", r.backend},
      {"scale", json_number(r.scale)},
      {"cap", r.cap},
      {"completed", r.completed},
      {"failed_step", r.failed_step},
      {"failure", r.failure},
      {"peak_live", r.peak_live},
      {"peak_requested", r.peak_requested},
      {"peak_reserved", r.peak_reserved},
      {"reserved_over_requested", json_number(r.reserved_over_requested)},
      {"backend_memory_calls", r.backend_memory_calls},
      {"retries", r.retries},
      {"operations", r.operations},
      {"median_ns", json_number(r.median_ns)},
      {"p99_ns", json_number(r.p99_ns)},
      {"steps", r.steps},
      {"first_step_ns", json_number(r.first_step_ns)},
      {"step_ns_median", json_number(r.step_ns_median)},
  };
  if (with_series) {
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    for (const step_sample& x : r.series)
      rows.push_back({x.step, x.requested_peak, x.reserved_peak, x.requested_end, x.reserved_end, x.alloc_ns});
    j["series"] = std::move(rows);
  }
  return j;
}

/// to_json_value as text (one line).
inline std::string to_json(const run_result& r, bool with_series) { return to_json_value(r, with_series).dump(); }

}  // namespace fragctl::bench
