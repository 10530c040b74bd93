// The statistics export (FRAGCTL_REPORT, DESIGN.md "Configuration"): a JSON
// file holding the statistics of every allocator that named it, written
// atomically (temporary file + rename) when such an allocator is destroyed,
// at process exit for those still alive, on SIGUSR1, and on request. The
// environment variable, the config keys (report, report_interval,
// report_map) and the C API (fragctl_write_report) keep the user's word
// "report"; the code calls the machinery stats_export, so that "report"
// means only the `fragctl report` model (fragctl/run_report.hpp).
//
// Document shape (docs/statistics.md):
//   {"schema_version": 1, "reason": "exit", "pid": 123, "time_unix_s": ...,
//    "allocators": [ <to_json of each allocator>, ... ],
//    "hangs": [ <record_stats_export_hang's records> ]}  (only when there are some)
// Allocators appear in registration order; one destroyed earlier in the
// process stays in the document with its final statistics (the last
// stats_export_retired_kept of them per file: the registry forgets older
// ones, so creating and destroying allocators costs no more over time).
//
// Process lifecycle (fragctl/process_hooks.hpp, docs/reports.md): exports are
// written at exit(), on SIGTERM, SIGINT and SIGUSR1, and on
// flush_process_outputs(). Around fork() the registry takes its lock and the
// lock of every live allocator that gave one; a forked child starts with an
// empty registry and writes only the exports of allocators it creates
// itself, under expand_output_path's rule ("%p" is the pid; without it a
// forked child appends ".<pid>"). Temporary files are created exclusively
// beside the target under an unpredictable name, then renamed over it.
//
// Live export (docs/reports.md). A registration may also name a Prometheus
// text file (for a node exporter's textfile collector; written atomically
// like the JSON) and an interval: a background thread then rewrites every
// JSON and Prometheus file that has a live allocator that often (reason
// "interval"). The interval is process-wide: the shortest one registered. A
// registration may give a memory map source: each allocator's entry of the
// JSON document then carries its "memory_map" (fragctl/memory_map.hpp).
//
// Hangs (docs/reports.md, "Hangs"). A collective that passed its deadline is
// recorded once for the process (record_stats_export_hang): every document
// the process writes afterwards carries the records under "hangs", beside
// "allocators".
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fragctl/memory_map.hpp"
#include "fragctl/stats.hpp"

namespace fragctl {

/// One allocator of a stats export document: its statistics and, where
/// taken, its memory map (written as "memory_map" beside the statistics).
struct stats_export_entry {
  allocator_stats stats;
  std::optional<memory_snapshot> map;
};

/// The stats export document for `allocators` (pretty-printed JSON).
/// `reason` says what caused the write: "destroy", "exit", "signal"
/// (SIGUSR1, SIGTERM, SIGINT), "request" or "interval".
[[nodiscard]] std::string stats_export_to_json(const std::vector<stats_export_entry>& allocators,
                                               std::string_view reason);

/// Reads a stats export document (or a single to_json object, as a list of
/// one); memory maps are not read back. Errors name the entry and field that
/// is wrong.
[[nodiscard]] absl::StatusOr<std::vector<allocator_stats>> stats_export_from_json(std::string_view json);

/// Writes stats_export_to_json(allocators, reason) to `path` atomically: a
/// reader sees the old file or the new one, never a torn one.
[[nodiscard]] absl::Status write_stats_export_file(const std::string& path,
                                                   const std::vector<stats_export_entry>& allocators,
                                                   std::string_view reason);

/// Produces the current statistics of one live allocator. Called with the
/// registry's lock held, from any thread (the SIGUSR1 writer included).
using stats_source = std::function<allocator_stats()>;

/// Produces the memory map of one live allocator, under the same rules as
/// stats_source.
using memory_map_source = std::function<memory_snapshot()>;

/// Where and how often one allocator's statistics are written.
struct stats_export_outputs {
  std::string json_path;        ///< the JSON document (FRAGCTL_REPORT); empty: none
  std::string prometheus_path;  ///< Prometheus text (FRAGCTL_PROMETHEUS); empty: none
  /// Rewrite period (FRAGCTL_REPORT_INTERVAL); zero: only on destroy, exit,
  /// signal and request.
  std::chrono::milliseconds interval{0};
};

/// The rewrite period of a Prometheus file registered without an interval:
/// a textfile collector wants fresh numbers, not only those at exit.
inline constexpr std::chrono::milliseconds default_prometheus_interval{15000};

/// Most blocks a memory map in the JSON document lists; beyond, its segments
/// are written without their blocks (memory_map.hpp's to_json).
inline constexpr std::size_t stats_export_map_max_blocks = 50000;

/// Destroyed allocators whose final statistics an export file keeps.
inline constexpr std::size_t stats_export_retired_kept = 64;

/// Adds a live allocator, identified by `owner`, to the files `outputs`
/// names: the JSON document and/or a Prometheus file, a rewrite interval (a
/// nonzero one starts the interval thread, once per process) and an optional
/// memory map source for the JSON document. Empty paths are ignored. The
/// allocator keeps its own locks safe across fork() (a thread_safe_adaptor
/// does; fragctl/process_hooks.hpp). Thread-safe. The first call installs the
/// process hooks (fragctl/process_hooks.hpp), whose flush writes every file
/// that has a live allocator (flush_process_outputs).
void register_stats_export(const void* owner, const stats_export_outputs& outputs, stats_source source,
                           memory_map_source map_source = {});

/// Takes `owner`'s final statistics, stops calling its source and rewrites its
/// files (reason "destroy"). Call before the allocator is torn down; after
/// it returns the source is never called again. Thread-safe; unknown owners
/// are ignored.
void retire_stats_export(const void* owner) noexcept;

/// Hang records a document keeps: the newest ones, oldest first.
inline constexpr std::size_t stats_export_hangs_kept = 16;

/// Records a collective that passed its deadline: `record` is one JSON
/// object (docs/reports.md, "Hangs": the collective, its number, block and
/// modules, the ranks that had not entered it and where each last was, the
/// deadline and the time waited). Every stats export document written by
/// this process afterwards carries it under "hangs" (the newest
/// stats_export_hangs_kept). Writes nothing itself: the caller flushes
/// (flush_process_outputs). InvalidArgument for text that is not a JSON
/// object. Thread-safe; a forked child starts with none.
[[nodiscard]] absl::Status record_stats_export_hang(std::string_view record);

/// The hang records so far, oldest first, as JSON text.
[[nodiscard]] std::vector<std::string> stats_export_hangs();

/// Prometheus text of several allocators: to_prometheus of each, merged so
/// that every metric family appears once (HELP and TYPE lines first, then
/// each allocator's samples).
[[nodiscard]] std::string prometheus_text(const std::vector<allocator_stats>& allocators);

}  // namespace fragctl
