// The stats export document, read and written (fragctl/stats_export.hpp);
// the registry of live allocators is stats_export_registry.cpp, the
// Prometheus text of several allocators stats_prometheus.cpp.
#include "fragctl/stats_export.hpp"

#include <unistd.h>

#include <cstdint>
#include <ctime>
#include <optional>
#include <utility>

#include "core/atomic_file.hpp"
#include "core/json_io.hpp"
#include "core/launcher_identity.hpp"
#include "core/memory_map_json.hpp"
#include "core/stats_json.hpp"
#include "fmt/format.h"

namespace fragctl {

namespace {

// A launcher's figure, null when it gave none.
nlohmann::json figure(const std::optional<std::int64_t>& n) { return n ? nlohmann::json(*n) : nlohmann::json(nullptr); }

}  // namespace

std::string stats_export_to_json(const std::vector<stats_export_entry>& allocators, std::string_view reason) {
  const detail::launcher_identity who = detail::process_launcher_identity();
  nlohmann::json list = nlohmann::json::array();
  for (const stats_export_entry& entry : allocators) {
    nlohmann::json one = detail::stats_to_json_value(entry.stats);
    if (entry.map) one["memory_map"] = detail::memory_snapshot_to_json_value(*entry.map, stats_export_map_max_blocks);
    list.push_back(std::move(one));
  }
  const nlohmann::json doc{
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
