// Helpers for tests that write FRAGCTL_REPORT documents
// (fragctl/stats_export.hpp) from statistics they made up.
#pragma once

#include <vector>

#include "fragctl/stats.hpp"
#include "fragctl/stats_export.hpp"

namespace fragctl::testing {

/// One document entry per allocator, without memory maps.
inline std::vector<stats_export_entry> export_entries(const std::vector<allocator_stats>& allocators) {
  std::vector<stats_export_entry> entries;
  entries.reserve(allocators.size());
  for (const allocator_stats& s : allocators) entries.push_back({s, std::nullopt});
  return entries;
}

}  // namespace fragctl::testing
