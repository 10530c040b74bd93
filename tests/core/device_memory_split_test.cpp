// The device memory that is not fragctl's, split by whose it is (issue 31,
// deliverable 2; fragctl/device_memory.hpp, docs/reports.md): the arithmetic,
// sim's per-process model, what a stack's report carries, the OOM message,
// the C API and the JSON round trip.
#include <cstdlib>
#include <memory>
#include <string>

#include "capi/handle.hpp"
#include "fragctl/allocator_stack.hpp"
#include "fragctl/config.hpp"
#include "fragctl/device_memory.hpp"
#include "fragctl/error.hpp"
#include "fragctl/fragctl.h"
#include "fragctl/sim_backend.hpp"
#include "fragctl/stats.hpp"
#include "fragctl/stats_export.hpp"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace fragctl {
namespace {

using ::testing::HasSubstr;

// The parts take "not fragctl's" (used - reserved) in order; `other` is
// what is left, and other processes are part of it without NVML.
TEST(device_memory_split, the_parts_add_up_to_what_is_not_fragctls) {
  device_memory_inputs in;
  in.total = 80 * GiB;
  in.free = 80 * GiB - 10 * GiB;  // used 10 GiB
  in.reserved = 4 * GiB;
  in.process = {true, 7 * GiB, 2 * GiB};
  in.other_fragctl = 1 * GiB;
  in.graph_pools = 512 * MiB;
  in.context = 512 * MiB;
  in.nccl = 1 * GiB;
  const device_memory_split s = split_device_memory(in);
  EXPECT_TRUE(s.per_process);
  EXPECT_EQ(s.used, 10 * GiB);
  EXPECT_EQ(s.not_fragctl(), 6 * GiB);
  EXPECT_EQ(s.this_process, 7 * GiB);
  EXPECT_EQ(s.other_fragctl, 1 * GiB);
  EXPECT_EQ(s.graph_pools, 512 * MiB);
  EXPECT_EQ(s.context, 512 * MiB);
  EXPECT_EQ(s.nccl, 1 * GiB);
  EXPECT_EQ(s.other_processes, 2 * GiB);
  EXPECT_EQ(s.other, 1 * GiB);  // 6 - 1 - 0.5 - 0.5 - 1 - 2

  in.process = {};  // no NVML: other processes' 2 GiB are in other
  const device_memory_split without = split_device_memory(in);
  EXPECT_FALSE(without.per_process);
  EXPECT_EQ(without.other_processes, 0u);
  EXPECT_EQ(without.other, 3 * GiB);

  in.nccl = 100 * GiB;  // figures read a moment apart: cut, never more than used
  const device_memory_split cut = split_device_memory(in);
  EXPECT_EQ(cut.nccl, 4 * GiB + 512 * MiB);  // 6 - 1 - 0.5 (no NVML: no other processes)
  EXPECT_EQ(cut.context, 0u);                // the estimate goes first
  EXPECT_EQ(cut.other, 0u);
  in.process = {true, 7 * GiB, 2 * GiB};
  const device_memory_split measured_first = split_device_memory(in);
  EXPECT_EQ(measured_first.other_processes, 2 * GiB);
  EXPECT_EQ(measured_first.nccl, 2 * GiB + 512 * MiB);
}

// sim's model: this process is its allocations, its context and its
// libraries' bytes; other processes what the options say; all of it is used.
TEST(device_memory_split, sim_reports_this_process_and_the_others) {
  sim_options o;
  o.capacity = 8 * GiB;
  o.context_bytes = 512 * MiB;
  o.other_process_bytes = 1 * GiB;
  sim_backend sim(o);
  void* p = sim.allocate(100 * MiB);
  ASSERT_NE(p, nullptr);
  sim.set_library_bytes(256 * MiB);
  const process_memory m = sim.get_process_memory();
  EXPECT_TRUE(m.measured);
  EXPECT_EQ(m.this_process, 100 * MiB + 512 * MiB + 256 * MiB);
  EXPECT_EQ(m.other_processes, 1 * GiB);
  EXPECT_EQ(sim.get_memory_info().free, 8 * GiB - 100 * MiB - 512 * MiB - 256 * MiB - 1 * GiB);
  // What the others hold is not there to allocate.
  EXPECT_EQ(sim.allocate(7 * GiB), nullptr);
  sim.free(p, 100 * MiB);
}

config sim_config(std::string_view options) {
  absl::StatusOr<config> cfg = parse_config(options);
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  config out = cfg.ok() ? *cfg : config{};
  out.backend = backend_kind::sim;
  out.policy = "caching";
  return out;
}

// A stack's report carries the split: its context measured when it joined
// the ledger, NCCL as attributed, graph pools from the graph_pool stack on
// the same device, other processes from sim's per-process figures.
TEST(device_memory_split, a_stacks_report_splits_the_device_memory) {
  auto stack = make_allocator(sim_config("sim_capacity:16GiB,sim_context:512MiB,sim_other_processes:2GiB"));
  auto pool = make_allocator(sim_config(""));
  config pool_cfg = sim_config("");
  pool_cfg.policy = "graph_pool:caching";
  auto graph = make_allocator(pool_cfg);
  device_allocator& a = stack->allocator();
  void* live = a.allocate(100 * MiB, nullptr);
  void* pooled = graph->allocator().allocate(40 * MiB, nullptr);
  void* other = pool->allocator().allocate(20 * MiB, nullptr);
  const std::size_t graph_reserved = graph->stats().reserved.current;
  const std::size_t other_reserved = pool->stats().reserved.current;
  ASSERT_GT(graph_reserved, 0u);
  ASSERT_GT(other_reserved, 0u);
  // sim's devices are separate objects; the library bytes stand for what
  // one real device would also hold: NCCL's 256 MiB, the graph pool's and
  // the other allocator's reserved bytes, and 64 MiB no one attributed.
  auto& sim = dynamic_cast<sim_backend&>(stack->backend());
  sim.set_library_bytes(256 * MiB + graph_reserved + other_reserved + 64 * MiB);
  attribute_device_memory(stack->backend(), device_memory_use::nccl, "process group", 256 * MiB);

  const allocator_stats s = stack->export_entry().stats;
  ASSERT_TRUE(s.device_memory.measured);
  ASSERT_TRUE(s.device_memory.split.has_value());
  const device_memory_split& split = *s.device_memory.split;
  EXPECT_TRUE(split.per_process);
  EXPECT_EQ(split.fragctl, s.reserved.current);
  EXPECT_EQ(split.context, 512 * MiB);
  EXPECT_EQ(split.nccl, 256 * MiB);
  EXPECT_EQ(split.graph_pools, graph_reserved);
  EXPECT_EQ(split.other_fragctl, other_reserved);
  EXPECT_EQ(split.other_processes, 2 * GiB);
  EXPECT_EQ(split.other, 64 * MiB);
  EXPECT_EQ(split.not_fragctl(), 512 * MiB + 256 * MiB + graph_reserved + other_reserved + 2 * GiB + 64 * MiB);

  // Written and read back with the report.
  const std::string doc = stats_export_to_json({stack->export_entry()}, "request");
  const auto back = stats_export_from_json(doc);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_TRUE((*back)[0].device_memory.split.has_value());
  EXPECT_EQ(*(*back)[0].device_memory.split, split);
  const nlohmann::json j = nlohmann::json::parse(doc);
  EXPECT_EQ(j["allocators"][0]["device_memory"]["split"]["nccl"], 256 * MiB);
  EXPECT_EQ(j["allocators"][0]["device_memory"]["split"]["other_processes"], 2 * GiB);

  // Removing the attribution takes NCCL out again.
  attribute_device_memory(stack->backend(), device_memory_use::nccl, "process group", 0);
  EXPECT_EQ(stack->export_entry().stats.device_memory.split->nccl, 0u);
  a.deallocate(live, 100 * MiB, nullptr);
  graph->allocator().deallocate(pooled, 40 * MiB, nullptr);
  pool->allocator().deallocate(other, 20 * MiB, nullptr);
}

// The OOM message (what torch's OutOfMemoryError carries on the native
// route) and the kept OOM event say whose the rest of the device is.
TEST(device_memory_split, an_oom_says_whose_the_device_memory_is) {
  auto stack = make_allocator(sim_config("sim_capacity:1GiB,sim_context:256MiB,sim_other_processes:256MiB"));
  attribute_device_memory(stack->backend(), device_memory_use::nccl, "comm", 0);
  try {
    (void)stack->allocator().allocate(600 * MiB, nullptr);
    FAIL() << "no out_of_memory";
  } catch (const out_of_memory& e) {
    EXPECT_THAT(std::string(e.what()),
                HasSubstr("; device memory not fragctl's 512.00 MiB: context 256.00 MiB, NCCL 0 B, graph pools 0 B, "
                          "other fragctl allocators 0 B, other 0 B, other processes 256.00 MiB (NVML; this process "
                          "256.00 MiB)"))
        << e.what();
  }
  const allocator_stats s = stack->stats();
  ASSERT_EQ(s.oom_events.size(), 1u);
  ASSERT_TRUE(s.oom_events[0].memory_split.has_value());
  EXPECT_EQ(s.oom_events[0].memory_split->context, 256 * MiB);
  EXPECT_EQ(s.oom_events[0].memory_split->other_processes, 256 * MiB);
  EXPECT_THAT(describe(s.oom_events[0], "caching"), HasSubstr("device memory not fragctl's 512.00 MiB: context"));
  const auto back = stats_from_json(to_json(s));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_TRUE(back->oom_events[0].memory_split.has_value());
  EXPECT_EQ(*back->oom_events[0].memory_split, *s.oom_events[0].memory_split);
}

// The front door: the split as JSON, an attribution, and the process's
// memory outside fragctl that a caller measures around a communicator.
TEST(device_memory_split, the_c_api_reports_and_attributes) {
  fragctl_allocator* a = nullptr;
  ASSERT_EQ(fragctl_create("caching", "sim_capacity:4GiB,sim_context:512MiB,sim_other_processes:1GiB", "sim", 0, &a),
            FRAGCTL_OK)
      << fragctl_last_error();
  // A communicator's bytes: the process's memory outside fragctl before
  // and after it is made (sim's library bytes stand for NCCL's buffers).
  std::size_t before = 0;
  ASSERT_EQ(fragctl_process_device_memory_outside(a, &before), FRAGCTL_OK) << fragctl_last_error();
  EXPECT_EQ(before, 512 * MiB);
  dynamic_cast<sim_backend&>(a->stack->backend()).set_library_bytes(128 * MiB);
  std::size_t after = 0;
  ASSERT_EQ(fragctl_process_device_memory_outside(a, &after), FRAGCTL_OK);
  ASSERT_EQ(fragctl_attribute_device_memory(a, "nccl", "world", after - before), FRAGCTL_OK);
  EXPECT_EQ(fragctl_attribute_device_memory(a, "cublas", "world", 1), FRAGCTL_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(fragctl_last_error()), HasSubstr("unknown use \"cublas\"; accepted: nccl"));
  void* p = nullptr;
  ASSERT_EQ(fragctl_malloc(a, &p, 64 * MiB, nullptr), FRAGCTL_OK);
  char* text = nullptr;
  ASSERT_EQ(fragctl_device_memory_split_json(a, &text), FRAGCTL_OK) << fragctl_last_error();
  const nlohmann::json j = nlohmann::json::parse(text);
  fragctl_string_free(text);
  EXPECT_EQ(j["per_process"], true);
  EXPECT_EQ(j["context"], 512 * MiB);
  EXPECT_EQ(j["nccl"], 128 * MiB);
  EXPECT_EQ(j["other_processes"], 1 * GiB);
  EXPECT_EQ(j["fragctl"].get<std::size_t>() + j["not_fragctl"].get<std::size_t>(), j["used"].get<std::size_t>());
  EXPECT_EQ(j["not_fragctl"], 512 * MiB + 128 * MiB + 1 * GiB);
  EXPECT_EQ(j["other"], 0);
  ASSERT_EQ(fragctl_attribute_device_memory(a, "nccl", "world", 0), FRAGCTL_OK);
  ASSERT_EQ(fragctl_free(a, p, 64 * MiB, nullptr), FRAGCTL_OK);
  ASSERT_EQ(fragctl_destroy(a), FRAGCTL_OK);
}

}  // namespace
}  // namespace fragctl
