// Statistics: one schema for every allocator (DESIGN.md, "Statistics").
//
// Collected by statistics_adaptor (fragctl/adaptors.hpp) around any allocator,
// plus the backend's counters (reserved bytes are what the backend holds) and
// the policy's pool_state. Exported as versioned JSON and Prometheus text.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "fragctl/backend.hpp"
#include "fragctl/device_allocator.hpp"
#include "fragctl/device_memory.hpp"
#include "fragctl/oom.hpp"

namespace fragctl {

/// Bumped whenever a field of the JSON report changes meaning or goes away.
inline constexpr int stats_schema_version = 1;

/// Current and peak of one byte count.
struct byte_gauge {
  std::size_t current = 0;
  std::size_t peak = 0;
};

/// Number of buckets of the request-size histogram: bucket i counts requests
/// with floor(log2(bytes)) == i (bucket 0 also holds 1-byte requests).
inline constexpr std::size_t size_histogram_buckets = 48;

/// How many of the latest OOM events the statistics keep (allocator_stats::oom_events).
inline constexpr std::size_t oom_events_kept = 8;

struct allocator_stats {
  std::string allocator;  ///< name() of the allocator measured
  std::string backend;    ///< backend name
  int device = 0;

  byte_gauge requested;  ///< bytes callers asked for
  byte_gauge allocated;  ///< bytes handed out after rounding
  byte_gauge reserved;   ///< device bytes held from the backend

  /// Cumulative bytes over the allocator's life: what PyTorch's statistics
  /// call "allocated" and "freed" of each byte count. Reserved ones come from
  /// the backend (taken from / given back to the device).
  struct byte_totals {
    std::size_t requested = 0;
    std::size_t requested_freed = 0;
    std::size_t allocated = 0;
    std::size_t allocated_freed = 0;
    std::size_t reserved = 0;
    std::size_t reserved_freed = 0;
  } totals;

  /// Peaks since the last statistics_adaptor::reset_peaks() (or the start):
  /// PyTorch's resettable peaks (reset_peak_memory_stats). The peaks above
  /// are the allocator's whole life and never reset.
  struct window_peaks {
    std::size_t requested = 0;
    std::size_t allocated = 0;
    std::size_t reserved = 0;
    std::uint64_t live_blocks = 0;
  } window_peak;

  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::uint64_t ooms = 0;     ///< allocate calls that threw out_of_memory
  std::uint64_t retries = 0;  ///< allocations that succeeded only after releasing cache
  std::uint64_t misuse_not_owned = 0;
  std::uint64_t misuse_size_mismatch = 0;
  backend_counters backend_calls;
  pool_state pool;  ///< cache state when the stats were taken

  std::array<std::uint64_t, size_histogram_buckets> size_histogram{};
  /// Sum of the bytes of the requests size_histogram counts (a histogram's _sum).
  std::uint64_t size_histogram_sum = 0;

  /// The latest OOM failures, oldest first, at most oom_events_kept (the
  /// count of all of them is `ooms`), each with its diagnosis.
  std::vector<oom_event> oom_events;

  /// The whole device's memory, beside the allocator's: what a report needs
  /// to tell the device memory that is not fragctl's (docs/reports.md,
  /// "Every rank side by side").
  struct device_memory_figures {
    /// free and total were asked of the backend (memory_info) just after
    /// the other figures were read: allocator_stack does this for the
    /// report file only, so other statistics leave it false.
    bool measured = false;
    std::size_t free = 0;   ///< device bytes free, as the runtime reports them
    std::size_t total = 0;  ///< device bytes in all
    /// Device bytes held outside this allocator when it was built (the
    /// runtime's context, libraries loaded before it, other processes);
    /// always set by statistics_adaptor.
    std::size_t outside_at_start = 0;
    /// The used memory split by whose it is (fragctl/device_memory.hpp),
    /// taken with free and total; absent in earlier reports.
    std::optional<device_memory_split> split;
  } device_memory;

  /// peak reserved / peak requested; 1.0 is ideal; 0 when nothing was requested.
  [[nodiscard]] double reserved_over_requested() const noexcept;
  /// 1 - peak requested / peak reserved.
  [[nodiscard]] double fragmentation() const noexcept;
  /// 1 - largest free block / total free in cache (0 when the cache is empty).
  [[nodiscard]] double external_fragmentation() const noexcept;
  /// allocated - requested now: bytes lost to rounding.
  [[nodiscard]] std::size_t internal_waste() const noexcept;
};

/// Histogram bucket of a request size.
[[nodiscard]] std::size_t size_histogram_bucket(std::size_t bytes) noexcept;

/// The JSON report (schema `stats_schema_version`), pretty-printed.
[[nodiscard]] std::string to_json(const allocator_stats& s);
/// Prometheus text exposition format, metrics prefixed `fragctl_`, labelled
/// with allocator, backend and device.
[[nodiscard]] std::string to_prometheus(const allocator_stats& s);

/// Reads statistics back from to_json's output, or from a FRAGCTL_REPORT
/// document (fragctl/stats_export.hpp) holding exactly one allocator. Fields
/// missing from the document stay zero (older writers); a wrong type, a
/// schema_version newer than stats_schema_version, or a document of several
/// allocators is an error.
[[nodiscard]] absl::StatusOr<allocator_stats> stats_from_json(std::string_view json);

}  // namespace fragctl
