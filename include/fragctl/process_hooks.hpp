// The process lifecycle that the stats export (fragctl/stats_export.hpp) and
// traces (tracing_adaptor) share (docs/reliability.md, "Process lifecycle"): one
// mechanism writes every output on exit(), on SIGTERM / SIGINT / SIGUSR1 and
// on an explicit flush, and keeps them sane across fork().
//
//  - exit(): one atexit hook flushes every client (reason "exit").
//  - Signals: one handler for SIGTERM, SIGINT and SIGUSR1 that only writes
//    the signal number to a self-pipe (async-signal-safe); a writer thread
//    flushes every client (reason "signal"). For SIGTERM and SIGINT it then
//    restores the default action and re-raises the signal, so the process
//    ends as it would have without fragctl. A handler installed before
//    fragctl's is called from fragctl's, and then fragctl does not re-raise;
//    a signal the process ignores is left ignored. A second SIGTERM or SIGINT
//    while the first is being written ends the process at once.
//  - fork(): pthread_atfork, as malloc implementations do it. Before fork
//    every client takes its locks (clients in ascending `layer` order: a
//    lower layer's locks are taken first); the parent and the child release
//    them; the child's clients then forget what they inherited, so a child
//    never writes its parent's report or trace rows.
//  - Paths: expand_output_path is the one rule for the file an output goes
//    to: "%p" in the path, a forked child's ".<pid>", and one writing process
//    per path (a second process that finds a path claimed writes
//    "<path>.<pid>"); the claims themselves are core/output_paths.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace fragctl {

/// Something that holds output to write at the process's end. Every member
/// is called with the hooks' own lock held, and must not call back into
/// add_process_client / remove_process_client.
class process_client {
 public:
  virtual ~process_client() = default;
  /// Writes what the client holds; returns the files written. `reason` is
  /// "exit", "signal" or "request".
  virtual std::size_t flush(std::string_view reason) noexcept = 0;
  /// Before fork(): take every lock the client's state is guarded by.
  virtual void fork_prepare() noexcept {}
  /// After fork(), in the parent: release them.
  virtual void fork_parent() noexcept {}
  /// After fork(), in the child: release them and forget the parent's state.
  virtual void fork_child() noexcept {}
};

/// Lock order between clients: the stats export registry (whose lock is taken
/// before the allocators' locks) comes before the trace sinks (whose locks an
/// allocator takes while holding its own), and the table of open trace files
/// (which takes no client's lock inside its own) after them.
inline constexpr int process_layer_stats_export = 0;
inline constexpr int process_layer_traces = 1;
inline constexpr int process_layer_trace_files = 2;

/// Adds `client` (not owned; it must stay alive until removed). The first
/// call installs the exit hook, the signal handlers and the fork handlers,
/// and starts the writer thread (again in a forked child). Thread-safe.
void add_process_client(process_client& client, int layer);

/// Removes `client`; after it returns the client is never called again.
/// Thread-safe; an unknown client is ignored.
void remove_process_client(process_client& client) noexcept;

/// Flushes every client now (fragctl_flush, fragctl.flush()): before
/// os._exit() or an exec, nothing buffered is lost. Returns the files
/// written. Thread-safe.
std::size_t flush_process_outputs(std::string_view reason = "request") noexcept;

/// Counts one output (report, Prometheus file, trace) that could not be
/// written; clients call it where they log the failure.
void note_output_failure() noexcept;

/// Outputs that could not be written so far in this process.
[[nodiscard]] std::uint64_t output_failures() noexcept;

/// Installs the signal handlers, the exit hook and the fork handlers without
/// a client, so that SIGUSR1 sent before the first allocator exists does not
/// end the process. Idempotent; thread-safe.
void install_process_hooks();

/// An output path as this process writes it: every "%p" and "{pid}"
/// replaced by the process id, "%%" by "%", and "{rank}", "{local_rank}",
/// "{world_size}" and "{host}" by the launcher's figures
/// (docs/configuration.md, "Output paths"; a rank no launcher gives becomes
/// the process id). In a process started by fork() from one that had loaded
/// fragctl, a path without the pid gets ".<pid>" appended, so a child never
/// writes over its parent's file. Otherwise a path without the pid is
/// claimed by this process while an output of it (a report registration, a
/// trace file) names the path, and released with the last: if another running
/// process claimed it first (ranks started separately, given one
/// FRAGCTL_TRACE or FRAGCTL_REPORT), this process writes "<path>.<pid>"
/// instead (with an unpredictable suffix added when that process is another
/// user's) and logs one warning saying so. This function reads the claim; it
/// takes none: a path no output holds is returned as it is. Thread-safe.
[[nodiscard]] std::string expand_output_path(std::string_view path);

/// True in a process started by fork() from one where the hooks were installed.
[[nodiscard]] bool is_forked_child() noexcept;

}  // namespace fragctl
