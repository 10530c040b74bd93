// allocator_stats as JSON and back (core/stats_json.hpp, fragctl/stats.hpp),
// so a later run can read an earlier run's report. Key names are the public
// schema of docs/statistics.md.
#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "core/json_io.hpp"
#include "core/stats_json.hpp"
#include "fmt/format.h"
#include "fragctl/stats.hpp"

namespace fragctl {

namespace detail {

namespace {

using nlohmann::json;

json gauge_json(const byte_gauge& g) { return json{{"current", g.current}, {"peak", g.peak}}; }

// The split of the device memory (fragctl/device_memory.hpp); `total` is
// the enclosing object's.
json split_json(const device_memory_split& m);

json oom_event_json(const oom_event& e);

}  // namespace

json device_memory_split_to_json_value(const device_memory_split& split) { return split_json(split); }

namespace {

json split_json(const device_memory_split& m) {
  return json{{"per_process", m.per_process},
              {"used", m.used},
              {"this_process", m.per_process ? json(m.this_process) : json(nullptr)},
              {"fragctl", m.fragctl},
              {"not_fragctl", m.not_fragctl()},
              {"other_fragctl", m.other_fragctl},
              {"graph_pools", m.graph_pools},
              {"context", m.context},
              {"nccl", m.nccl},
              {"other", m.other},
              {"other_processes", m.per_process ? json(m.other_processes) : json(nullptr)}};
}

json oom_event_json(const oom_event& e) {
  const oom_details& d = e.details;
  json out{{"sequence", e.sequence},
           {"time_unix_ms", e.time_unix_ms},
           {"stream", e.stream},
           {"requested", d.requested},
           {"reserved", d.reserved},
           {"cached_free", d.cached_free},
           {"largest_free_block", d.largest_free_block},
           {"device_free", d.device_free},
           {"device_total", d.device_total},
           {"used_by_others", memory_used_by_others(d)},
           {"outside_at_start", d.outside_at_start},
           {"verdict", std::string(to_string(e.verdict))},
           {"advice", e.advice}};
  if (e.memory_split) out["memory_split"] = split_json(*e.memory_split);
  return out;
}

// Reads one optional field of an object; absent leaves `out` unchanged.
class reader {
 public:
  explicit reader(std::string_view where) : where_(where) {}

  template <class T>
  void integer(const json& obj, const char* key, T& out, std::string_view prefix = {}) {
    if (!status_.ok()) return;
    const auto it = obj.find(key);
    if (it == obj.end()) return;
    if (!it->is_number_integer() || (!std::is_signed_v<T> && !it->is_number_unsigned())) {
      fail(prefix, key, "a non-negative integer");
      return;
    }
    out = it->template get<T>();
  }

  void string(const json& obj, const char* key, std::string& out) {
    if (!status_.ok()) return;
    const auto it = obj.find(key);
    if (it == obj.end()) return;
    if (!it->is_string()) {
      fail({}, key, "a string");
      return;
    }
    out = it->get<std::string>();
  }

  // The sub-object `key`, or nullptr when absent or (with an error) not an object.
  const json* object(const json& obj, const char* key) {
    if (!status_.ok()) return nullptr;
    const auto it = obj.find(key);
    if (it == obj.end()) return nullptr;
    if (!it->is_object()) {
      fail({}, key, "an object");
      return nullptr;
    }
    return &*it;
  }

  void boolean(const json& obj, const char* key, bool& out, std::string_view prefix = {}) {
    if (!status_.ok()) return;
    const auto it = obj.find(key);
    if (it == obj.end()) return;
    if (!it->is_boolean()) {
      fail(prefix, key, "true or false");
      return;
    }
    out = it->get<bool>();
  }

  // A figure that may be null (not measured): null leaves `out` unchanged.
  template <class T>
  void optional_integer(const json& obj, const char* key, T& out, std::string_view prefix = {}) {
    if (const auto it = obj.find(key); it != obj.end() && it->is_null()) return;
    integer(obj, key, out, prefix);
  }

