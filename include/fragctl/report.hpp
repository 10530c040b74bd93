// The statistics report (FRAGCTL_REPORT, DESIGN.md "Configuration"): a JSON
// file holding the statistics of every allocator that named it, written
// atomically (temporary file + rename) when such an allocator is destroyed,
// at process exit for those still alive, on SIGUSR1, and on request.
//
// Document shape (docs/statistics.md):
//   {"schema_version": 1, "reason": "exit", "pid": 123, "time_unix_s": ...,
//    "allocators": [ <to_json of each allocator>, ... ]}
// Allocators appear in registration order; one destroyed earlier in the
// process stays in the report with its final statistics (the last
// report_retired_kept of them per file: the registry forgets older ones, so
// creating and destroying allocators costs no more over time).
//
// Process lifecycle (fragctl/process_hooks.hpp, docs/reports.md): reports are
// written at exit(), on SIGTERM, SIGINT and SIGUSR1, and on
// flush_process_outputs(). Around fork() the registry takes its lock and the
// lock of every live allocator that gave one; a forked child starts with an
// empty registry and writes only reports of allocators it creates itself,
// under expand_output_path's rule ("%p" is the pid; without it a forked
// child appends ".<pid>"). Temporary files are created exclusively beside the
// target under an unpredictable name, then renamed over it.
//
// Live export (docs/reports.md). A registration may also name a Prometheus
// text file (for a node exporter's textfile collector; written atomically
// like the JSON) and an interval: a background thread then rewrites every
// report and Prometheus file that has a live allocator that often (reason
// "interval"). The interval is process-wide: the shortest one registered. A
// registration may give a memory map source: each allocator's entry of the
// JSON document then carries its "memory_map" (fragctl/memory_map.hpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fragctl/memory_map.hpp"
#include "fragctl/stats.hpp"

namespace fragctl {

/// The report document for `allocators` (pretty-printed JSON). `reason` says
/// what caused the write: "destroy", "exit", "signal" (SIGUSR1, SIGTERM, SIGINT), "request" or
/// "interval".
[[nodiscard]] std::string report_to_json(const std::vector<allocator_stats>& allocators,
                                         std::string_view reason);

/// Reads a report document (or a single to_json object, as a list of one).
/// Errors name the entry and field that is wrong.
[[nodiscard]] absl::StatusOr<std::vector<allocator_stats>> report_from_json(std::string_view json);

/// Writes report_to_json(allocators, reason) to `path` atomically: a reader
/// sees the old file or the new one, never a torn one.
[[nodiscard]] absl::Status write_report_file(const std::string& path,
                                             const std::vector<allocator_stats>& allocators,
                                             std::string_view reason);

/// One allocator of a report document: its statistics and, where taken, its
/// memory map (written as "memory_map" beside the statistics).
struct allocator_report {
  allocator_stats stats;
  std::optional<memory_snapshot> map;
};

/// write_report_file with each allocator's memory map where given.
[[nodiscard]] absl::Status write_report_file(const std::string& path, const std::vector<allocator_report>& allocators,
                                             std::string_view reason);

/// Produces the current statistics of one live allocator. Called with the
/// registry's lock held, from any thread (the SIGUSR1 writer included).
using stats_source = std::function<allocator_stats()>;

/// Produces the memory map of one live allocator, under the same rules as
/// stats_source.
using memory_map_source = std::function<memory_snapshot()>;

/// Where and how often one allocator's statistics are written.
struct report_outputs {
  std::string json_path;        ///< the JSON report (FRAGCTL_REPORT); empty: none
  std::string prometheus_path;  ///< Prometheus text (FRAGCTL_PROMETHEUS); empty: none
  /// Rewrite period (FRAGCTL_REPORT_INTERVAL); zero: only on destroy, exit,
  /// signal and request.
  std::chrono::milliseconds interval{0};
};

/// The rewrite period of a Prometheus file registered without an interval:
/// a textfile collector wants fresh numbers, not only those at exit.
inline constexpr std::chrono::milliseconds default_prometheus_interval{15000};

/// Most blocks a memory map in the JSON report lists; beyond, its segments
/// are written without their blocks (memory_map.hpp's to_json).
inline constexpr std::size_t report_map_max_blocks = 50000;

/// Destroyed allocators whose final statistics a report file keeps.
inline constexpr std::size_t report_retired_kept = 64;

/// The lock that guards one allocator's state, for fork(): the registry takes
/// it before fork and releases it after, in the parent and in the child.
/// Both empty for an allocator that has no lock (not thread-safe).
struct allocator_lock {
  std::function<void()> lock;
  std::function<void()> unlock;
};

/// Adds a live allocator, identified by `owner`, to the reports `outputs`
/// names: the JSON report and/or a Prometheus file, a rewrite interval (a
/// nonzero one starts the interval thread, once per process), an optional
/// memory map source for the JSON report, and the allocator's lock for
/// fork(). Empty paths are ignored. Thread-safe. The first call installs the
/// process hooks (fragctl/process_hooks.hpp).
void register_report_source(const void* owner, const report_outputs& outputs, stats_source source,
                            memory_map_source map_source = {}, allocator_lock lock = {});

/// Prometheus text of several allocators: to_prometheus of each, merged so
/// that every metric family appears once (HELP and TYPE lines first, then
/// each allocator's samples).
[[nodiscard]] std::string prometheus_text(const std::vector<allocator_stats>& allocators);

/// Writes prometheus_text(allocators) to `path` atomically (temporary file
/// in the same directory + rename), as a textfile collector requires.
[[nodiscard]] absl::Status write_prometheus_file(const std::string& path,
                                                 const std::vector<allocator_stats>& allocators);

/// Takes `owner`'s final statistics, stops calling its source and rewrites its
/// report (reason "destroy"). Call before the allocator is torn down; after
/// it returns the source is never called again. Thread-safe; unknown owners
/// are ignored.
void retire_report_source(const void* owner) noexcept;

/// Writes now every report that has a live allocator (a report whose
/// allocators are all destroyed already holds their final statistics).
/// Returns the number of files written; failures are logged. Thread-safe.
/// flush_process_outputs() does this and also flushes traces.
std::size_t write_reports(std::string_view reason = "request") noexcept;

/// Report files written by this process so far (for tests and tools that
/// wait for a SIGUSR1 report).
[[nodiscard]] std::uint64_t reports_written() noexcept;

}  // namespace fragctl
