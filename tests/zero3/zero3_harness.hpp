// Threads as ranks for the ZeRO-3 tests: each rank gets its own backed sim
// device, a long-lived allocator (caching), a transient one (arena, wrapped in
// statistics so tests read its live bytes), and a thread communicator.
#pragma once

#include <chrono>
#include <cstring>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "fmt/format.h"
#include "fragctl/adaptors.hpp"
#include "fragctl/config.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/sim_backend.hpp"
#include "fragctl/zero3/block_manager.hpp"
#include "fragctl/zero3/communicator.hpp"
#include "gtest/gtest.h"

namespace fragctl::zero3::testing {

struct rank_env {
  explicit rank_env(int device, bool manual_completion = false)
      : backend(sim_options{.capacity = 256 * MiB,
                            .granularity = 64 * KiB,
                            .backed = true,
                            .manual_completion = manual_completion,
                            .device = device}) {
    config cfg;
    cfg.arena_size = 64 * MiB;
    persistent = make_policy("caching", cfg, backend);
    auto arena = make_policy("arena", cfg, backend);
    auto stats = std::make_unique<statistics_adaptor>(std::move(arena));
    transient_stats = stats.get();
    transient = std::move(stats);
  }
  sim_backend backend;
  std::unique_ptr<device_allocator> persistent;
  std::unique_ptr<device_allocator> transient;
  statistics_adaptor* transient_stats = nullptr;
  std::unique_ptr<communicator> comm;
};

/// Runs body(env) on `ranks` threads, one rank each; rethrows the first
/// exception a rank let escape.
inline void run_ranks(int ranks, std::chrono::milliseconds timeout, const std::function<void(rank_env&)>& body) {
  auto group = make_thread_group(ranks, timeout);
  std::vector<std::thread> threads;
  std::mutex mutex;
  std::exception_ptr first;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        rank_env env(r);
        env.comm = make_thread_communicator(group, r, env.backend);
        body(env);
      } catch (...) {
        std::lock_guard lock(mutex);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

/// Deterministic contents of a parameter: its original full value.
inline std::vector<unsigned char> original(std::size_t block, std::size_t param, std::size_t bytes) {
  std::mt19937_64 rng(block * 1000003 + param * 7919 + 17);
  std::vector<unsigned char> out(bytes);
  for (unsigned char& c : out) c = static_cast<unsigned char>(rng());
  return out;
}

/// Writes every parameter's original value into this rank's shard (partitioned
/// ones) or whole copy (persistent ones), as a checkpoint loader would.
inline void load_parameters(block_manager& m) {
  const model_layout& l = m.layout();
  for (std::size_t b = 0; b < l.blocks.size(); ++b) {
    for (std::size_t p = 0; p < l.blocks[b].parameters.size(); ++p) {
      const std::vector<unsigned char> full = original(b, p, l.blocks[b].parameters[p].bytes());
      const block_manager::parameter_part part = m.shard_of(b, p);
      if (part.data.data != nullptr) std::memcpy(part.data.data, full.data() + part.parameter_offset, part.data.bytes);
    }
  }
}

/// A small model: an embedding, `layers` layers with norms (persistent below
/// a threshold of 64 elements), projections of odd sizes and a frozen weight,
/// and a head; bf16 throughout.
inline std::vector<block_spec> small_model(int layers, bool with_frozen = true) {
  std::vector<block_spec> blocks;
  blocks.push_back({"embed", {{"embed.weight", 1000, 2, true}}});
  for (int i = 0; i < layers; ++i) {
    block_spec b{fmt::format("layer.{}", i), {}};
    b.parameters.push_back({"norm1", 30, 2, true});
    b.parameters.push_back({"q", 700 + static_cast<std::size_t>(i), 2, true});
    b.parameters.push_back({"k", 333, 2, true});
    if (with_frozen) b.parameters.push_back({"base", 517, 2, false});
    b.parameters.push_back({"up", 1234, 2, true});
    b.parameters.push_back({"norm2", 31, 2, true});
    blocks.push_back(std::move(b));
  }
  blocks.push_back({"head", {{"final_norm", 40, 2, true}, {"lm_head", 999, 2, true}}});
  return blocks;
}

inline options small_options() {
  options o;
  o.persistence_threshold = 64;
  o.gradient_type = data_type::float32;
  return o;
}

}  // namespace fragctl::zero3::testing
