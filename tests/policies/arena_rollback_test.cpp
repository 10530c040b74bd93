// Failures midway (issue 30, "transactional mapping everywhere"): every
// multi-step sequence of the arena's driver calls either completes or is
// rolled back, so that a failed cuMemCreate, cuMemMap or cuMemSetAccess under
// memory pressure, or a failed cuMemUnmap or cuMemRelease, leaves the
// allocator consistent and serving later requests (never PyTorch's
// pytorch#188008 state, where one partial mapping failure left every later
// allocation failing).
//
// Each growth scenario builds a state on a backed sim device (live blocks
// carrying patterns, cached spans, pooled handles), then makes one request
// that needs several driver calls of several kinds. The clean run counts
// them (and is the positive control: the same request without a fault
// succeeds). Then, for every kind and every position k of that kind's calls,
// the scenario is rebuilt and the request made with the k-th call failing
// once (a transient fault: the arena's retry absorbs a failed create, map or
// set_access; a failed unmap or release is a runtime error and surfaces as
// backend_error) or failing from the k-th call on (memory pressure that
// stays: out_of_memory with its diagnosis). After each, the arena must be
// consistent: reserved equals what the device has mapped, reserved plus
// pooled what it holds, every mapped run and every live block accessible,
// every pattern intact; and once the fault is gone the same request is
// served at the same address, every block frees, and release_cached and the
// destructor leave the device empty. The shrinking sequences (trim on free,
// release_cached, the destructor) and a double fault (a rollback whose own
// unmap fails) are tested the same way.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <vector>

#include "allocator_policies/arena/arena_policy.hpp"
#include "support/arena_world.hpp"
#include "fragctl/error.hpp"
#include "fragctl/log.hpp"
#include "fragctl/memory_map.hpp"
#include "fragctl/sim_backend.hpp"

