// The JSON form of allocator_stats as an nlohmann::json value, shared by
// stats_json.cpp (to_json, stats_from_json) and stats_export.cpp (the
// FRAGCTL_REPORT document).
// Key names are the stable schema of docs/statistics.md.
#pragma once

#include "absl/status/statusor.h"
#include "fragctl/stats.hpp"
#include "nlohmann/json.hpp"

namespace fragctl::detail {

/// One allocator's statistics as a JSON object, schema_version included.
[[nodiscard]] nlohmann::json stats_to_json_value(const allocator_stats& s);

/// A device memory split (fragctl/device_memory.hpp) as the report's
/// device_memory.split object.
[[nodiscard]] nlohmann::json device_memory_split_to_json_value(const device_memory_split& split);

/// The inverse of stats_to_json_value; `where` prefixes error messages.
[[nodiscard]] absl::StatusOr<allocator_stats> stats_from_json_value(const nlohmann::json& j,
                                                                    std::string_view where);

}  // namespace fragctl::detail
