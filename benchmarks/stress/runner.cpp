#include "runner.hpp"

#include <chrono>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "capped_backend.hpp"
#include "fragctl/allocator_stack.hpp"
#include "fragctl/error.hpp"
#include "fragctl/policy.hpp"

namespace fragctl::bench {

namespace {

using clock_type = std::chrono::steady_clock;

std::int64_t elapsed_ns(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
}

}  // namespace

run_result run_plan(const gen::plan& plan, const run_options& options) {
  config cfg = options.cfg;
  cfg.policy = options.policy;
  if (cfg.warmup_bytes == 0 && cfg.warmup_profile.empty() && options.policy.find("warmup") != std::string::npos)
    cfg.warmup_bytes = plan.peak_live;

  run_result r;
  r.scenario = options.scenario;
  r.allocator = options.policy;
  r.scale = options.scale;
  r.cap = options.cap;
  r.peak_live = plan.peak_live;

  std::unique_ptr<allocator_stack> stack;
  try {
    stack = std::make_unique<allocator_stack>(std::make_unique<capped_backend>(make_backend(cfg), options.cap), cfg);
  } catch (const out_of_memory& e) {  // a warm-up larger than the cap
    r.failure = e.what();
    r.failed_step = 0;
    return r;
  }
  device_allocator& alloc = stack->allocator();
  device_backend& backend = stack->backend();
  r.backend = std::string(backend.name());

  absl::flat_hash_map<std::uint64_t, std::pair<void*, std::size_t>> live;
  std::vector<std::int64_t> samples;
  samples.reserve(plan.events.size());
  std::size_t requested = 0;
  step_sample step;
  r.completed = true;
  const auto close_step = [&] {
    step.requested_end = requested;
    step.reserved_end = backend.counters().held_bytes;
    r.series.push_back(step);
    step = {};
    step.step = r.series.size();
  };

  std::size_t next_end = 0;
  for (std::size_t i = 0; i < plan.events.size(); ++i) {
    const gen::event& e = plan.events[i];
    if (e.alloc) {
      void* p = nullptr;
      const auto t0 = clock_type::now();
      try {
        p = alloc.allocate(e.bytes);
      } catch (const out_of_memory& oom) {
        r.completed = false;
        r.failed_step = static_cast<long>(e.step);
        r.failure = oom.what();
        break;
      }
      const auto t1 = clock_type::now();
      samples.push_back(elapsed_ns(t0, t1));
      if (e.step < plan.step_end.size()) step.alloc_ns += samples.back();
      live.emplace(e.id, std::make_pair(p, e.bytes));
      requested += e.bytes;
    } else {
      const auto it = live.find(e.id);
      const auto t0 = clock_type::now();
      alloc.deallocate(it->second.first, e.bytes);
      const auto t1 = clock_type::now();
      samples.push_back(elapsed_ns(t0, t1));
      if (e.step < plan.step_end.size()) step.alloc_ns += samples.back();
      live.erase(it);
      requested -= e.bytes;
    }
    step.requested_peak = std::max(step.requested_peak, requested);
    step.reserved_peak = std::max(step.reserved_peak, backend.counters().held_bytes);
    if (next_end < plan.step_end.size() && i + 1 == plan.step_end[next_end]) {
      close_step();
      ++next_end;
    }
  }

  const allocator_stats s = stack->stats();
  r.peak_requested = s.requested.peak;
  r.peak_reserved = s.reserved.peak;
  r.reserved_over_requested = s.reserved_over_requested();
  r.backend_memory_calls = s.backend_calls.memory_calls();
  r.retries = s.retries;
  r.operations = samples.size();
  r.median_ns = median_of(samples);
  r.p99_ns = percentile_of(samples, 0.99);
  summarize_steps(r);
  if (!options.series) r.series.clear();

  for (const auto& [id, block] : live) alloc.deallocate(block.first, block.second);
  alloc.release_cached();
  return r;
}

}  // namespace fragctl::bench
