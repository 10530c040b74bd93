// Gathering run_reports: from JSON reports, from `fragctl replay --json`
// output, and by replaying traces with a sampling hook that builds the
// timeline and takes memory maps at peak reserved, at the first OOM and
// after the last event.
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <sstream>
#include <utility>

#include "core/json_io.hpp"
#include "core/memory_map_json.hpp"
#include "core/stats_json.hpp"
#include "fmt/format.h"
#include "fragctl/error.hpp"
#include "fragctl/run_report.hpp"
#include "nlohmann/json.hpp"

namespace fragctl {

namespace {

using nlohmann::json;

std::string base_name(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Builds the timeline and the maps while a trace replays.
class replay_observer {
 public:
  replay_observer(const trace& t, std::size_t max_points)
      : first_time_(t.events.empty() ? 0 : t.events.front().time_us),
        last_event_(t.events.empty() ? 0 : t.events.size() - 1),
        stride_(std::max<std::size_t>(1, (t.events.size() + max_points - 1) / std::max<std::size_t>(1, max_points))) {
    time_.by_time = !t.events.empty() && t.events.back().time_us != t.events.front().time_us;
  }

  void operator()(const replay_sample& s, const device_allocator& a) {
    // In double: times a hostile trace spreads over more than 2^63 us must
    // not overflow (UBSan) where only the milliseconds are wanted.
    const double ms = (static_cast<double>(s.time_us) - static_cast<double>(first_time_)) / 1000.0;
    bucket_.event = s.event;
    bucket_.time_ms = ms;
    bucket_.requested = std::max(bucket_.requested, s.requested);
    bucket_.reserved = std::max(bucket_.reserved, s.reserved);
    if ((s.event + 1) % stride_ == 0 || s.event == last_event_) {
      time_.points.push_back(bucket_);
      bucket_ = {};
    }
    if (s.oom) {
      const std::size_t bytes = s.event < sizes_.size() ? sizes_[s.event] : 0;
      time_.ooms.push_back({s.event, ms, s.requested, s.reserved, bytes});
      if (!oom_map_taken_) {
        oom_map_ = {fmt::format("at the first OOM (event {}, {:.1f} ms)", s.event, ms), a.memory_map()};
        oom_map_taken_ = true;
      }
    }
    if (s.reserved > peak_reserved_ || !peak_taken_) {
      peak_reserved_ = s.reserved;
      peak_taken_ = true;
      peak_event_ = s.event;
      peak_ms_ = ms;
      // A policy without a map answers cheaply; ask once.
      if (map_supported_) {
        peak_map_.map = a.memory_map();
        map_supported_ = peak_map_.map.available;
      }
    }
    if (s.event == last_event_) end_map_ = {fmt::format("after the last event ({:.1f} ms)", ms), a.memory_map()};
  }

  void set_sizes(std::vector<std::size_t> sizes) { sizes_ = std::move(sizes); }

  [[nodiscard]] timeline take_timeline() { return std::move(time_); }

  [[nodiscard]] std::vector<labelled_map> take_maps() {
    std::vector<labelled_map> maps;
    if (!peak_map_.map.available) {
      // One unavailable map says why there is no picture.
      if (peak_taken_) maps.push_back({"", std::move(peak_map_.map)});
      return maps;
    }
    peak_map_.label = fmt::format("at peak reserved (event {}, {:.1f} ms)", peak_event_, peak_ms_);
    if (oom_map_taken_) maps.push_back(std::move(oom_map_));
    maps.push_back(std::move(peak_map_));
    maps.push_back(std::move(end_map_));
    return maps;
  }

 private:
  std::int64_t first_time_;
  std::size_t last_event_;
  std::size_t stride_;
  timeline time_;
  timeline_point bucket_;
  std::vector<std::size_t> sizes_;
  std::size_t peak_reserved_ = 0;
  bool peak_taken_ = false;
  bool map_supported_ = true;
  std::size_t peak_event_ = 0;
  double peak_ms_ = 0;
  labelled_map peak_map_;
  labelled_map oom_map_;
  bool oom_map_taken_ = false;
  labelled_map end_map_;
};

// The string field `key` of `obj`, `fallback` when absent; an error naming
// `where` and the field when it is not a string.
absl::StatusOr<std::string> string_field(const json& obj, const char* key, std::string fallback,
                                         const std::string& where) {
  const auto it = obj.find(key);
  if (it == obj.end()) return fallback;
  if (!it->is_string())
    return absl::InvalidArgumentError(fmt::format("{}: field \"{}\": expected a string", where, key));
  return it->get<std::string>();
}

// An allocator entry must carry the figures every rendering shows: without
// them (`{"schema_version": 1}`) it would render as an allocator of zeros.
absl::Status require_figures(const json& entry, const std::string& where) {
  for (const char* key : {"requested_bytes", "reserved_bytes"}) {
    if (!entry.contains(key))
      return absl::InvalidArgumentError(
          fmt::format("{}: no \"{}\": not the statistics of an allocator (a fragctl report has them)", where, key));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<run_report>> from_replay_json(const json& j, const std::string& source) {
  std::vector<run_report> out;
  for (std::size_t i = 0; i < j.size(); ++i) {
    const json& r = j[i];
    const std::string where = fmt::format("{}: [{}]", source, i);
    if (!r.is_object() || !r.contains("stats"))
      return absl::InvalidArgumentError(fmt::format("{}: expected a replay result with \"stats\"", where));
    if (absl::Status s = require_figures(r["stats"], where + ".stats"); !s.ok()) return s;
    auto stats = detail::stats_from_json_value(r["stats"], where + ".stats");
    if (!stats.ok()) return stats.status();
    run_report rep;
    rep.source = source;
    rep.kind = "report";
    rep.stats = *std::move(stats);
    auto trace_name = string_field(r, "trace", std::string(), where);
    auto policy = string_field(r, "policy", rep.stats.allocator, where);
    if (!trace_name.ok()) return trace_name.status();
    if (!policy.ok()) return policy.status();
    rep.name = trace_name->empty() ? *policy : fmt::format("{} / {}", *trace_name, *policy);
    out.push_back(std::move(rep));
  }
  return out;
}

bool is_replay_json(const json& j) {
  return j.is_array() && !j.empty() && j[0].is_object() && j[0].contains("stats") && j[0].contains("policy");
}

bool is_report_json(const json& j) {
  return j.is_object() && j.contains("schema_version") && !j.contains("device_traces");
}

// The writer's rank, launcher and host of a report document (absent or null:
// unknown); an error naming the field when one has another type.
absl::StatusOr<writer_rank> writer_of(const json& j, const std::string& source) {
  writer_rank w;
  for (auto [key, out] :
       {std::pair{"rank", &w.rank}, std::pair{"local_rank", &w.local_rank}, std::pair{"world_size", &w.world_size}}) {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_number_unsigned())
      return absl::InvalidArgumentError(
          fmt::format("{}: field \"{}\": expected a non-negative integer or null", source, key));
    const std::uint64_t n = it->get<std::uint64_t>();
    if (n > static_cast<std::uint64_t>(INT64_MAX))
      return absl::InvalidArgumentError(fmt::format("{}: field \"{}\": {} is not a rank", source, key, n));
    *out = static_cast<std::int64_t>(n);
  }
  for (auto [key, out] : {std::pair{"host", &w.host}, std::pair{"launcher", &w.launcher}}) {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    auto value = string_field(j, key, std::string(), source);
    if (!value.ok()) return value.status();
    *out = *std::move(value);
  }
  return w;
}

// The "hangs" of a report document (docs/reports.md, "Hangs"): absent in
// reports without one and in those of earlier fragctl. A field of the wrong
// type is an error naming it (json::exception, caught by the caller).
absl::StatusOr<std::vector<hang_note>> hangs_of(const json& j, const std::string& source) {
  std::vector<hang_note> out;
  const auto it = j.find("hangs");
  if (it == j.end() || it->is_null()) return out;
  if (!it->is_array()) return absl::InvalidArgumentError(fmt::format("{}: \"hangs\" is not an array", source));
  for (std::size_t i = 0; i < it->size(); ++i) {
    const json& h = (*it)[i];
    if (!h.is_object()) return absl::InvalidArgumentError(fmt::format("{}: hangs[{}] is not an object", source, i));
    hang_note n;
    n.rank = h.value("rank", std::int64_t{-1});
    n.communicator = h.value("communicator", std::string());
    n.collective = h.value("collective", std::string());
    n.sequence = h.value("sequence", std::uint64_t{0});
    n.block = h.value("block", std::string());
    n.modules = h.value("modules", std::vector<std::string>());
    n.bytes = h.value("bytes", std::size_t{0});
    n.deadline_s = h.value("deadline_s", 0.0);
    if (const auto t = h.find("group_timeout_s"); t != h.end() && !t->is_null()) n.group_timeout_s = t->get<double>();
    n.elapsed_s = h.value("elapsed_s", 0.0);
    n.timed_out = h.value("timed_out", true);
    n.missing = h.value("missing", std::vector<std::int64_t>());
    n.peers = h.value("peers", std::vector<std::string>());
    n.message = h.value("message", std::string());
    out.push_back(std::move(n));
  }
  return out;
}

absl::StatusOr<std::vector<run_report>> reports_from_document(const json& j, const std::string& source) {
  if (is_replay_json(j)) return from_replay_json(j, source);
  if (!is_report_json(j)) {
    return absl::InvalidArgumentError(
        fmt::format("{}: not a fragctl report (no schema_version) nor `fragctl replay --json` output", source));
  }
  const bool document = j.contains("allocators");
  const json list = document ? j["allocators"] : json::array({j});
  if (!list.is_array()) return absl::InvalidArgumentError(fmt::format("{}: \"allocators\" is not an array", source));
  if (list.empty()) return absl::InvalidArgumentError(fmt::format("{}: the report lists no allocators", source));
  auto reason = document ? string_field(j, "reason", "report", source) : std::string("report");
  if (!reason.ok()) return reason.status();
  auto writer = document ? writer_of(j, source) : writer_rank{};
  if (!writer.ok()) return writer.status();
  auto hangs = document ? hangs_of(j, source) : std::vector<hang_note>{};
  if (!hangs.ok()) return hangs.status();
  std::vector<run_report> out;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string where = fmt::format("{}: allocators[{}]", source, i);
    if (list[i].is_object()) {
      if (absl::Status s = require_figures(list[i], where); !s.ok()) return s;
    }
    auto stats = detail::stats_from_json_value(list[i], where);
    if (!stats.ok()) return stats.status();
    run_report rep;
    rep.source = source;
    rep.kind = "report";
    rep.stats = *std::move(stats);
    rep.writer = *writer;
    rep.hangs = *hangs;
    rep.name = list.size() == 1 ? base_name(source) : fmt::format("{} [{}] {}", base_name(source), i, rep.stats.allocator);
    if (const auto m = list[i].find("memory_map"); m != list[i].end()) {
      auto map = detail::memory_snapshot_from_json_value(*m, where + ".memory_map");
      if (!map.ok()) return map.status();
      rep.maps.push_back({fmt::format("when the report was written ({})", *reason), *std::move(map)});
    }
    out.push_back(std::move(rep));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<run_report>> run_reports_from_json(std::string_view text, const std::string& source) {
  auto j = detail::parse_json(text, source);
  if (!j.ok()) return j.status();
  try {
    return reports_from_document(*j, source);
  } catch (const json::exception& e) {  // a check above missed a type: still an error naming the file
    return absl::InvalidArgumentError(fmt::format("{}: unexpected JSON content: {}", source, e.what()));
  }
}

run_report replay_run_report(const trace& t, const report_options& options) {
  replay_options ro = options.replay;
  replay_observer observer(t, options.max_timeline_points);
  std::vector<std::size_t> sizes(t.events.size());
  for (std::size_t i = 0; i < t.events.size(); ++i) sizes[i] = t.events[i].size;
  observer.set_sizes(std::move(sizes));
  auto user_sample = ro.sample;
  ro.sample = [&observer, user_sample](const replay_sample& s, const device_allocator& a) {
    observer(s, a);
    if (user_sample) user_sample(s, a);
  };
  run_report rep;
  rep.replay = replay(t, ro);
  rep.kind = "replay";
  rep.source = t.name;
  rep.name = fmt::format("{} / {}", t.name, rep.replay.policy);
  rep.stats = rep.replay.stats;
  rep.time = observer.take_timeline();
  rep.maps = observer.take_maps();
  return rep;
}

absl::StatusOr<std::vector<run_report>> load_run_reports(const std::string& path, const report_options& options) {
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int why = errno;
    return absl::NotFoundError(
        fmt::format("{}: cannot open: {}", path, why != 0 ? std::strerror(why) : "not a readable file"));
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  const std::string content = buffer.str();
  const std::size_t first = content.find_first_not_of(" \t\r\n");
  const bool json_like = first != std::string::npos && (content[first] == '{' || content[first] == '[');
  if (json_like) {
    // Neither a report nor a snapshot nests this deep: the error is the file's.
    if (const auto deep = detail::json_too_deep(content)) return detail::json_too_deep_error(path, *deep);
    const json j = json::parse(content, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && (is_report_json(j) || is_replay_json(j))) return run_reports_from_json(content, path);
  }
  auto t = read_trace(path, options.trace);
  if (!t.ok()) return t.status();
  if (t->events.empty()) return absl::InvalidArgumentError(fmt::format("{}: {}", path, empty_trace_note(*t)));
  try {
    std::vector<run_report> out;
    out.push_back(replay_run_report(*t, options));
    out.back().source = path;
    if (t->completeness == trace_completeness::cut) out.back().cut_note = completeness_note(*t);
    return out;
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(fmt::format("{}: replay failed: {}", path, e.what()));
  }
}

}  // namespace fragctl
