// The stats export document, read and written (fragctl/stats_export.hpp);
// the registry of live allocators is stats_export_registry.cpp, the
// Prometheus text of several allocators stats_prometheus.cpp.
#include "fragctl/stats_export.hpp"

#include <unistd.h>

#include <cstdint>
#include <ctime>
#include <deque>
#include <mutex>
#include <optional>
#include <utility>

#include "core/atomic_file.hpp"
#include "core/json_io.hpp"
#include "core/launcher_identity.hpp"
#include "core/memory_map_json.hpp"
#include "core/stats_json.hpp"
#include "fmt/format.h"
#include "util/fork_safe_mutex.hpp"

namespace fragctl {

namespace {

// A launcher's figure, null when it gave none.
nlohmann::json figure(const std::optional<std::int64_t>& n) { return n ? nlohmann::json(*n) : nlohmann::json(nullptr); }

// The process's hang records (record_stats_export_hang), never destroyed:
// the exit hook writes documents after static destructors may have run. The
// mutex is a leaf lock (no other fragctl lock is taken under it).
struct hang_records {
  util::fork_safe_mutex mutex;
  std::deque<nlohmann::json> records;
};

hang_records& hangs() {
  static hang_records* const all = new hang_records();
  return *all;
}

nlohmann::json hangs_value() {
  hang_records& h = hangs();
  const std::lock_guard guard(h.mutex);
  return nlohmann::json(h.records);
}

}  // namespace

absl::Status record_stats_export_hang(std::string_view record) {
  auto parsed = detail::parse_json(record, "hang record");
  if (!parsed.ok()) return parsed.status();
  if (!parsed->is_object()) return absl::InvalidArgumentError("hang record: expected a JSON object");
  hang_records& h = hangs();
  const std::lock_guard guard(h.mutex);
  h.records.push_back(*std::move(parsed));
  while (h.records.size() > stats_export_hangs_kept) h.records.pop_front();
  return absl::OkStatus();
}

std::vector<std::string> stats_export_hangs() {
  std::vector<std::string> out;
  for (const nlohmann::json& one : hangs_value()) out.push_back(one.dump());
  return out;
}

std::string stats_export_to_json(const std::vector<stats_export_entry>& allocators, std::string_view reason) {
  const detail::launcher_identity who = detail::process_launcher_identity();
  nlohmann::json list = nlohmann::json::array();
  for (const stats_export_entry& entry : allocators) {
    nlohmann::json one = detail::stats_to_json_value(entry.stats);
    if (entry.map) one["memory_map"] = detail::memory_snapshot_to_json_value(*entry.map, stats_export_map_max_blocks);
    list.push_back(std::move(one));
  }
  nlohmann::json doc{
      {"schema_version", stats_schema_version},
      {"reason", std::string(reason)},
      {"pid", static_cast<std::int64_t>(::getpid())},
      {"time_unix_s", static_cast<std::int64_t>(std::time(nullptr))},
      {"host", who.host},
      {"launcher", who.launcher.empty() ? nlohmann::json(nullptr) : nlohmann::json(std::string(who.launcher))},
      {"rank", figure(who.rank)},
      {"local_rank", figure(who.local_rank)},
      {"world_size", figure(who.world_size)},
      {"allocators", std::move(list)},
  };
  if (nlohmann::json recorded = hangs_value(); !recorded.empty()) doc["hangs"] = std::move(recorded);
  return detail::dump_json(doc);
}

absl::StatusOr<std::vector<allocator_stats>> stats_export_from_json(std::string_view text) {
  auto parsed = detail::parse_json(text, "report JSON");
  if (!parsed.ok()) return parsed.status();
  const nlohmann::json& j = *parsed;
  std::vector<allocator_stats> out;
  if (!j.is_object() || !j.contains("allocators")) {
    auto one = detail::stats_from_json_value(j, "report JSON");
    if (!one.ok()) return one.status();
    out.push_back(*std::move(one));
    return out;
  }
  const nlohmann::json& list = j["allocators"];
  if (!list.is_array()) return absl::InvalidArgumentError("report JSON: \"allocators\" is not an array");
  for (std::size_t i = 0; i < list.size(); ++i) {
    auto one = detail::stats_from_json_value(list[i], fmt::format("report JSON: allocators[{}]", i));
    if (!one.ok()) return one.status();
    out.push_back(*std::move(one));
  }
  return out;
}

absl::Status write_stats_export_file(const std::string& path, const std::vector<stats_export_entry>& allocators,
                                     std::string_view reason) {
  return detail::write_file_atomically(path, stats_export_to_json(allocators, reason) + "\n", "report");
}

}  // namespace fragctl
