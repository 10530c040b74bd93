// Adaptors: cross-cutting work wrapped around an upstream allocator
// (DESIGN.md, "The allocator interface and stream order"). Each owns its
// upstream and forwards to it (forwarding_adaptor) every call it does not
// change; none changes where blocks live, and each answers name() with its
// upstream's name, so a stack of adaptors over a policy chain is named by the
// policy expression.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "fragctl/device_allocator.hpp"
#include "fragctl/error.hpp"
#include "fragctl/stats.hpp"

namespace fragctl {

/// The base of the adaptors: owns the upstream and forwards every call to it
/// unchanged, so an adaptor overrides only the calls it changes. Frees are
/// forwarded with try_deallocate (only the outermost allocator reports
/// misuse). Thread-safety is the upstream's.
class forwarding_adaptor : public device_allocator {
 public:
  [[nodiscard]] device_allocator& upstream() const noexcept { return *upstream_; }

 protected:
  /// Throws invalid_argument naming `adaptor` when `upstream` is null.
  forwarding_adaptor(std::unique_ptr<device_allocator> upstream, std::string_view adaptor);

  /// The first allocator below that is not an adaptor (the policy chain):
  /// no adaptor changes allocation_size, so upstream().allocation_size(n)
  /// equals sizer().allocation_size(n), reached with one virtual call
  /// instead of one per adaptor in between (the hot paths ask it on every
  /// allocate and free).
  [[nodiscard]] const device_allocator& sizer() const noexcept { return *sizer_; }

 private:
  void* do_allocate(std::size_t bytes, stream_t stream) override;
  free_result do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override;
  /// Final: sizer() relies on no adaptor changing it.
  std::size_t do_allocation_size(std::size_t bytes) const noexcept final;
  pool_state do_state() const override;
  void do_release_cached() override;
  device_backend& do_backend() const noexcept override;
  std::string_view do_name() const noexcept override;
  memory_snapshot do_memory_map() const override;
  void do_record_stream(void* ptr, stream_t stream) override;
  bool do_pause(pause_keep keep) override;
  bool do_resume() override;
  bool do_paused() const override;
  std::optional<block_record> do_block_info(void* ptr) const override;
  void do_enable_peer_access(int peer) override;
  shared_memory do_share(void* ptr, std::size_t bytes) const override;
  std::optional<free_result> do_check_free(void* ptr, std::size_t bytes) const override;
  void do_stream_ending(stream_t stream) override;

  std::unique_ptr<device_allocator> upstream_;
  const device_allocator* sizer_ = nullptr;
};

/// Counts requested and allocated bytes (current, peak), allocations, frees,
/// OOMs, retries and a log2 size histogram; reads reserved bytes and backend
/// calls from the backend's counters. Keeps the latest OOM failures with
/// their diagnosis (fragctl/oom.hpp) and logs each as one warning line (the
/// first oom_events_kept, then the 16th, 32nd, ...). Not thread-safe for concurrent
/// allocate/deallocate (wrap in thread_safe_adaptor); stats() may be called
/// from any thread at any time and sees each field atomically.
class statistics_adaptor final : public forwarding_adaptor {
 public:
  explicit statistics_adaptor(std::unique_ptr<device_allocator> upstream);
  ~statistics_adaptor() override;
  /// A snapshot in the one schema of fragctl/stats.hpp. Counters are read
  /// atomically from any thread; the pool state comes from upstream().state(),
  /// which is only safe while no other thread uses the upstream.
  [[nodiscard]] allocator_stats stats() const;
  /// The same with a pool state the caller took safely, e.g. through the
  /// thread_safe_adaptor above this one (allocator_stack::stats does).
  [[nodiscard]] allocator_stats stats(const pool_state& pool) const;
  /// Starts a new window for allocator_stats::window_peak (peaks become the
  /// current values), the backend's too. Callable from any thread; a
  /// concurrent allocation may be missed by the new window's peak.
  void reset_peaks() noexcept;

 private:
  void* do_allocate(std::size_t bytes, stream_t stream) override;
  free_result do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override;

  /// Keeps and logs the OOM event; returns its split of the device memory
  /// (nullopt where none was taken).
  std::optional<device_memory_split> record_oom(const oom_details& details, stream_t stream) noexcept;

  struct counters;
  std::unique_ptr<counters> counters_;
  std::size_t outside_at_start_ = 0;  ///< device bytes held outside the upstream at construction
};

/// Honours record_stream (device_allocator::record_stream): a block that work
/// on other streams used is handed back to the upstream only once each of
/// those streams has passed the point of the free, judged by the one
/// stream-order helper (core/stream_clock.hpp); until then it stays
/// allocated upstream, so neither the policy nor the device can reuse it.
/// Frees of blocks no other stream used go straight through (one branch on
/// an empty table). Deferred frees are handed back, oldest first, on later
/// allocations once their events are seen complete (never blocking); an
/// allocation that finds no memory waits for all of them and retries once;
/// release_cached and destruction wait for them too. Not thread-safe (wrap
/// it in thread_safe_adaptor; allocator_stack does).
class stream_use_adaptor final : public forwarding_adaptor {
 public:
  explicit stream_use_adaptor(std::unique_ptr<device_allocator> upstream);
  ~stream_use_adaptor() override;
  /// Frees waiting for other streams.
  [[nodiscard]] std::size_t deferred() const noexcept;