  // The split written by split_json, `total` given.
  device_memory_split split(const json& m, std::size_t total, const std::string& prefix) {
    device_memory_split out;
    out.total = total;
    boolean(m, "per_process", out.per_process, prefix);
    integer(m, "used", out.used, prefix);
    optional_integer(m, "this_process", out.this_process, prefix);
    integer(m, "fragctl", out.fragctl, prefix);
    integer(m, "other_fragctl", out.other_fragctl, prefix);
    integer(m, "graph_pools", out.graph_pools, prefix);
    integer(m, "context", out.context, prefix);
    integer(m, "nccl", out.nccl, prefix);
    integer(m, "other", out.other, prefix);
    optional_integer(m, "other_processes", out.other_processes, prefix);
    return out;
  }

  void gauge(const json& obj, const char* key, byte_gauge& out) {
    if (const json* g = object(obj, key)) {
      integer(*g, "current", out.current, key);
      integer(*g, "peak", out.peak, key);
    }
  }

  void fail(std::string_view prefix, std::string_view key, std::string_view expected) {
    status_ = absl::InvalidArgumentError(fmt::format("{}: field \"{}{}{}\": expected {}", where_, prefix,
                                                     prefix.empty() ? "" : ".", key, expected));
  }

  [[nodiscard]] const absl::Status& status() const noexcept { return status_; }

