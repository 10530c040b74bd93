// Fault injection on sim at every position of a replayed trace, for every
// policy (docs/reliability.md, "Fault injection").
//
// A real trace prefix (the first events of tests/data/resnet50, sizes scaled
// down so that a backed run holds about 100 MiB of real memory) is replayed once cleanly
// to count the backend calls of each kind it makes: raw allocations,
// physical allocations, maps, set-access calls. Then it is replayed once per
// call position with that one call failing (the fault armed before the
// policy is built, so constructors are covered too). Each run must
//  * report the failure as out_of_memory (from the constructor, or from one
//    allocate: at most one, and a retry of that request succeeds at once), or
//    absorb it (a policy may release cache and retry on its own);
//  * never let a backend_error or a crash out, nor corrupt anything: live
//    blocks never overlap and keep their data (the device is backed by host
//    memory and every block carries a pattern, checked at its free);
//  * leak nothing: once every block is freed and the policy destroyed, the
//    device holds no allocation, handle, mapping, reservation or event.
// A last run per policy fails every third call of every kind at once.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "fragctl/log.hpp"
#include "fragctl/trace.hpp"
#include "fuzz/harness/alloc_sequence.hpp"
#include "fuzz/harness/block_model.hpp"
#include "fuzz/harness/policy_cases.hpp"

namespace fragctl::fuzz {
namespace {

constexpr std::size_t prefix_events = 700;
constexpr std::size_t size_divisor = 64;

// The replayed prefix: allocs and frees, sizes divided by size_divisor.
const std::vector<trace_event>& trace_prefix() {
  static const std::vector<trace_event> events = [] {
    const char* data = std::getenv("FRAGCTL_TEST_DATA");
    std::vector<trace_event> out;
    if (data == nullptr) return out;
    auto t = read_trace(std::string(data) + "/resnet50.trace.csv.gz");
    if (!t.ok()) return out;
    for (trace_event e : t->events) {
      if (out.size() == prefix_events) break;
      e.size = std::max<std::size_t>(1, e.size / size_divisor);
      out.push_back(e);
    }
    return out;
  }();
  return events;
}

struct outcome {
  bool constructed = false;
  std::size_t ooms = 0;
  backend_counters calls;
};

enum class retry : std::uint8_t { must_succeed, may_fail };

// One replay of the prefix on a fresh sim device with faults armed by `arm`.
outcome replay(const policy_case& pc, bool backed, const std::function<void(sim_backend&)>& arm, retry after_oom) {
  sim_options options;
  options.backed = backed;
  options.capacity = backed ? 512 * MiB : 2 * GiB;
  options.virtual_memory = pc.virtual_memory;
  auto cfg = parse_config(pc.conf);
  check(cfg.ok(), "bad case configuration");
  sim_backend sim(options);
  arm(sim);
  outcome out;
  std::unique_ptr<device_allocator> a;
  try {
    a = make_policy(pc.expression, *cfg, sim);
  } catch (const std::bad_alloc&) {
    check_device_empty(sim, "after the constructor ran out of memory");
    out.calls = sim.counters();
    return out;
  }
  out.constructed = true;
  block_model model;
  absl::flat_hash_map<std::uint64_t, void*> live;  // trace address -> block
  std::uint8_t id = 1;
  const auto free_block = [&](void* p) {
    const block_model::block* b = model.find(p);
    if (backed) check(stamped(p, b->bytes, b->id), "a live block of {} bytes lost its data", b->bytes);
    check(a->try_deallocate(p, b->bytes).status == free_status::ok, "free of a live block failed");
    model.erase(p);
  };
  const auto allocate = [&](std::size_t n) -> void* {
    const std::size_t before = a->state().allocated;
    try {
      return a->allocate(n);
    } catch (const std::bad_alloc&) {
      ++out.ooms;
      check(a->state().allocated == before, "out_of_memory changed allocated");
      return nullptr;
    }
  };
  for (const trace_event& e : trace_prefix()) {
    const auto it = live.find(e.addr);
    if (e.kind == trace_event::action::free) {
      if (it == live.end()) continue;  // its allocation failed
      free_block(it->second);
      live.erase(it);
      continue;
    }
    if (it != live.end()) {  // the trace reuses a live address: its free was not recorded
      free_block(it->second);
      live.erase(it);
    }
    void* p = allocate(e.size);
    if (p == nullptr) p = allocate(e.size);  // the allocator must be usable again at once
    if (p == nullptr) {
      check(after_oom == retry::may_fail, "allocate({}) failed again right after one injected failure", e.size);
      continue;
    }
    model.insert(p, e.size, a->allocation_size(e.size), nullptr, id);
    if (backed) stamp(p, e.size, id);
    id = static_cast<std::uint8_t>(id % 250 + 1);
    live.emplace(e.addr, p);
    check(a->state().allocated == model.rounded(), "allocated {} differs from the live blocks' {}",
          a->state().allocated, model.rounded());
  }
  if (backed) model.check_patterns();
  for (const auto& [addr, p] : live) free_block(p);
  check(a->state().allocated == 0, "allocated is {} with every block freed", a->state().allocated);
  a->release_cached();
  a.reset();
  check_device_empty(sim, "after the policy was destroyed");
  out.calls = sim.counters();
  return out;
}

struct fault_kind {
  sim_fault_target target;
  backend_call call;
  const char* name;
};
constexpr fault_kind fault_kinds[] = {
    {sim_fault_target::allocate, backend_call::allocate, "allocate"},
    {sim_fault_target::create_physical, backend_call::create_physical, "create_physical"},
    {sim_fault_target::map, backend_call::map, "map"},
    {sim_fault_target::set_access, backend_call::set_access, "set_access"},
};

class fault_injection : public ::testing::TestWithParam<policy_case> {
 protected:
  void SetUp() override {
    set_log_level("off");  // warm-up shortfalls and teardown warnings are expected
    ASSERT_EQ(trace_prefix().size(), prefix_events) << "tests/data/resnet50.trace.csv.gz not readable";
  }
  void TearDown() override { set_log_level("warn"); }