namespace fragctl {
namespace {

using testing_arena::G;
using testing_arena::world;

// Kinds of driver call a fault can hit, with the counter of each.
struct call_kind {
  sim_fault_target target;
  backend_call call;
  const char* name;
  bool reports_oom;  // fails as out of memory (false: throws, a runtime error)
};
constexpr call_kind call_kinds[] = {
    {sim_fault_target::create_physical, backend_call::create_physical, "create_physical", true},
    {sim_fault_target::map, backend_call::map, "map", true},
    {sim_fault_target::set_access, backend_call::set_access, "set_access", true},
    {sim_fault_target::unmap, backend_call::unmap, "unmap", false},
    {sim_fault_target::release_physical, backend_call::release_physical, "release_physical", false},
};

enum class fault_mode : std::uint8_t { once, from_then_on };

using call_counts = std::array<std::uint64_t, std::size(call_kinds)>;

call_counts counts(const sim_backend& sim) {
  call_counts c{};
  for (std::size_t i = 0; i < std::size(call_kinds); ++i) c[i] = sim.counters().of(call_kinds[i].call);
  return c;
}

// A state to build and the request that makes the arena grow from it.
struct growth {
  const char* name;
  config cfg;
  std::function<void(world&)> setup;
  std::size_t request;
  call_counts expected;  // calls of each kind (call_kinds order) the request makes
};

config chunked(std::size_t map_chunk, std::size_t threshold = 0, std::uint64_t delay = 1U << 20) {
  config cfg;
  cfg.map_chunk = map_chunk;
  cfg.release_threshold = threshold;
  cfg.release_delay = delay;
  return cfg;
}

// gN below is the N-th granule of the arena's range.
std::vector<growth> growths() {
  return {
      // Spans of 2 granules. A live half-granule block on g0; 9 granules
      // after it need g1..g9: five new spans (cut at even granules), one
      // set_access for the run.
      {"new_spans", chunked(2 * G), [](world& w) { w.take(G / 2); }, 9 * G, {5, 5, 1, 0, 0}},
      // One granule per span. g0 live; g1..g6 freed so that g2, g4, g6 stay
      // cached and the handles of g1, g3, g5 wait in the pool (threshold 3
      // granules, no delay). 8 granules on g1..g8: three pooled handles, two
      // new ones; four runs, one set_access each.
      {"pool_between_cached",
       chunked(G, 3 * G, 0),
       [](world& w) {
         w.take(G);
         std::vector<void*> a;
         for (int i = 1; i <= 6; ++i) a.push_back(w.take(G));
         for (const int i : {1, 3, 5, 2, 4, 6}) w.give(a[static_cast<std::size_t>(i - 1)]);
         ASSERT_EQ(w.arena->pooled_bytes(), 3 * G);
         ASSERT_EQ(w.arena->state().reserved, 4 * G);
       },
       8 * G,
       {2, 5, 4, 0, 0}},
      // One granule per span. g0..g5 live but g1 and g3 freed (cached,
      // kept). 4 granules land on g6..g9: steal g1 and g3 (two unmaps, not
      // adjacent) and create two.
      {"steal_cached",
       chunked(G, GiB),
       [](world& w) {
         std::vector<void*> a;
         for (int i = 0; i < 6; ++i) a.push_back(w.take(G));
         w.give(a[1]);
         w.give(a[3]);
         ASSERT_EQ(w.arena->state().cached_free, 2 * G);
       },
       4 * G,
       {2, 4, 1, 2, 0}},
      // Spans of 4 granules. Live g0..g3 and g8; a cached span on g4..g7
      // (its free range too small for the request) and cached g9..g12. 5
      // granules land on g9..g13 and lack g13: the span on g4..g7 does not
      // fit it, so it is given back (unmap, release) before one granule is
      // created.
      {"give_back_before_creating",
       chunked(4 * G, GiB),
       [](world& w) {
         w.take(4 * G);
         void* f = w.take(4 * G);
         w.take(G);
         void* t = w.take(4 * G);
         w.give(f);
         w.give(t);
         ASSERT_EQ(w.arena->state().reserved, 13 * G);
       },
       5 * G,
       {1, 1, 1, 1, 1}},
  };
}

// Makes `request` with the fault armed and checks the outcome the contract
// gives it: a transient failure of an out-of-memory kind is absorbed by the
// arena's retry; one that stays is out_of_memory with its diagnosis; a failed
// unmap or release (a runtime error) is backend_error from the sim.
void expect_outcome(world& w, const call_kind& kind, fault_mode mode, std::size_t request, std::uintptr_t where) {
  const pool_state before = w.arena->state();
  const std::uint64_t failed = w.sim->counters().failed_allocations;
  if (kind.reports_oom && mode == fault_mode::once) {
    void* p = nullptr;
    EXPECT_NO_THROW(p = w.arena->allocate(request)) << "a failure once was not absorbed by the retry";
    if (p == nullptr) return;
    EXPECT_EQ(w.sim->counters().failed_allocations, failed + 1);
    EXPECT_EQ(w.arena->state().retries, before.retries + 1);
    w.keep(p, request);
    EXPECT_EQ(w.offset(p), where);
    return;
  }
  if (kind.reports_oom) {
    try {
      (void)w.arena->allocate(request);
      ADD_FAILURE() << "expected out_of_memory";
    } catch (const out_of_memory& e) {
      EXPECT_GE(w.sim->counters().failed_allocations, failed + 3) << "three attempts, each failing";
      EXPECT_EQ(e.details().requested, request);
      EXPECT_EQ(e.details().reserved, w.arena->state().reserved + w.arena->pooled_bytes());
      EXPECT_EQ(e.details().cached_free, e.details().reserved - before.allocated);
      EXPECT_EQ(e.details().device_total, w.sim->options().capacity);
    }
    // What the failed attempts created, and every unused span, went back.
    EXPECT_EQ(w.arena->pooled_bytes(), 0U);
  } else {
    try {
      (void)w.arena->allocate(request);
      ADD_FAILURE() << "expected backend_error";
    } catch (const backend_error& e) {
      EXPECT_EQ(e.code_name(), "injected_fault");
    }
  }
  EXPECT_EQ(w.arena->state().allocated, before.allocated);
}

void arm(sim_backend& sim, sim_fault_target target, fault_mode mode, std::uint64_t k) {
  if (mode == fault_mode::once) {
    sim.fail_nth(target, k);
  } else {
    sim.fail_from(target, k);
  }
}

class arena_rollback : public ::testing::Test {
 protected:
  void SetUp() override { set_log_level("off"); }  // failed unmaps are logged by design
  void TearDown() override { set_log_level("warn"); }
};

TEST_F(arena_rollback, every_failing_call_of_a_growth_is_rolled_back) {
  for (const growth& g : growths()) {
    SCOPED_TRACE(g.name);
    // Positive control: without a fault the request succeeds with the calls
    // the scenario was built for, at an address the faulty runs must match.
    std::uintptr_t where = 0;
    {
      world w(g.cfg);
      g.setup(w);
      ASSERT_TRUE(w.consistent());
      const call_counts c0 = counts(*w.sim);
      where = w.offset(w.take(g.request));
      call_counts made{};
      for (std::size_t i = 0; i < made.size(); ++i) made[i] = counts(*w.sim)[i] - c0[i];
      ASSERT_EQ(made, g.expected) << "the scenario no longer makes the calls it was built for";
      ASSERT_EQ(w.arena->state().retries, 0U);
      ASSERT_TRUE(w.consistent());
      w.tear_down();
    }
    for (std::size_t kind = 0; kind < std::size(call_kinds); ++kind) {
      for (std::uint64_t k = 1; k <= g.expected[kind]; ++k) {
        for (const fault_mode mode : {fault_mode::once, fault_mode::from_then_on}) {
          SCOPED_TRACE(testing::Message() << call_kinds[kind].name << " call " << k << " of " << g.expected[kind]
                                          << (mode == fault_mode::once ? " fails once" : " fails from then on"));
          world w(g.cfg);
          g.setup(w);
          arm(*w.sim, call_kinds[kind].target, mode, k);
          expect_outcome(w, call_kinds[kind], mode, g.request, where);
          ASSERT_TRUE(w.consistent());
          w.sim->reset_faults();
          if (!(call_kinds[kind].reports_oom && mode == fault_mode::once)) {
            // The free structure is as it was: the same request lands where
            // it did in the clean run.
            EXPECT_EQ(w.offset(w.take(g.request)), where);
          }
          ASSERT_TRUE(w.consistent());
          w.take(g.request / 2 + 1);  // and the arena keeps serving
          ASSERT_TRUE(w.consistent());
          w.tear_down();
        }
      }
    }
  }
}

// The undo of a failed set_access (or map) unmaps what it mapped; if that
// unmap fails too, the span stays mapped without access. It must never be
// served: it is stranded (still counted in reserved, as the device holds it
// mapped) and unmapped before the arena maps there again.
TEST_F(arena_rollback, a_span_whose_undo_fails_is_never_served) {
  const growth g = growths()[0];  // new_spans: every unmap of its growth is an undo
  struct double_fault {
    call_kind first;
    std::uint64_t at;
    fault_mode unmap_mode;
  };
  std::vector<double_fault> cases;
  for (const fault_mode m : {fault_mode::once, fault_mode::from_then_on}) {
    cases.push_back({call_kinds[2], 1, m});  // set_access: all five spans mapped, none accessible
    for (std::uint64_t at = 2; at <= 5; ++at) cases.push_back({call_kinds[1], at, m});  // map: at - 1 mapped
  }
  for (const double_fault& c : cases) {
    SCOPED_TRACE(testing::Message() << c.first.name << " call " << c.at << " fails, then the undo's unmap "
                                    << (c.unmap_mode == fault_mode::once ? "fails once" : "fails from then on"));
    world w(g.cfg);
    g.setup(w);
    const pool_state before = w.arena->state();
    w.sim->fail_nth(c.first.target, c.at);
    arm(*w.sim, sim_fault_target::unmap, c.unmap_mode, 1);
    void* p = nullptr;
    try {
      p = w.arena->allocate(g.request);
    } catch (const backend_error& e) {
      // The retry found the stranded spans still failing to unmap.
      EXPECT_EQ(c.unmap_mode, fault_mode::from_then_on);
      EXPECT_EQ(e.code_name(), "injected_fault");
      EXPECT_EQ(w.arena->state().allocated, before.allocated);
    }
    if (p != nullptr) {
      // The retry unmapped the stranded span first, then mapped afresh.
      EXPECT_EQ(c.unmap_mode, fault_mode::once);
      w.keep(p, g.request);
    }
    ASSERT_TRUE(w.consistent());
    w.sim->reset_faults();
    w.take(g.request);
    ASSERT_TRUE(w.consistent());
    w.tear_down();
  }
}

// Trimming on free (spans unmapped into the pool): a failed unmap leaves
// that span and the older ones cached; the free itself never fails.
TEST_F(arena_rollback, a_failed_unmap_while_trimming_keeps_the_span_cached) {
  for (const fault_mode mode : {fault_mode::once, fault_mode::from_then_on}) {
    for (std::uint64_t k = 1; k <= 3; ++k) {
      SCOPED_TRACE(testing::Message() << "unmap " << k << (mode == fault_mode::once ? " once" : " onwards"));
      world w(chunked(G, 0, 0));  // every free span unmapped at once
      w.take(G);
      void* a = w.take(3 * G);
      const std::size_t held = w.sim->used_bytes();
      const std::uint64_t unmaps = w.sim->counters().of(backend_call::unmap);
      arm(*w.sim, sim_fault_target::unmap, mode, k);
      w.give(a);  // three spans to unmap, one call each
      EXPECT_EQ(w.sim->counters().of(backend_call::unmap) - unmaps, k) << "trimming stops at the failed unmap";
      EXPECT_EQ(w.arena->state().reserved, G + (4 - k) * G);
      EXPECT_EQ(w.sim->used_bytes(), held);
      ASSERT_TRUE(w.consistent());
      w.sim->reset_faults();
      w.take(3 * G);
      ASSERT_TRUE(w.consistent());
      w.tear_down();
    }
  }
}

// release_cached (and the last resort before out_of_memory): a failed unmap
// or release throws and leaves what it did not reach as it was.
TEST_F(arena_rollback, a_failed_release_cached_can_be_repeated) {
  // g0 live; g1..g3 freed: two cached spans and one pooled handle.
  const auto setup = [](world& w) {
    w.take(G);
    w.give(w.take(3 * G));
    ASSERT_EQ(w.arena->state().reserved, 3 * G);
    ASSERT_EQ(w.arena->pooled_bytes(), G);
  };
  const config cfg = chunked(G, 2 * G, 0);
  for (const call_kind& kind : {call_kinds[3], call_kinds[4]}) {
    const std::uint64_t calls = kind.call == backend_call::unmap ? 2 : 3;
    for (std::uint64_t k = 1; k <= calls; ++k) {
      for (const fault_mode mode : {fault_mode::once, fault_mode::from_then_on}) {
        SCOPED_TRACE(testing::Message() << kind.name << " " << k << (mode == fault_mode::once ? " once" : " onwards"));
        world w(cfg);
        setup(w);
        arm(*w.sim, kind.target, mode, k);
        try {
          w.arena->release_cached();
          ADD_FAILURE() << "expected backend_error";
        } catch (const backend_error& e) {
          EXPECT_EQ(e.code_name(), "injected_fault");
        }
        ASSERT_TRUE(w.consistent());
        w.sim->reset_faults();
        w.arena->release_cached();
        EXPECT_EQ(w.arena->state().reserved, G);
        EXPECT_EQ(w.sim->used_bytes(), G);
        ASSERT_TRUE(w.consistent());
        w.take(4 * G);
        ASSERT_TRUE(w.consistent());
        w.tear_down();
      }
    }
  }
}

// The destructor gives back everything it can: a failed unmap or release
// leaks that one handle (and, mapped, the range), never the others.
TEST_F(arena_rollback, the_destructor_gives_back_everything_but_a_failed_call) {
  // g0 live, two cached spans, one pooled handle: four handles, three mapped.
  for (const call_kind& kind : {call_kinds[3], call_kinds[4]}) {
    const std::uint64_t calls = kind.call == backend_call::unmap ? 3 : 4;
    for (std::uint64_t k = 1; k <= calls; ++k) {
      SCOPED_TRACE(testing::Message() << kind.name << " " << k << " fails");
      world w(chunked(G, 2 * G, 0));
      w.take(G);
      w.give(w.take(3 * G));
      ASSERT_EQ(w.sim->live().physical, 4U);
      w.sim->fail_nth(kind.target, k);
      w.arena.reset();
      const sim_backend::live_objects l = w.sim->live();
      if (kind.call == backend_call::unmap) {
        EXPECT_EQ(l.mappings, 1U);
        EXPECT_EQ(l.physical, 1U);
        EXPECT_EQ(l.reservations, 1U) << "a range with a mapping left cannot be released";
      } else {
        EXPECT_EQ(l.mappings, 0U);
        EXPECT_EQ(l.physical, 1U);
        EXPECT_EQ(l.reservations, 0U);
      }
      EXPECT_EQ(w.sim->used_bytes(), G);
      w.blocks.clear();  // their memory went with the arena
    }
  }
}

}  // namespace
}  // namespace fragctl