 private:
  std::string_view where_;
  absl::Status status_;
};

}  // namespace

json stats_to_json_value(const allocator_stats& s) {
  json oom_events = json::array();
  for (const oom_event& e : s.oom_events) oom_events.push_back(oom_event_json(e));
  json calls = json::object();
  for (std::size_t i = 0; i < s.backend_calls.calls.size(); ++i) {
    calls[std::string(to_string(static_cast<backend_call>(i)))] = s.backend_calls.calls[i];
  }
  json out{
      {"schema_version", stats_schema_version},
      {"allocator", s.allocator},
      {"backend", s.backend},
      {"device", s.device},
      {"requested_bytes", gauge_json(s.requested)},
      {"allocated_bytes", gauge_json(s.allocated)},
      {"reserved_bytes", gauge_json(s.reserved)},
      {"allocations", s.allocations},
      {"frees", s.frees},
      {"ooms", s.ooms},
      {"retries", s.retries},
      {"misuse", {{"not_owned", s.misuse_not_owned}, {"size_mismatch", s.misuse_size_mismatch}}},
      {"backend_counters",
       {{"calls", std::move(calls)},
        {"memory_calls", s.backend_calls.memory_calls()},
        {"total_calls", s.backend_calls.total_calls()},
        {"held_bytes", s.backend_calls.held_bytes},
        {"peak_held_bytes", s.backend_calls.peak_held_bytes},
        {"host_bytes", s.backend_calls.host_bytes},
        {"failed_allocations", s.backend_calls.failed_allocations}}},
      {"pool",
       {{"reserved", s.pool.reserved},
        {"allocated", s.pool.allocated},
        {"cached_free", s.pool.cached_free},
        {"largest_free_block", s.pool.largest_free_block},
        {"segments", s.pool.segments},
        {"retries", s.pool.retries}}},
      {"size_histogram", s.size_histogram},
      {"size_histogram_sum", s.size_histogram_sum},
      {"oom_events", std::move(oom_events)},
      {"derived",
       {{"reserved_over_requested", s.reserved_over_requested()},
        {"fragmentation", s.fragmentation()},
        {"external_fragmentation", s.external_fragmentation()},
        {"internal_waste_bytes", s.internal_waste()}}},
  };
  if (s.pool.plan.steps_detected != 0) {
    const step_plan_state& p = s.pool.plan;
    out["step_plan"] = {{"steps_detected", p.steps_detected},
                        {"planned_steps", p.planned_steps},
                        {"dropped", p.dropped},
                        {"planned_bytes", p.planned_bytes},
                        {"unplanned_bytes", p.unplanned_bytes},
                        {"step_allocations", p.step_allocations},
                        {"step_planned_bytes", p.step_planned_bytes},
                        {"region_bytes", p.region_bytes},
                        {"last_step_driver_calls", p.last_step_driver_calls},
                        {"planned_step_driver_calls", p.planned_step_driver_calls},
                        {"starts_refused_calls", p.starts_refused_calls},
                        {"starts_refused_memory", p.starts_refused_memory}};
  }
  if (s.pool.pause_detached_exports != 0) {  // absent until a pause released exported memory
    out["pause"] = {{"detached_exports", s.pool.pause_detached_exports},
                    {"detached_export_bytes", s.pool.pause_detached_export_bytes}};
  }
  if (s.device_memory.measured) {
    out["device_memory"] = {{"free", s.device_memory.free},
                            {"total", s.device_memory.total},
                            {"outside_at_start", s.device_memory.outside_at_start}};
    if (s.device_memory.split) out["device_memory"]["split"] = split_json(*s.device_memory.split);
  }
  return out;
}

absl::StatusOr<allocator_stats> stats_from_json_value(const json& j, std::string_view where) {
  if (!j.is_object()) return absl::InvalidArgumentError(fmt::format("{}: expected a JSON object", where));
  reader r(where);
  int version = 0;
  r.integer(j, "schema_version", version);
  if (!r.status().ok()) return r.status();
  if (!j.contains("schema_version")) {
    return absl::InvalidArgumentError(fmt::format("{}: no schema_version: not a fragctl statistics object", where));
  }
  if (version < 1 || version > stats_schema_version) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: schema_version {} is not supported (this fragctl reads 1 to {})", where, version, stats_schema_version));
  }
  allocator_stats s;
  r.string(j, "allocator", s.allocator);
  r.string(j, "backend", s.backend);
  r.integer(j, "device", s.device);
  r.gauge(j, "requested_bytes", s.requested);
  r.gauge(j, "allocated_bytes", s.allocated);
  r.gauge(j, "reserved_bytes", s.reserved);
  r.integer(j, "allocations", s.allocations);
  r.integer(j, "frees", s.frees);
  r.integer(j, "ooms", s.ooms);
  r.integer(j, "retries", s.retries);
  r.integer(j, "size_histogram_sum", s.size_histogram_sum);
  if (const json* m = r.object(j, "misuse")) {
    r.integer(*m, "not_owned", s.misuse_not_owned, "misuse");
    r.integer(*m, "size_mismatch", s.misuse_size_mismatch, "misuse");
  }
  if (const json* b = r.object(j, "backend_counters")) {
    if (const json* calls = r.object(*b, "calls")) {
      for (std::size_t i = 0; i < s.backend_calls.calls.size(); ++i) {
        const std::string key(to_string(static_cast<backend_call>(i)));
        r.integer(*calls, key.c_str(), s.backend_calls.calls[i], "backend_counters.calls");
      }
    }
    r.integer(*b, "held_bytes", s.backend_calls.held_bytes, "backend_counters");
    r.integer(*b, "peak_held_bytes", s.backend_calls.peak_held_bytes, "backend_counters");
    r.integer(*b, "host_bytes", s.backend_calls.host_bytes, "backend_counters");
    r.integer(*b, "failed_allocations", s.backend_calls.failed_allocations, "backend_counters");
  }
  if (const json* p = r.object(j, "pool")) {
    r.integer(*p, "reserved", s.pool.reserved, "pool");
    r.integer(*p, "allocated", s.pool.allocated, "pool");
    r.integer(*p, "cached_free", s.pool.cached_free, "pool");
    r.integer(*p, "largest_free_block", s.pool.largest_free_block, "pool");
    r.integer(*p, "segments", s.pool.segments, "pool");
    r.integer(*p, "retries", s.pool.retries, "pool");
  }
  if (const json* p = r.object(j, "step_plan")) {  // absent without a plan, and in earlier reports
    step_plan_state& q = s.pool.plan;
    r.integer(*p, "steps_detected", q.steps_detected, "step_plan");
    r.integer(*p, "planned_steps", q.planned_steps, "step_plan");
    r.integer(*p, "dropped", q.dropped, "step_plan");
    r.integer(*p, "planned_bytes", q.planned_bytes, "step_plan");
    r.integer(*p, "unplanned_bytes", q.unplanned_bytes, "step_plan");
    r.integer(*p, "step_allocations", q.step_allocations, "step_plan");
    r.integer(*p, "step_planned_bytes", q.step_planned_bytes, "step_plan");
    r.integer(*p, "region_bytes", q.region_bytes, "step_plan");
    r.integer(*p, "last_step_driver_calls", q.last_step_driver_calls, "step_plan");
    r.integer(*p, "planned_step_driver_calls", q.planned_step_driver_calls, "step_plan");
    r.integer(*p, "starts_refused_calls", q.starts_refused_calls, "step_plan");  // absent before 2026-11-28
    r.integer(*p, "starts_refused_memory", q.starts_refused_memory, "step_plan");
  }
  if (const json* p = r.object(j, "pause")) {  // absent without detached exports, and in earlier reports
    r.integer(*p, "detached_exports", s.pool.pause_detached_exports, "pause");
    r.integer(*p, "detached_export_bytes", s.pool.pause_detached_export_bytes, "pause");
  }
  if (const json* d = r.object(j, "device_memory")) {  // absent when not measured, and in earlier reports
    s.device_memory.measured = true;
    r.integer(*d, "free", s.device_memory.free, "device_memory");
    r.integer(*d, "total", s.device_memory.total, "device_memory");
    r.integer(*d, "outside_at_start", s.device_memory.outside_at_start, "device_memory");
    if (const json* m = r.object(*d, "split"))
      s.device_memory.split = r.split(*m, s.device_memory.total, "device_memory.split");
  }
  if (!r.status().ok()) return r.status();
  if (const auto h = j.find("size_histogram"); h != j.end()) {
    if (!h->is_array() || h->size() > size_histogram_buckets) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: field \"size_histogram\": expected an array of at most {} counts", where, size_histogram_buckets));
    }
    for (std::size_t i = 0; i < h->size(); ++i) {
      const json& count = (*h)[i];
      if (!count.is_number_unsigned()) {
        return absl::InvalidArgumentError(
            fmt::format("{}: field \"size_histogram[{}]\": expected a non-negative integer", where, i));
      }
      s.size_histogram[i] = count.get<std::uint64_t>();
    }
  }
  if (const auto events = j.find("oom_events"); events != j.end()) {
    if (!events->is_array()) {
      return absl::InvalidArgumentError(fmt::format("{}: field \"oom_events\": expected an array", where));
    }
    for (std::size_t i = 0; i < events->size(); ++i) {
      const json& ej = (*events)[i];
      const std::string prefix = fmt::format("oom_events[{}]", i);
      if (!ej.is_object()) {
        return absl::InvalidArgumentError(fmt::format("{}: field \"{}\": expected an object", where, prefix));
      }
      oom_event e;
      r.integer(ej, "sequence", e.sequence, prefix);
      r.integer(ej, "time_unix_ms", e.time_unix_ms, prefix);
      r.integer(ej, "stream", e.stream, prefix);
      r.integer(ej, "requested", e.details.requested, prefix);
      r.integer(ej, "reserved", e.details.reserved, prefix);
      r.integer(ej, "cached_free", e.details.cached_free, prefix);
      r.integer(ej, "largest_free_block", e.details.largest_free_block, prefix);
      r.integer(ej, "device_free", e.details.device_free, prefix);
      r.integer(ej, "device_total", e.details.device_total, prefix);
      r.integer(ej, "outside_at_start", e.details.outside_at_start, prefix);  // absent before 0.1: 0
      std::string verdict;
      r.string(ej, "verdict", verdict);
      r.string(ej, "advice", e.advice);
      if (const json* m = r.object(ej, "memory_split")) {
        e.memory_split = r.split(*m, e.details.device_total, prefix + ".memory_split");
      }
      if (!r.status().ok()) return r.status();
      // An unknown verdict (a newer writer) is recomputed from the numbers.
      e.verdict = diagnose(e.details);
      for (const oom_verdict v : {oom_verdict::fragmentation, oom_verdict::capacity, oom_verdict::other_process,
                                   oom_verdict::declined})
        if (verdict == to_string(v)) e.verdict = v;
      s.oom_events.push_back(std::move(e));
    }
  }
  return s;
}

}  // namespace detail

std::string to_json(const allocator_stats& s) { return detail::dump_json(detail::stats_to_json_value(s)); }

absl::StatusOr<allocator_stats> stats_from_json(std::string_view text) {
  auto parsed = detail::parse_json(text, "stats JSON");
  if (!parsed.ok()) return parsed.status();
  const nlohmann::json& j = *parsed;
  if (j.is_object() && j.contains("allocators")) {
    const nlohmann::json& list = j["allocators"];
    if (!list.is_array()) return absl::InvalidArgumentError("report JSON: \"allocators\" is not an array");
    if (list.size() != 1) {
      return absl::InvalidArgumentError(fmt::format(
          "report JSON: holds {} allocators, expected exactly one (read it with stats_export_from_json)", list.size()));
    }
    return detail::stats_from_json_value(list[0], "report JSON: allocators[0]");
  }
  return detail::stats_from_json_value(j, "stats JSON");
}

}  // namespace fragctl