  // Every position of every kind of call, one failing call per run.
  void every_position(bool backed) {
    const policy_case& pc = GetParam();
    outcome clean;
    ASSERT_NO_THROW(clean = replay(pc, backed, [](sim_backend&) {}, retry::must_succeed));
    ASSERT_TRUE(clean.constructed);
    ASSERT_EQ(clean.ooms, 0U) << "the clean replay does not fit the device";
    std::size_t runs = 0;
    for (const fault_kind& kind : fault_kinds) {
      const std::uint64_t positions = clean.calls.of(kind.call);
      for (std::uint64_t k = 1; k <= positions; ++k) {
        SCOPED_TRACE(testing::Message() << pc.expression << ": " << kind.name << " call " << k << " of "
                                        << positions << " fails");
        try {
          const outcome o = replay(pc, backed, [&](sim_backend& sim) { sim.fail_nth(kind.target, k); },
                                   retry::must_succeed);
          EXPECT_GE(o.calls.failed_allocations, 1U) << "the injected failure never happened";
          EXPECT_LE(o.ooms, 1U) << "one injected failure made several requests fail";
        } catch (const std::exception& e) {
          ADD_FAILURE() << e.what();
        }
        ++runs;
      }
    }
    EXPECT_GT(runs, 0U);
  }
};

TEST_P(fault_injection, every_failing_call_position_is_reported_cleanly_and_loses_nothing) {
  every_position(/*backed=*/true);
}

TEST_P(fault_injection, a_flaky_backend_never_corrupts) {
  const auto flaky = [](sim_backend& sim) {
    for (const fault_kind& kind : fault_kinds) sim.fail_every(kind.target, 3);
  };
  try {
    const outcome o = replay(GetParam(), /*backed=*/true, flaky, retry::may_fail);
    std::uint64_t calls = 0;
    for (const fault_kind& kind : fault_kinds) calls += o.calls.of(kind.call);
    if (calls >= 3) {
      EXPECT_GT(o.calls.failed_allocations, 0U);
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(policies, fault_injection, ::testing::ValuesIn(policy_cases),
                         [](const auto& test) { return std::string(test.param.name); });

}  // namespace
}  // namespace fragctl::fuzz
