// Runs a stress workload through one fragctl allocator stack under a cap on
// reserved bytes (capped_backend over the configured backend).
#pragma once

#include <cstddef>
#include <string>

#include "fragctl/config.hpp"
#include "stress_result.hpp"
#include "workload_generators.hpp"

namespace fragctl::bench {

struct run_options {
  std::string scenario;  ///< reported as is
  double scale = 1;      ///< reported as is
  std::string policy;    ///< policy expression
  config cfg;            ///< backend and options (cfg.policy is replaced)
  std::size_t cap = 0;   ///< reserved-bytes cap; 0 = none
  bool series = false;   ///< keep the per-step series in the result
};

/// Issues the plan's events in order through a fresh make_allocator-shaped
/// stack (thread_safe as cfg says) on capped_backend(make_backend(cfg), cap),
/// timing each malloc and free with steady_clock. Stops at the first
/// out-of-memory (completed = false). A `warmup` policy without warmup_bytes
/// gets the plan's peak live bytes, what a profile of the same run says.
/// Throws what the backend or the stack throws when they cannot be built.
[[nodiscard]] run_result run_plan(const gen::plan& plan, const run_options& options);

}  // namespace fragctl::bench
