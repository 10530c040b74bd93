// The replay engine (docs/replay.md).
//
// Model. The trace's addresses name blocks; a map from trace address to the
// block the replayed allocator returned turns each free into a deallocate of
// the right pointer with the size recorded at its alloc. Trace stream ids map
// to real streams of the backend (0 to the default stream), so per-stream
// caching and cross-stream reuse behave as they did in the program. Anything
// the trace cannot express consistently is counted, never fatal: frees of
// unknown addresses, allocs over a live address (a lost free), and the frees
// of blocks whose allocation ran out of memory.

#include "fragctl/replay.hpp"
#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include "absl/container/flat_hash_map.h"
#include "core/json_io.hpp"
#include "fragctl/allocator_stack.hpp"
#include "fragctl/error.hpp"
#include "fragctl/policy.hpp"
#include "nlohmann/json.hpp"
#include "trace/gpu_lag.hpp"
#include "util/op_clock.hpp"

namespace fragctl {

namespace {

// Value of rank `q` (0..1) by the nearest-rank method; reorders `v`.
double percentile(std::vector<std::int64_t>& v, double q) {
  if (v.empty()) return 0;
  auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  rank = std::clamp<std::size_t>(rank, 1, v.size()) - 1;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(rank), v.end());
  return static_cast<double>(v[rank]);
}

double median(std::vector<std::int64_t>& v) {
  if (v.empty()) return 0;
  const std::size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const auto upper = static_cast<double>(v[mid]);
  if (v.size() % 2 == 1) return upper;
  const auto lower = static_cast<double>(*std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid)));
  return (lower + upper) / 2;
}

// The trace's streams, each a stream of the replay's stack
// (allocator_stack::create_stream): they outlive its allocator, whose
// teardown may still use them (a graph pool hands its kept blocks back on
// them).
class stream_table {
 public:
  stream_table(const trace& t, allocator_stack& stack) {
    for (const trace_event& e : t.events) {
      if (e.stream != 0 && !streams_.contains(e.stream)) streams_.emplace(e.stream, stack.create_stream());
    }
  }

  [[nodiscard]] stream_t operator[](std::uint64_t id) const {
    return id == 0 ? nullptr : streams_.at(id);
  }

 private:
  absl::flat_hash_map<std::uint64_t, stream_t> streams_;
};

struct live_block {
  void* ptr = nullptr;
  std::size_t size = 0;
  stream_t stream = nullptr;
  bool failed = false;  // its allocation ran out of memory
};

}  // namespace

