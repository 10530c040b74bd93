// The JSON form of memory_snapshot as an nlohmann::json value, shared by
// memory_map.cpp (to_json, memory_snapshot_from_json) and report.cpp (the
// report document embeds each allocator's map).
#pragma once

#include <cstddef>
#include <string_view>

#include "absl/status/statusor.h"
#include "fragctl/memory_map.hpp"
#include "nlohmann/json.hpp"

namespace fragctl::detail {

/// The snapshot as a JSON object; segments lose their blocks when the
/// snapshot holds more than `max_blocks` blocks ("blocks_omitted": true).
[[nodiscard]] nlohmann::json memory_snapshot_to_json_value(const memory_snapshot& m, std::size_t max_blocks);

/// The inverse; `where` prefixes error messages.
[[nodiscard]] absl::StatusOr<memory_snapshot> memory_snapshot_from_json_value(const nlohmann::json& j,
                                                                              std::string_view where);

}  // namespace fragctl::detail