 private:
  void* do_allocate(std::size_t bytes, stream_t stream) override;
  free_result do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override;
  void do_release_cached() override;
  void do_record_stream(void* ptr, stream_t stream) override;
  std::optional<free_result> do_check_free(void* ptr, std::size_t bytes) const override;
  void do_stream_ending(stream_t stream) override;
  // The halves of do_allocate and do_deallocate for when frees wait or
  // blocks were used on other streams, out of line, so that the common
  // case (neither) is one check and a call straight to the upstream.
  void* allocate_handing_back(std::size_t bytes, stream_t stream);
  free_result deallocate_recorded(void* ptr, std::size_t bytes, stream_t stream) noexcept;

  struct impl;
  std::unique_ptr<impl> impl_;
};

/// Serializes every call to the upstream with one mutex, except
/// allocation_size, backend and name, which are pure functions of the
/// upstream's configuration and forwarded without it. Fork-safe: the mutex
/// is held across fork() (fragctl/process_hooks.hpp), so a forked child
/// inherits the allocator consistent and unlocked, whatever the parent's
/// threads were doing; when a signal ends the process it stays held from
/// before the report and the trace are written, so both describe one moment.
class thread_safe_adaptor final : public forwarding_adaptor {
 public:
  explicit thread_safe_adaptor(std::unique_ptr<device_allocator> upstream);
  ~thread_safe_adaptor() override;
  /// Holds the mutex across fork() (defined in the source).
  struct process_guard;
  /// Runs `body(upstream())` under the mutex: several calls to the upstream
  /// that no other thread may come between (graph_pool_reclaim).
  template <class Body>
  decltype(auto) exclusive(Body&& body) {
    const std::lock_guard lock(mutex_);
    return body(upstream());
  }

 private:
  void* do_allocate(std::size_t bytes, stream_t stream) override;
  free_result do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override;
  pool_state do_state() const override;
  void do_release_cached() override;
  memory_snapshot do_memory_map() const override;
  void do_record_stream(void* ptr, stream_t stream) override;
  bool do_pause(pause_keep keep) override;
  bool do_resume() override;
  bool do_paused() const override;
  std::optional<block_record> do_block_info(void* ptr) const override;
  void do_enable_peer_access(int peer) override;
  shared_memory do_share(void* ptr, std::size_t bytes) const override;
  std::optional<free_result> do_check_free(void* ptr, std::size_t bytes) const override;
  void do_stream_ending(stream_t stream) override;

  mutable std::mutex mutex_;
  std::unique_ptr<process_guard> guard_;
};

/// Keeps the live-block table: the request size and allocation stream of
/// every block it hands out, until it is freed (device_allocator::block_info).
/// For callers that free by pointer alone (PyTorch's native allocator
/// interface); allocator_stack adds it with cfg.block_table. One hash insert
/// per allocation and one erase per free. Not thread-safe (wrap it in
/// thread_safe_adaptor).
class block_table_adaptor final : public forwarding_adaptor {
 public:
  explicit block_table_adaptor(std::unique_ptr<device_allocator> upstream);
  ~block_table_adaptor() override;
  /// Live blocks in the table.
  [[nodiscard]] std::size_t size() const noexcept;

 private:
  void* do_allocate(std::size_t bytes, stream_t stream) override;
  free_result do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override;
  std::optional<block_record> do_block_info(void* ptr) const override;
  void do_stream_ending(stream_t stream) override;

  struct table;
  std::unique_ptr<table> table_;
};

/// Refuses (out_of_memory, nothing changed) any allocation that would take the
/// bytes it holds live above `limit`, counting each request at the upstream's
/// allocation_size (its rounded size). Not thread-safe (wrap in
/// thread_safe_adaptor).
class limiting_adaptor final : public forwarding_adaptor {
 public:
  /// `limit` SIZE_MAX: no cap (until set_limit sets one).
  limiting_adaptor(std::unique_ptr<device_allocator> upstream, std::size_t limit);
  [[nodiscard]] std::size_t limit() const noexcept { return limit_.load(std::memory_order_relaxed); }
  /// Changes the cap from any thread; blocks already allocated stay (a cap
  /// below used() refuses every allocation until enough is freed).
  void set_limit(std::size_t limit) noexcept { limit_.store(limit, std::memory_order_relaxed); }
  [[nodiscard]] std::size_t used() const noexcept { return used_; }

 private:
  void* do_allocate(std::size_t bytes, stream_t stream) override;
  free_result do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override;

  std::atomic<std::size_t> limit_;
  std::size_t used_ = 0;
};

/// The line a tracing_adaptor writes after the header of every trace: its
/// writer ends what it wrote with an `end` row (docs/traces.md), so a reader
/// tells a file without one at its end as cut (a comment: every reader skips it).
inline constexpr std::string_view trace_end_row_promise = "# fragctl trace: complete when its last row is an end row";

/// Writes every allocate and free as a row of fragctl's trace CSV
/// (action,addr,size,stream,time_us; actions alloc and free_requested) to a
/// file, so `fragctl replay` can replay it. Not thread-safe (wrap it); the
/// file's buffer has its own lock. Adaptors of one process given one path
/// (after expand_output_path: "%p" is the pid) share one file. Rows reach the
/// file when the buffer fills, at destruction, and at every process flush
/// (fragctl/process_hooks.hpp: exit, SIGTERM/SIGINT/SIGUSR1, fragctl_flush).
class tracing_adaptor final : public forwarding_adaptor {
 public:
  /// Opens `path` for writing; throws fragctl::error if it cannot.
  tracing_adaptor(std::unique_ptr<device_allocator> upstream, const std::string& path);
  ~tracing_adaptor() override;
  /// Flushes buffered rows to the file.
  void flush();
  /// The file the rows go to (defined in the source).
  struct sink;

 private:
  void* do_allocate(std::size_t bytes, stream_t stream) override;
  free_result do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override;

  std::shared_ptr<sink> sink_;  // shared by the tracing adaptors of one path
};

}  // namespace fragctl
