// The library's entry point: an allocator ready for use, built from the
// configuration (FRAGCTL_BACKEND, FRAGCTL_POLICY, FRAGCTL_CONF) as rmm's
// resource stacks are built by hand: the backend, the policy chain
// (fragctl/policy.hpp) and the adaptors around it (fragctl/adaptors.hpp).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "fragctl/backend.hpp"
#include "fragctl/config.hpp"
#include "fragctl/device_allocator.hpp"
#include "fragctl/stats.hpp"

namespace fragctl {

class statistics_adaptor;
class limiting_adaptor;
struct stats_export_entry;  // fragctl/stats_export.hpp

/// The backend it owns, the policy chain, and the adaptors the configuration
/// asks for, from the outside in: thread_safe (if cfg.thread_safe) > tracing
/// (if cfg.trace_path) > statistics > block_table (if cfg.block_table) >
/// stream_use (record_stream) > limiting (cfg.limit, or none until
/// set_limit) > policy.
///
/// Construction applies cfg.log_level (set_log_level) when it names one
/// (empty, as from options alone, leaves the process's level) and throws
/// invalid_argument for an unknown level or a bad policy expression. With
/// cfg.report_path or cfg.prometheus_path set, the stack joins the
/// FRAGCTL_REPORT registry (fragctl/stats_export.hpp): its statistics (and, with
/// cfg.report_map, its memory map) are written there on SIGUSR1, at exit,
/// when it is destroyed, and every cfg.report_interval_ms. Every stack joins
/// its device's memory ledger (fragctl/device_memory.hpp) for its life.
class allocator_stack {
 public:
  allocator_stack(std::unique_ptr<device_backend> backend, const config& cfg);
  ~allocator_stack();

  /// The outermost allocator: use this one.
  [[nodiscard]] device_allocator& allocator() noexcept { return *top_; }
  [[nodiscard]] device_backend& backend() noexcept { return *backend_; }
  /// The configuration the stack was built with; its `policy` is the
  /// expression actually built, defaults filled in ("buckets:caching").
  [[nodiscard]] const config& configuration() const noexcept { return cfg_; }
  /// Caps the bytes the stack hands out (after rounding) at `bytes`; 0
  /// removes the cap. From any thread; see limiting_adaptor::set_limit.
  void set_limit(std::size_t bytes) noexcept;
  /// The cap now; 0 for none.
  [[nodiscard]] std::size_t limit() const noexcept;
  /// Starts a new window of resettable peaks (allocator_stats::window_peak).
  void reset_peaks() noexcept;
  /// Statistics of the whole stack, `allocator` set to configuration().policy.
  /// Callable from any thread (the pool state is read through the lock).
  [[nodiscard]] allocator_stats stats() const;
  /// True when block_info answers for live blocks: cfg.block_table is on, or
  /// the policy is a graph_pool (which keeps its live blocks).
  [[nodiscard]] bool keeps_block_table() const noexcept;
  /// True when the policy is a graph_pool (its reserved bytes are "graph
  /// pools" in the device memory split, fragctl/device_memory.hpp).
  [[nodiscard]] bool keeps_graph_pool() const noexcept;
  /// With a graph_pool policy: makes `ptr`, a block kept in the pool, live
  /// again, as an allocation of its size on its stream (counted by the
  /// statistics); returns false, changing nothing, when `ptr` is not kept in
  /// the pool. Throws invalid_argument when the policy is not a graph_pool,
  /// and what allocate throws.
  bool graph_pool_reclaim(void* ptr);
  /// Statistics and, with configuration().report_map, the memory map: what
  /// the stack's FRAGCTL_REPORT document carries for it (include
  /// fragctl/stats_export.hpp).
  [[nodiscard]] stats_export_entry export_entry() const;
  /// A new stream on the stack's backend that lives as long as the stack:
  /// destroyed after the allocator and before the backend, so that what the
  /// allocator does with its blocks' streams as it ends (a graph pool hands
  /// its kept blocks back on them, a policy waits for their frees) finds
  /// them alive. For callers whose streams serve only this stack (a trace
  /// replay). Throws what the backend's create_stream throws.
  [[nodiscard]] stream_t create_stream();

 private:
  // stats() and the device's free and total memory (memory_info, one
  // backend call): what the report file carries.
  [[nodiscard]] allocator_stats report_stats() const;

  config cfg_;
  std::unique_ptr<device_backend> backend_;  // declared first: destroyed last
  std::unique_ptr<device_allocator> top_;
  statistics_adaptor* statistics_ = nullptr;
  limiting_adaptor* limiting_ = nullptr;
  std::vector<stream_t> streams_;  // create_stream's: the destructor destroys them after top_
};

/// Builds the backend cfg names and the stack on it.
[[nodiscard]] std::unique_ptr<allocator_stack> make_allocator(const config& cfg);

}  // namespace fragctl
