// The process lifecycle that the stats export (fragctl/stats_export.hpp),
// traces (tracing_adaptor) and thread-safe allocators share
// (docs/reliability.md, "Process lifecycle"): one mechanism writes every
// output on exit(), on a signal and on an explicit flush, and keeps every
// allocator usable across fork().
//
//  - exit(): one atexit hook flushes every client (reason "exit").
//  - Signals: one handler that only writes the signal number to a self-pipe
//    (async-signal-safe); a writer thread flushes every client (reason
//    "signal"). SIGUSR1 only writes. SIGTERM and SIGINT end the process:
//    the writer restores the default action and re-raises the signal, so the
//    process ends as it would have without fragctl; a handler installed
//    before fragctl's is called from fragctl's instead, and then fragctl does
//    not re-raise; a signal the process ignores is left ignored. SIGHUP,
//    SIGQUIT, SIGABRT, SIGALRM and SIGUSR2 are caught only where their action
//    is the default (the process ends by them) and then end the process the
//    same way. Before the last flush the writer freezes every client
//    (process_client::freeze): no allocator changes between the report and
//    the trace's end row. A terminating signal a thread sent itself (raise(),
//    abort()) keeps that thread in the handler until the writer ends the
//    process, as the signal would have ended it there; after
//    self_signal_wait_s without that, the handler ends the process itself. A
//    second terminating signal while the first is being written ends the
//    process at once.
//  - fork(): pthread_atfork, as malloc implementations do it. Before fork
//    every client takes its locks (clients in ascending `layer` order, the
//    newest first within a layer); the parent and the child release them;
//    the child's clients then forget what they inherited, so a child never
//    writes its parent's report or trace rows. Then the leaf locks
//    (util/fork_safe_mutex.hpp) and, last, the logger's.
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
  /// Before the last flush of a process a signal ends, on the writer thread:
  /// take the locks that keep other threads from changing what any client
  /// writes, and keep them (the process ends after the flush). The flush
  /// that follows runs on this thread with them held: a client must not take
  /// them again where outputs_frozen_by_this_thread().
  virtual void freeze() noexcept {}
};

/// Lock order between clients: the stats export registry (whose lock is held
/// while it reads allocators) comes first, then the thread-safe allocators
/// (an adaptor is created after the allocator it wraps: newest first within
/// the layer takes a wrapper's lock before its upstream's, as a call does),
/// then the trace sinks (whose locks an allocator takes while holding its
/// own), and the table of open trace files (which takes no client's lock
/// inside its own) last.
inline constexpr int process_layer_stats_export = 0;
inline constexpr int process_layer_allocators = 1;
inline constexpr int process_layer_traces = 2;
inline constexpr int process_layer_trace_files = 3;

/// How long a thread that sent itself a terminating signal waits in the
/// handler for the writer to end the process (a lock the writer needs is
/// held by that very thread) before it ends the process itself.
inline constexpr int self_signal_wait_s = 10;

/// Adds `client` (not owned; it must stay alive until removed). The first
/// call installs the exit hook and the signal handlers, and starts the writer
/// thread (again in a forked child). Thread-safe.
void add_process_client(process_client& client, int layer);

/// Adds a client that writes nothing, only holds locks across fork() (and
/// for the last flush): installs no exit hook, no signal handler and no
/// thread. Thread-safe; must not be called with a client's lock held.
void add_fork_client(process_client& client, int layer);

/// Removes `client`; after it returns the client is never called again.
/// Thread-safe; an unknown client is ignored.
void remove_process_client(process_client& client) noexcept;

/// Flushes every client now (fragctl_flush, fragctl.flush()): before
/// os._exit() or an exec, nothing buffered is lost. Returns the files
/// written. Thread-safe.
std::size_t flush_process_outputs(std::string_view reason = "request") noexcept;

/// Counts one output (report, Prometheus file, trace) that could not be
/// written, `what` saying which and why; clients call it where they log
/// the failure.
void note_output_failure(std::string_view what) noexcept;

/// Outputs that could not be written so far in this process.
[[nodiscard]] std::uint64_t output_failures() noexcept;

/// What the latest note_output_failure said ("" before any).
[[nodiscard]] std::string last_output_failure();

/// Installs the signal handlers, the exit hook and the fork handlers without
/// a client, so that SIGUSR1 sent before the first allocator exists does not
/// end the process. SIGINT's handler waits for the first client that writes
/// outputs: a program that takes SIGINT only where its action is the default
/// (CPython) must find the default when it starts. Idempotent; thread-safe.
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

/// True on the writer thread once it has frozen every client for the last
/// flush (process_client::freeze): the clients' locks are this thread's.
[[nodiscard]] bool outputs_frozen_by_this_thread() noexcept;

}  // namespace fragctl
