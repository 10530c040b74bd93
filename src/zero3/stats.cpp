// Block manager statistics and their JSON object (docs/zero3.md).
#include "nlohmann/json.hpp"
#include "zero3/manager_state.hpp"

namespace fragctl::zero3 {

zero3_stats block_manager::stats() const {
  const impl& m = *impl_;
  zero3_stats s = m.counters;
  s.blocks = m.layout.blocks.size();
  for (const block_layout& b : m.layout.blocks) {
    s.parameters += b.parameters.size();
    for (const parameter_layout& p : b.parameters) {
      if (p.persistent) ++s.persistent_parameters;
      if (!p.trainable) ++s.frozen_parameters;
    }
  }
  s.parameter_elements = m.layout.parameter_elements;
  s.shard_bytes = m.layout.shard_bytes;
  s.gradient_shard_bytes = m.layout.gradient_shard_bytes;
  s.persistent_bytes = m.layout.persistent_bytes;
  s.persistent_gradient_bytes = m.layout.persistent_gradient_bytes;
  s.bucket_bytes = 2 * m.layout.max_bucket_bytes;
  s.gathered = {m.live, m.peak};
  s.gradients = {m.gradient_live, m.gradient_peak};
  s.stall_ns = m.comm.blocked_ns() + m.wait_ns;
  s.trace_length = m.recording ? 0 : m.trace.size();
  s.long_lived_pool = m.persistent.state();
  s.gathered_pool = m.transient.state();
  return s;
}

namespace {

nlohmann::ordered_json pool_json(const pool_state& p) {
  return {{"reserved", p.reserved}, {"allocated", p.allocated}, {"cached_free", p.cached_free},
          {"segments", p.segments}};
}

}  // namespace

std::string to_json(const zero3_stats& s) {
  nlohmann::ordered_json j;
  j["schema"] = "fragctl.zero3";
  j["schema_version"] = 1;
  j["rank"] = s.rank;
  j["world_size"] = s.world_size;
  j["communicator"] = s.communicator;
  j["blocks"] = s.blocks;
  j["parameters"] = {{"count", s.parameters},
                     {"elements", s.parameter_elements},
                     {"persistent", s.persistent_parameters},
                     {"frozen", s.frozen_parameters}};
  j["long_lived_bytes"] = {{"shard", s.shard_bytes},
                           {"gradient_shard", s.gradient_shard_bytes},
                           {"persistent", s.persistent_bytes},
                           {"persistent_gradient", s.persistent_gradient_bytes},
                           {"buckets", s.bucket_bytes}};
  j["gathered_bytes"] = {{"current", s.gathered.current}, {"peak", s.gathered.peak}};
  j["gradient_bytes"] = {{"current", s.gradients.current}, {"peak", s.gradients.peak}};
  j["budget"] = {{"max_live_bytes", s.max_live_bytes}, {"prefetch_bytes", s.prefetch_bytes}};
  j["steps"] = s.steps;
  j["fetches"] = s.fetches;
  j["gathers"] = s.gathers;
  j["prefetch"] = {{"issued", s.prefetches},
                   {"hits", s.prefetch_hits},
                   {"dropped", s.prefetch_dropped},
                   {"deferred", s.prefetch_deferred},
                   {"kept", s.prefetch_kept},
                   {"trace_length", s.trace_length},
                   {"trace_misses", s.trace_misses}};
  j["pending_at_fetch"] = s.pending_at_fetch;
  j["reduce_scatters"] = s.reduce_scatters;
  j["communicated_bytes"] = {{"all_gather", s.all_gather_bytes}, {"reduce_scatter", s.reduce_scatter_bytes}};
  j["last_step"] = {{"all_gather_bytes", s.last_step_all_gather_bytes},
                    {"reduce_scatter_bytes", s.last_step_reduce_scatter_bytes},
                    {"gathers", s.last_step_gathers},
                    {"prefetch_hits", s.last_step_prefetch_hits}};
  j["stall_seconds"] = static_cast<double>(s.stall_ns) * 1e-9;
  j["allocators"] = {{"long_lived", pool_json(s.long_lived_pool)}, {"gathered", pool_json(s.gathered_pool)}};
  return j.dump(2);
}

}  // namespace fragctl::zero3
