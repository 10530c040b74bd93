// allocator_stats as Prometheus text: one allocator (to_prometheus,
// fragctl/stats.hpp) and several merged into one exposition
// (prometheus_text, fragctl/stats_export.hpp). Metric names are the public schema
// of docs/statistics.md.
#include <iterator>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fmt/format.h"
#include "fragctl/stats.hpp"
#include "fragctl/stats_export.hpp"
#include "util/strings.hpp"

namespace fragctl {

namespace {

std::string escape_label(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (const char c : v) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

class exposition {
 public:
  explicit exposition(const allocator_stats& s)
      : labels_(fmt::format("allocator=\"{}\",backend=\"{}\",device=\"{}\"", escape_label(s.allocator),
                            escape_label(s.backend), s.device)) {}

  void family(std::string_view name, std::string_view type, std::string_view help) {
    fmt::format_to(std::back_inserter(out_), "# HELP fragctl_{} {}\n# TYPE fragctl_{} {}\n", name, help, name, type);
  }
  template <class T>
  void sample(std::string_view name, T value, std::string_view extra_labels = {}) {
    fmt::format_to(std::back_inserter(out_), "fragctl_{}{{{}{}{}}} {}\n", name, labels_,
                   extra_labels.empty() ? "" : ",", extra_labels, value);
  }
  template <class T>
  void metric(std::string_view name, std::string_view type, std::string_view help, T value) {
    family(name, type, help);
    sample(name, value);
  }

  [[nodiscard]] std::string take() { return std::move(out_); }

 private:
  std::string labels_;
  std::string out_;
};

}  // namespace

std::string to_prometheus(const allocator_stats& s) {
  exposition e(s);
  e.metric("requested_bytes", "gauge", "Bytes callers asked for, live now.", s.requested.current);
  e.metric("requested_peak_bytes", "gauge", "Peak of requested bytes.", s.requested.peak);
  e.metric("allocated_bytes", "gauge", "Bytes handed out after rounding, live now.", s.allocated.current);
  e.metric("allocated_peak_bytes", "gauge", "Peak of allocated bytes.", s.allocated.peak);
  e.metric("reserved_bytes", "gauge", "Device bytes held from the backend now.", s.reserved.current);
  e.metric("reserved_peak_bytes", "gauge", "Peak of reserved bytes.", s.reserved.peak);
  e.metric("allocations_total", "counter", "Successful allocate calls.", s.allocations);
  e.metric("frees_total", "counter", "Deallocate calls that freed a block.", s.frees);
  e.metric("ooms_total", "counter", "Allocate calls that failed with out_of_memory.", s.ooms);
  e.metric("retries_total", "counter", "Allocations that succeeded only after releasing cache.", s.retries);
  e.family("misuse_total", "counter", "Deallocate misuse: foreign pointer or double free, wrong size.");
  e.sample("misuse_total", s.misuse_not_owned, "kind=\"not_owned\"");
  e.sample("misuse_total", s.misuse_size_mismatch, "kind=\"size_mismatch\"");
  e.family("backend_calls_total", "counter", "Calls into the device backend by kind.");
  for (std::size_t i = 0; i < s.backend_calls.calls.size(); ++i) {
    e.sample("backend_calls_total", s.backend_calls.calls[i],
             fmt::format("call=\"{}\"", to_string(static_cast<backend_call>(i))));
  }
  e.metric("backend_failed_allocations_total", "counter", "Backend allocations that ran out of memory.",
           s.backend_calls.failed_allocations);
  e.metric("backend_host_bytes", "gauge", "Pinned host bytes held from the backend now.",
           s.backend_calls.host_bytes);
  e.metric("pool_cached_free_bytes", "gauge", "Reserved bytes not handed out (free in cache).",
           s.pool.cached_free);
  e.metric("pool_largest_free_block_bytes", "gauge", "Largest block one request could get from the cache.",
           s.pool.largest_free_block);
  e.metric("pool_segments", "gauge", "Segments or mapped regions held.", s.pool.segments);
  if (s.pool.pause_detached_exports != 0) {
    e.metric("pause_detached_exports_total", "counter",
             "Exported handles a pause released; their importers keep the old memory.", s.pool.pause_detached_exports);
    e.metric("pause_detached_export_bytes_total", "counter", "Bytes of those handles.",
             s.pool.pause_detached_export_bytes);
  }
  if (s.pool.plan.steps_detected != 0) {
    const step_plan_state& p = s.pool.plan;
    e.metric("step_plan_steps_detected_total", "counter", "Repeating steps the arena found and planned.",
             p.steps_detected);
    e.metric("step_plan_planned_steps_total", "counter", "Steps served wholly from a plan.", p.planned_steps);
    e.metric("step_plan_dropped_total", "counter", "Plans left because the job no longer followed them.",
             p.dropped);
    e.metric("step_plan_planned_bytes_total", "counter", "Bytes allocated from a plan.", p.planned_bytes);
    e.metric("step_plan_unplanned_bytes_total", "counter", "Bytes allocated by the arena's own placement.",
             p.unplanned_bytes);
    e.metric("step_plan_region_bytes", "gauge", "Memory the current plan holds for its blocks.", p.region_bytes);
    e.metric("step_plan_last_step_driver_calls", "gauge", "Driver memory calls in the latest planned step.",
             p.last_step_driver_calls);
    e.metric("step_plan_driver_calls_total", "counter", "Driver memory calls over all planned steps.",
             p.planned_step_driver_calls);
    e.metric("step_plan_starts_refused_calls_total", "counter",
             "Plan starts refused: mapping its range would cost more calls than best fit made in the step before.",
             p.starts_refused_calls);
    e.metric("step_plan_starts_refused_memory_total", "counter",
             "Plan starts refused: it would raise the memory held past its high-water mark and the growth allowed.",
             p.starts_refused_memory);
  }
  e.metric("reserved_over_requested_ratio", "gauge", "Peak reserved over peak requested bytes (1 is ideal).",
           s.reserved_over_requested());
  e.metric("fragmentation_ratio", "gauge", "1 - peak requested / peak reserved.", s.fragmentation());
  e.metric("external_fragmentation_ratio", "gauge", "1 - largest free block / free in cache.",
           s.external_fragmentation());
  e.metric("internal_waste_bytes", "gauge", "Allocated minus requested bytes now (rounding).",
           s.internal_waste());

  // A Prometheus histogram of request sizes: bucket i of size_histogram holds
  // sizes in [2^i, 2^(i+1)), integers, so its upper bound "le" is 2^(i+1) - 1
  // (the last bucket also holds everything bigger: +Inf). Every bucket is
  // written, cumulative, so that each scrape has the same series.
  e.family("request_size_bytes", "histogram", "Sizes of allocate requests in bytes (log2 buckets).");
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i + 1 < size_histogram_buckets; ++i) {
    cumulative += s.size_histogram[i];
    e.sample("request_size_bytes_bucket", cumulative, fmt::format("le=\"{}\"", (std::uint64_t{2} << i) - 1));
  }
  cumulative += s.size_histogram[size_histogram_buckets - 1];
  e.sample("request_size_bytes_bucket", cumulative, "le=\"+Inf\"");
  e.sample("request_size_bytes_sum", s.size_histogram_sum);
  e.sample("request_size_bytes_count", cumulative);
  return e.take();
}

std::string prometheus_text(const std::vector<allocator_stats>& allocators) {
  // Each to_prometheus text is a sequence of families, each "# HELP" and
  // "# TYPE" lines followed by samples; families are merged by name in the
  // order they first appear.
  struct family {
    std::string header;
    std::string samples;
  };
  std::vector<std::string> order;
  std::map<std::string, family> families;
  for (const allocator_stats& s : allocators) {
    const std::string text = to_prometheus(s);
    std::string current;
    for (const std::string_view line : util::split(text, '\n')) {
      if (line.empty()) continue;
      if (line.starts_with("# HELP ") || line.starts_with("# TYPE ")) {
        const std::string_view rest = line.substr(7);
        current = std::string(rest.substr(0, rest.find(' ')));
        auto [it, added] = families.try_emplace(current);
        if (added) order.push_back(current);
        if (it->second.header.find(line) == std::string::npos) it->second.header += fmt::format("{}\n", line);
        continue;
      }
      families[current].samples += fmt::format("{}\n", line);
    }
  }
  std::string out;
  for (const std::string& name : order) out += families[name].header + families[name].samples;
  return out;
}

}  // namespace fragctl
