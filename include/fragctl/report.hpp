// The statistics report (FRAGCTL_REPORT, DESIGN.md "Configuration"): a JSON
// file holding the statistics of every allocator that named it, written
// atomically (temporary file + rename) when such an allocator is destroyed,
// at process exit for those still alive, on SIGUSR1, and on request.
//
// Document shape (docs/statistics.md):
//   {"schema_version": 1, "reason": "exit", "pid": 123, "time_unix_s": ...,
//    "allocators": [ <to_json of each allocator>, ... ]}
// Allocators appear in registration order; one destroyed earlier in the
// process stays in the report with its final statistics.
//
// Signals. The first registration installs a SIGUSR1 handler (chaining to a
// handler installed before it) that only writes a byte to a pipe; a
// background thread does the writing, so nothing unsafe runs in the handler.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fragctl/stats.hpp"

namespace fragctl {

/// The report document for `allocators` (pretty-printed JSON). `reason` says
/// what caused the write: "destroy", "exit", "signal" or "request".
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

/// Produces the current statistics of one live allocator. Called with the
/// registry's lock held, from any thread (the SIGUSR1 writer included).
using stats_source = std::function<allocator_stats()>;

/// Adds a live allocator, identified by `owner`, to the report at `path`.
/// Thread-safe. The first call installs the SIGUSR1 handler and the exit hook.
void register_report_source(const void* owner, std::string path, stats_source source);

/// Takes `owner`'s final statistics, stops calling its source and rewrites its
/// report (reason "destroy"). Call before the allocator is torn down; after
/// it returns the source is never called again. Thread-safe; unknown owners
/// are ignored.
void retire_report_source(const void* owner) noexcept;

/// Writes now every report that has a live allocator (a report whose
/// allocators are all destroyed already holds their final statistics).
/// Returns the number of files written; failures are logged. Thread-safe.
std::size_t write_reports(std::string_view reason = "request") noexcept;

/// Report files written by this process so far (for tests and tools that
/// wait for a SIGUSR1 report).
[[nodiscard]] std::uint64_t reports_written() noexcept;

}  // namespace fragctl
