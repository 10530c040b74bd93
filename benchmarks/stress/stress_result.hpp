// What one run of a stress workload through one allocator measured, and its
// JSON form. Header-only, standard C++ only: bench_stress (fragctl) and
// torch_replay (PyTorch) report through it, so their results read alike.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

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

inline std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

inline std::string json_number(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

/// One JSON object; `with_series` adds "series" as rows of
/// [step, requested_peak, reserved_peak, requested_end, reserved_end, alloc_ns].
inline std::string to_json(const run_result& r, bool with_series) {
  std::string j = "{";
  const auto field = [&](const char* k, const std::string& value) {
    if (j.size() > 1) j += ", ";
    j += json_string(k) + ": " + value;
  };
  const auto u = [](std::uint64_t v) { return std::to_string(v); };
  field("scenario", json_string(r.scenario));
  field("allocator", json_string(r.allocator));
  field("backend", json_string(r.backend));
  field("scale", json_number(r.scale));
  field("cap", u(r.cap));
  field("completed", r.completed ? "true" : "false");
  field("failed_step", std::to_string(r.failed_step));
  field("failure", json_string(r.failure));
  field("peak_live", u(r.peak_live));
  field("peak_requested", u(r.peak_requested));
  field("peak_reserved", u(r.peak_reserved));
  field("reserved_over_requested", json_number(r.reserved_over_requested));
  field("backend_memory_calls", u(r.backend_memory_calls));
  field("retries", u(r.retries));
  field("operations", u(r.operations));
  field("median_ns", json_number(r.median_ns));
  field("p99_ns", json_number(r.p99_ns));
  field("steps", u(r.steps));
  field("first_step_ns", json_number(r.first_step_ns));
  field("step_ns_median", json_number(r.step_ns_median));
  if (with_series) {
    std::string rows = "[";
    for (std::size_t i = 0; i < r.series.size(); ++i) {
      const step_sample& s = r.series[i];
      if (i > 0) rows += ", ";
      rows += "[" + u(s.step) + ", " + u(s.requested_peak) + ", " + u(s.reserved_peak) + ", " + u(s.requested_end) +
           ", " + u(s.reserved_end) + ", " + std::to_string(s.alloc_ns) + "]";
    }
    field("series", rows + "]");
  }
  return j + "}";
}

}  // namespace fragctl::bench
