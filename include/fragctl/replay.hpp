// Replaying a trace through a policy (DESIGN.md, "Traces"; docs/replay.md).
//
// A replay issues a trace's allocs and frees, in order, to an allocator built
// by make_allocator, and reports what that allocator held at peak against what
// the program had live, what each call cost, and how often it went to the
// backend. It is how policies are compared on real workloads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fragctl/config.hpp"
#include "fragctl/stats.hpp"
#include "fragctl/trace.hpp"

namespace fragctl {

/// One point of a replay's timeline, taken after a trace event.
struct replay_sample {
  std::size_t event = 0;      ///< index of the trace event just replayed
  std::int64_t time_us = 0;   ///< its trace time
  std::size_t requested = 0;  ///< bytes live in the allocator (the callers' sizes)
  std::size_t reserved = 0;   ///< device bytes the backend holds
  bool oom = false;           ///< this event's allocation ran out of memory
};

/// A GPU that runs behind the CPU (docs/replay.md, "GPU lag"). A live
/// program queues work and moves on; the frees it makes are complete on the
/// device only once the GPU has caught up with them. With a lag set, the
/// replay runs on a sim backend whose work completes only when told: after
/// every trace event it queues one unit of work on the event's stream, and
/// that work completes once the replay reaches an event at least `us`
/// microseconds later in trace time (or `events` trace events later), or
/// when the allocator synchronizes on it. Both 0 (the default): work
/// completes at once, as without the model. Both set: whichever comes later.
struct replay_lag {
  std::int64_t us = 0;
  std::uint64_t events = 0;

  [[nodiscard]] bool enabled() const noexcept { return us > 0 || events > 0; }
};

struct replay_options {
  /// Policy expression ("caching", "buckets:arena"); empty means the default
  /// for the backend (default_policy). Overrides cfg.policy.
  std::string policy;
  /// Backend (cfg.backend, sim_capacity, ...) and policy options.
  config cfg;
  /// Called now and then with events done and total, from the replaying
  /// thread, and once at the end with done == total. May be empty.
  std::function<void(std::size_t done, std::size_t total)> progress;
  /// Called after every trace event with the point of the timeline it made
  /// and the allocator (to take its memory_map(), say), from the replaying
  /// thread, outside the timed calls. May be empty. Sampling changes no
  /// result; it costs one call and one read of the backend's counters per
  /// event.
  std::function<void(const replay_sample& sample, const device_allocator& allocator)> sample = {};
  /// The GPU's lag behind the trace; needs the sim backend (cfg.backend sim
  /// or automatic, which then means sim), else invalid_argument.
  replay_lag lag = {};
};

struct replay_result {
  std::string trace;    ///< trace name
  /// The trace's completeness (trace.hpp): a cut trace replays only the
  /// part recorded before its writer was killed.
  trace_completeness completeness = trace_completeness::unknown;
  std::string policy;   ///< the policy expression replayed (default resolved)
  std::string backend;  ///< backend name ("sim", "cuda", "hip")
  std::size_t peak_requested = 0;  ///< stats.requested.peak: peak live bytes the allocator saw
  std::size_t peak_reserved = 0;   ///< stats.reserved.peak: peak bytes held from the backend
  double reserved_over_requested = 0;  ///< peak_reserved / peak_requested (0 if nothing requested)
  std::uint64_t backend_memory_calls = 0;  ///< allocate/free/map/unmap-class backend calls
  std::uint64_t backend_calls = 0;         ///< every backend call
  std::uint64_t ooms = 0;           ///< allocs that threw out_of_memory (their frees are skipped)
  std::uint64_t unknown_frees = 0;  ///< frees of an address that was not live (not replayed)
  std::uint64_t refused = 0;        ///< allocs refused as invalid_argument (over 2^62 bytes; frees skipped)
  std::uint64_t skipped_frees = 0;  ///< frees of blocks whose alloc ran out of memory or was refused
  std::uint64_t lost_frees = 0;     ///< allocs at a live address: the old block was freed first
  std::uint64_t operations = 0;     ///< timed allocate and deallocate calls
  double median_ns = 0;             ///< median wall time of one operation
  double p99_ns = 0;                ///< 99th percentile of the same
  double p90_ns = 0;                ///< 90th percentile of the same
  double median_alloc_ns = 0;       ///< median wall time of one allocate
  double p90_alloc_ns = 0;          ///< 90th percentile of the same
  double median_free_ns = 0;        ///< median wall time of one deallocate
  double p90_free_ns = 0;           ///< 90th percentile of the same
  double total_ms = 0;              ///< all timed operations together: the time spent in the allocator
  double clock_overhead_ns = 0;     ///< median cost of one clock read pair (not subtracted)
  allocator_stats stats;            ///< the stack's statistics after the last trace event
  std::string clock;                ///< what timed the operations: "tsc" (the CPU's counter) or "steady_clock"
};

/// Replays `t` through a fresh allocator stack built from options.cfg with
/// cfg.policy = options.policy. Trace stream 0 is the default stream
/// (nullptr); every other distinct stream id gets a stream of its own from
/// backend.create_stream(), destroyed at the end. Each allocate and
/// deallocate is timed on its own (the CPU's invariant time-stamp counter,
/// fenced, where it has one, else std::chrono::steady_clock); an alloc
/// that runs out of memory counts an OOM and is not timed; one refused with
/// invalid_argument (a size over 2^62 bytes) counts in `refused` and the
/// replay goes on. Blocks still live
/// after the last event are freed (not timed, not in the result's stats).
/// Single-threaded; independent replays may run on different threads.
/// Throws invalid_argument for a bad policy expression, backend_error when
/// the backend cannot be created or fails.
[[nodiscard]] replay_result replay(const trace& t, const replay_options& options);

/// The policy expressions `fragctl replay --policy all` runs:
/// documented_compositions() (fragctl/policy.hpp).
[[nodiscard]] std::vector<std::string> replay_policy_set();

/// A result as one JSON object (keys as the fields above; "stats" holds the
/// statistics report of fragctl/stats.hpp).
[[nodiscard]] std::string to_json(const replay_result& r);

/// Results as one JSON array.
[[nodiscard]] std::string to_json(const std::vector<replay_result>& results);

}  // namespace fragctl