replay_result replay(const trace& t, const replay_options& options) {
  config cfg = options.cfg;
  cfg.policy = options.policy;
  const std::unique_ptr<allocator_stack> stack = replay_detail::make_lagged_stack(cfg, options.lag);
  device_allocator& alloc = stack->allocator();
  device_backend& backend = stack->backend();

  replay_result r;
  r.trace = t.name;
  r.completeness = t.completeness;
  r.backend = std::string(backend.name());
  r.policy = options.policy.empty() ? default_policy(backend) : options.policy;
  const util::op_clock clock;
  r.clock = clock.source();
  r.clock_overhead_ns = clock.overhead_ns();

  const stream_table streams(t, *stack);
  replay_detail::gpu_lag lag(options.lag, backend);
  absl::flat_hash_map<std::uint64_t, live_block> live;
  live.reserve(std::min<std::size_t>(t.events.size(), std::size_t{1} << 20));
  std::vector<std::int64_t> alloc_samples, free_samples;
  alloc_samples.reserve(t.events.size());
  free_samples.reserve(t.events.size());

  const auto timed_free = [&](const live_block& b, stream_t stream) {
    const util::op_clock::ticks t0 = clock.start();
    alloc.deallocate(b.ptr, b.size, stream);
    free_samples.push_back(clock.stop() - t0);
  };

  // Bytes live in the allocator, for the timeline (failed allocs hold none).
  std::size_t live_bytes = 0;
  const auto sample = [&](std::size_t i, const trace_event& e, bool oom) {
    if (!options.sample) return;
    options.sample(replay_sample{i, e.time_us, live_bytes, backend.counters().held_bytes, oom}, alloc);
  };

  const std::size_t total = t.events.size();
  constexpr std::size_t progress_every = 4096;
  for (std::size_t i = 0; i < total; ++i) {
    if (options.progress && i % progress_every == 0) options.progress(i, total);
    const trace_event& e = t.events[i];
    const stream_t stream = streams[e.stream];
    lag.step(i, e.time_us, stream);
    if (e.kind == trace_event::action::alloc) {
      if (const auto old = live.find(e.addr); old != live.end()) {
        ++r.lost_frees;
        if (!old->second.failed) {
          timed_free(old->second, old->second.stream);
          live_bytes -= old->second.size;
        }
        live.erase(old);
      }
      void* ptr = nullptr;
      const util::op_clock::ticks t0 = clock.start();
      try {
        ptr = alloc.allocate(e.size, stream);
      } catch (const out_of_memory&) {
        ++r.ooms;
        live.emplace(e.addr, live_block{nullptr, e.size, stream, true});
        sample(i, e, true);
        continue;
      } catch (const invalid_argument&) {  // a size no device holds: one bad row, not a failed replay
        ++r.refused;
        live.emplace(e.addr, live_block{nullptr, e.size, stream, true});
        sample(i, e, false);
        continue;
      }
      alloc_samples.push_back(clock.stop() - t0);
      live.emplace(e.addr, live_block{ptr, e.size, stream, false});
      live_bytes += e.size;
    } else {
      const auto it = live.find(e.addr);
      if (it == live.end()) {
        ++r.unknown_frees;
        sample(i, e, false);
        continue;
      }
      if (it->second.failed) {
        ++r.skipped_frees;
      } else {
        timed_free(it->second, stream);
        live_bytes -= it->second.size;
      }
      live.erase(it);
    }
    sample(i, e, false);
  }
  if (options.progress) options.progress(total, total);

  r.stats = stack->stats();
  r.peak_requested = r.stats.requested.peak;
  r.peak_reserved = r.stats.reserved.peak;
  r.reserved_over_requested = r.stats.reserved_over_requested();
  r.backend_memory_calls = r.stats.backend_calls.memory_calls();
  r.backend_calls = r.stats.backend_calls.total_calls();
  std::vector<std::int64_t> samples;
  samples.reserve(alloc_samples.size() + free_samples.size());
  samples.insert(samples.end(), alloc_samples.begin(), alloc_samples.end());
  samples.insert(samples.end(), free_samples.begin(), free_samples.end());
  r.operations = samples.size();
  r.median_ns = clock.to_ns(median(samples));
  r.p99_ns = clock.to_ns(percentile(samples, 0.99));
  r.p90_ns = clock.to_ns(percentile(samples, 0.90));
  r.median_alloc_ns = clock.to_ns(median(alloc_samples));
  r.p90_alloc_ns = clock.to_ns(percentile(alloc_samples, 0.90));
  r.median_free_ns = clock.to_ns(median(free_samples));
  r.p90_free_ns = clock.to_ns(percentile(free_samples, 0.90));
  std::int64_t timed = 0;
  for (const std::int64_t ticks : samples) timed += ticks;
  r.total_ms = clock.to_ns(static_cast<double>(timed)) / 1e6;

  for (const auto& [addr, b] : live) {
    if (!b.failed) alloc.deallocate(b.ptr, b.size, b.stream);
  }
  alloc.release_cached();
  return r;
}

std::vector<std::string> replay_policy_set() { return documented_compositions(); }

namespace {

nlohmann::ordered_json result_json(const replay_result& r) {
  nlohmann::ordered_json j;
  j["trace"] = r.trace;
  // true, false (cut) or null (the file cannot tell): trace.hpp.
  if (r.completeness == trace_completeness::unknown)
    j["trace_complete"] = nullptr;
  else
    j["trace_complete"] = r.completeness == trace_completeness::complete;
  j["policy"] = r.policy;
  j["backend"] = r.backend;
  j["peak_requested"] = r.peak_requested;
  j["peak_reserved"] = r.peak_reserved;
  j["reserved_over_requested"] = r.reserved_over_requested;
  j["backend_memory_calls"] = r.backend_memory_calls;
  j["backend_calls"] = r.backend_calls;
  j["ooms"] = r.ooms;
  j["refused"] = r.refused;
  j["unknown_frees"] = r.unknown_frees;
  j["skipped_frees"] = r.skipped_frees;
  j["lost_frees"] = r.lost_frees;
  j["operations"] = r.operations;
  j["median_ns"] = r.median_ns;
  j["p99_ns"] = r.p99_ns;
  j["p90_ns"] = r.p90_ns;
  j["median_alloc_ns"] = r.median_alloc_ns;
  j["p90_alloc_ns"] = r.p90_alloc_ns;
  j["median_free_ns"] = r.median_free_ns;
  j["p90_free_ns"] = r.p90_free_ns;
  j["total_ms"] = r.total_ms;
  j["clock_overhead_ns"] = r.clock_overhead_ns;
  j["clock"] = r.clock;
  j["stats"] = nlohmann::ordered_json::parse(to_json(r.stats));
  return j;
}

}  // namespace

std::string to_json(const replay_result& r) { return detail::dump_json(result_json(r)); }

std::string to_json(const std::vector<replay_result>& results) {
  nlohmann::ordered_json array = nlohmann::ordered_json::array();
  for (const replay_result& r : results) array.push_back(result_json(r));
  return detail::dump_json(array);
}

}  // namespace fragctl
