// Derived metrics of allocator_stats (fragctl/stats.hpp). Its export
// formats are beside it: stats_json.cpp (JSON both ways) and
// stats_prometheus.cpp (Prometheus text). Key and metric names are a public
// schema: docs/statistics.md lists them, and a change of meaning bumps
// stats_schema_version.
#include <algorithm>
#include <bit>
#include <cstddef>

#include "fragctl/stats.hpp"

namespace fragctl {

double allocator_stats::reserved_over_requested() const noexcept {
  if (requested.peak == 0) return 0.0;
  return static_cast<double>(reserved.peak) / static_cast<double>(requested.peak);
}

double allocator_stats::fragmentation() const noexcept {
  if (reserved.peak == 0) return 0.0;
  return 1.0 - static_cast<double>(requested.peak) / static_cast<double>(reserved.peak);
}

double allocator_stats::external_fragmentation() const noexcept {
  if (pool.cached_free == 0) return 0.0;
  return 1.0 - static_cast<double>(std::min(pool.largest_free_block, pool.cached_free)) /
                   static_cast<double>(pool.cached_free);
}

std::size_t allocator_stats::internal_waste() const noexcept {
  return allocated.current > requested.current ? allocated.current - requested.current : 0;
}

std::size_t size_histogram_bucket(std::size_t bytes) noexcept {
  if (bytes <= 1) return 0;
  const auto log2 = static_cast<std::size_t>(std::bit_width(bytes)) - 1;
  return std::min(log2, size_histogram_buckets - 1);
}

}  // namespace fragctl
