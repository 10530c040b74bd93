// stream_use_adaptor: record_stream keeps a freed block from reuse until every
// stream that used it has passed the free. Each test runs the same sequence
// with and without record_stream: without it (the positive control) the block
// comes back at once, which on a GPU would let the main stream overwrite data
// a side stream still reads.
#include <memory>
#include <string>

#include "fragctl/adaptors.hpp"
#include "fragctl/allocator_stack.hpp"
#include "fragctl/config.hpp"
#include "fragctl/error.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/sim_backend.hpp"
#include "gtest/gtest.h"
#include "support/test_support.hpp"

namespace fragctl {
namespace {

using testing::manual_events;

// A stack over the default policy of a sim backend whose events complete
// only when the test says so.
struct fixture {
  explicit fixture(const std::string& policy) {
    auto b = std::make_unique<sim_backend>(manual_events());
    sim = b.get();
    config cfg;
    cfg.policy = policy;
    stack = std::make_unique<allocator_stack>(std::move(b), cfg);
  }
  device_allocator& allocator() { return stack->allocator(); }
  sim_backend* sim = nullptr;
  std::unique_ptr<allocator_stack> stack;
};

constexpr std::size_t block_bytes = 4 * MiB;

class stream_use : public ::testing::TestWithParam<std::string> {};

TEST_P(stream_use, a_block_used_on_a_side_stream_is_not_reused_before_that_stream_passes_the_free) {
  fixture f(GetParam());
  stream_t main = f.sim->create_stream();
  stream_t side = f.sim->create_stream();

  // Positive control: without record_stream the main stream gets the same
  // block straight back (stream order on main makes that right for main).
  void* control = f.allocator().allocate(block_bytes, main);
  f.allocator().deallocate(control, block_bytes, main);
  void* again = f.allocator().allocate(block_bytes, main);
  EXPECT_EQ(again, control) << "the control needs same-stream reuse to show what record_stream prevents";
  f.allocator().deallocate(again, block_bytes, main);

  void* p = f.allocator().allocate(block_bytes, main);
  f.allocator().record_stream(p, side);
  f.sim->submit(side);  // the side stream's read, still queued
  f.allocator().deallocate(p, block_bytes, main);

  void* q = f.allocator().allocate(block_bytes, main);
  EXPECT_NE(q, p) << "a block the side stream still uses was handed out again";
  f.allocator().deallocate(q, block_bytes, main);

  f.sim->complete(side);
  void* r = f.allocator().allocate(block_bytes, main);
  void* s = f.allocator().allocate(block_bytes, main);
  EXPECT_TRUE(r == p || s == p) << "once the side stream passed the free the block is reusable";
  f.allocator().deallocate(r, block_bytes, main);
  f.allocator().deallocate(s, block_bytes, main);
}

TEST_P(stream_use, every_recorded_stream_must_pass_and_release_cached_waits_for_them) {
  fixture f(GetParam());
  stream_t main = f.sim->create_stream();
  stream_t side1 = f.sim->create_stream();
  stream_t side2 = f.sim->create_stream();

  void* p = f.allocator().allocate(block_bytes, main);
  f.sim->submit(side1);
  f.sim->submit(side2);
  f.allocator().record_stream(p, side1);
  f.allocator().record_stream(p, side2);
  f.allocator().record_stream(p, side2);  // twice is once
  f.allocator().deallocate(p, block_bytes, main);
  EXPECT_EQ(f.stack->stats().pool.allocated, f.allocator().allocation_size(block_bytes))
      << "the deferred block stays allocated in the policy";

  f.sim->complete(side1);
  void* q = f.allocator().allocate(block_bytes, main);
  EXPECT_NE(q, p) << "side2 has not passed the free yet";
  f.allocator().deallocate(q, block_bytes, main);

  f.allocator().release_cached();  // waits for side2, then gives everything back
  EXPECT_EQ(f.stack->stats().pool.allocated, 0u);
  EXPECT_EQ(f.stack->stats().reserved.current, 0u);
}

TEST_P(stream_use, an_allocation_that_finds_no_memory_waits_for_deferred_frees) {
  fixture f(GetParam());
  stream_t main = f.sim->create_stream();
  stream_t side = f.sim->create_stream();
  f.stack->set_limit(block_bytes);

  void* p = f.allocator().allocate(block_bytes, main);
  f.sim->submit(side);
  f.allocator().record_stream(p, side);
  f.allocator().deallocate(p, block_bytes, main);
  // Under the cap only the deferred block's bytes can serve this: the
  // adaptor waits for the side stream (synchronize) and retries.
  void* q = f.allocator().allocate(block_bytes, main);
  EXPECT_NE(q, nullptr);
  f.allocator().deallocate(q, block_bytes, main);
}

TEST_P(stream_use, frees_without_recorded_streams_are_not_deferred) {
  fixture f(GetParam());
  stream_t main = f.sim->create_stream();
  stream_t side = f.sim->create_stream();
  void* used_elsewhere = f.allocator().allocate(block_bytes, main);
  f.allocator().record_stream(used_elsewhere, side);
  void* p = f.allocator().allocate(block_bytes, main);
  f.allocator().deallocate(p, block_bytes, main);
  EXPECT_EQ(f.stack->stats().pool.allocated, f.allocator().allocation_size(block_bytes))
      << "only the block with a recorded stream stays allocated";
  f.allocator().deallocate(used_elsewhere, block_bytes, main);
  f.sim->complete_all();
  f.allocator().release_cached();
  EXPECT_EQ(f.stack->stats().pool.allocated, 0u);
}

TEST_P(stream_use, a_second_free_of_a_block_whose_free_waits_is_a_double_free_that_changes_nothing) {
  fixture f(GetParam());
  stream_t main = f.sim->create_stream();
  stream_t side = f.sim->create_stream();

  void* p = f.allocator().allocate(block_bytes, main);
  f.allocator().record_stream(p, side);
  f.sim->submit(side);
  f.allocator().deallocate(p, block_bytes, main);  // waits for the side stream
  ASSERT_EQ(f.stack->stats().pool.allocated, f.allocator().allocation_size(block_bytes));
  // Positive control of the report: a pointer never handed out counts once.
  int foreign = 0;
  f.allocator().deallocate(&foreign, block_bytes, main);
  ASSERT_EQ(f.allocator().misuse().not_owned, 1u);

  f.allocator().deallocate(p, block_bytes, main);  // the program's mistake
  EXPECT_EQ(f.allocator().misuse().not_owned, 2u) << "a second free of a waiting block is a double free";
  EXPECT_EQ(f.stack->stats().pool.allocated, f.allocator().allocation_size(block_bytes))
      << "the double free reached the policy: the block is free there while the side stream still reads it";

  // Nor may it cost a later block: p is not handed out while the side
  // stream reads it, and the waiting free, once the side stream passes it,
  // frees p and nothing else (before: q got p at once, and the waiting
  // free then freed q's block under its owner, which r got again).
  void* q = f.allocator().allocate(block_bytes, main);
  EXPECT_NE(q, p) << "a block the side stream still reads was handed out again";
  f.sim->complete(side);
  void* r = f.allocator().allocate(block_bytes, main);  // hands the waiting free back first
  EXPECT_NE(r, q) << "one block handed out twice";
  EXPECT_EQ(f.stack->stats().pool.allocated, 2 * f.allocator().allocation_size(block_bytes));
  f.allocator().deallocate(q, block_bytes, main);
  f.allocator().deallocate(r, block_bytes, main);
  EXPECT_EQ(f.stack->stats().pool.allocated, 0u);
  EXPECT_EQ(f.allocator().misuse().not_owned, 2u);
}

TEST_P(stream_use, record_stream_of_a_pointer_that_is_no_live_block_records_nothing) {
  fixture f(GetParam());
  stream_t main = f.sim->create_stream();
  stream_t side = f.sim->create_stream();
  f.sim->submit(side);  // the side stream stays busy throughout

  // A freed block's address, and an interior pointer of a live block: no
  // block starts there, so no free is to be held back. Before, the use was
  // kept under the address, and the next block handed out there waited
  // for the side stream when freed.
  void* p = f.allocator().allocate(block_bytes, main);
  f.allocator().deallocate(p, block_bytes, main);
  f.allocator().record_stream(p, side);
  void* live = f.allocator().allocate(block_bytes, main);
  ASSERT_EQ(live, p) << "the test needs the freed address handed out again";
  f.allocator().record_stream(static_cast<char*>(live) + 4096, side);
  f.allocator().deallocate(live, block_bytes, main);
  EXPECT_EQ(f.stack->stats().pool.allocated, 0u) << "a free held back by a use recorded on a pointer no block had";
  EXPECT_EQ(f.allocator().misuse().not_owned, 0u) << "record_stream of a foreign pointer is no misuse (as PyTorch)";

  // Positive control: the same use recorded on the live block holds its free back.
  void* q = f.allocator().allocate(block_bytes, main);
  f.allocator().record_stream(q, side);
  f.allocator().deallocate(q, block_bytes, main);
  EXPECT_EQ(f.stack->stats().pool.allocated, f.allocator().allocation_size(block_bytes));
  f.sim->complete(side);
  f.allocator().release_cached();
  EXPECT_EQ(f.stack->stats().pool.allocated, 0u);
}

TEST_P(stream_use, a_wrong_size_free_of_a_block_with_recorded_uses_is_reported_at_once_with_the_true_size) {
  fixture f(GetParam());
  stream_t main = f.sim->create_stream();
  stream_t side = f.sim->create_stream();
  f.sim->submit(side);

  void* p = f.allocator().allocate(block_bytes, main);
  f.allocator().record_stream(p, side);
  f.allocator().deallocate(p, block_bytes / 2, main);  // the wrong size; the free waits for the side stream
  EXPECT_EQ(f.allocator().misuse().size_mismatch, 1u) << "a wrong size must be reported when the caller frees";
  EXPECT_EQ(f.stack->stats().requested.current, 0u) << "the statistics counted the size given, not the block's";

  f.sim->complete(side);
  f.allocator().release_cached();  // the waiting free goes to the policy, with the block's size
  EXPECT_EQ(f.stack->stats().pool.allocated, 0u);
  EXPECT_EQ(f.allocator().misuse().size_mismatch, 1u) << "reported once";

  // Positive control: the right size is no misuse.
  void* q = f.allocator().allocate(block_bytes, main);
  f.allocator().record_stream(q, side);
  f.allocator().deallocate(q, block_bytes, main);
  EXPECT_EQ(f.allocator().misuse().size_mismatch, 1u);
}

// A stream the allocator knows only from record_stream, and a waiting free
// that named it, when its owner destroys it. stream_ending waits for the
// stream's queued work (the blocks it used may go to other streams after),
// and nothing names the handle again: neither the deferred frees going to
// the policy nor the trim. The control destroys the stream unannounced.
void end_a_recorded_stream(const std::string& policy, bool announce) {
  SCOPED_TRACE(announce ? "stream_ending" : "control: no stream_ending");
  fixture f(policy);
  stream_t main = f.sim->create_stream();
  stream_t side = f.sim->create_stream();
  stream_t reader = f.sim->create_stream();

  void* used_on_side = f.allocator().allocate(block_bytes, main);
  f.allocator().record_stream(used_on_side, side);
  void* freed_on_side = f.allocator().allocate(block_bytes, main);
  f.allocator().record_stream(freed_on_side, reader);
  f.sim->submit(side);  // the side stream's read of used_on_side, queued
  f.sim->submit(reader);
  f.allocator().deallocate(used_on_side, block_bytes, main);  // waits for side
  f.allocator().deallocate(freed_on_side, block_bytes, side);  // names side; waits for reader
  event_t queued = f.sim->create_event();
  f.sim->record_event(queued, side);

  if (announce) {
    f.allocator().stream_ending(side);
    EXPECT_TRUE(f.sim->query_event(queued)) << "stream_ending returned before the side stream's work was done";
  }
  f.sim->destroy_stream(side);
  f.sim->destroy_event(queued);
  f.sim->complete(reader);
  try {
    void* p = f.allocator().allocate(block_bytes, main);  // hands the deferred frees to the policy
    f.allocator().deallocate(p, block_bytes, main);
    f.allocator().release_cached();
  } catch (const backend_error& e) {
    EXPECT_FALSE(announce) << e.what();
  }
  if (announce) {
    EXPECT_EQ(f.stack->stats().pool.allocated, 0u) << "both deferred frees reached the policy";
    EXPECT_EQ(f.sim->destroyed_stream_calls(), 0u) << "the allocator named the stream after stream_ending";
  } else {
    f.sim->complete_all();
    EXPECT_GT(f.sim->destroyed_stream_calls(), 0u) << "the control names the destroyed stream";
  }
  f.stack.reset();
  f.sim = nullptr;
}

// A live block used on a stream that then ends: the use is dropped with the
// stream, so the block's later free neither waits nor names the stream.
TEST_P(stream_use, a_use_recorded_on_a_stream_that_ended_is_dropped) {
  fixture f(GetParam());
  stream_t main = f.sim->create_stream();
  stream_t side = f.sim->create_stream();
  void* p = f.allocator().allocate(block_bytes, main);
  f.allocator().record_stream(p, side);
  f.sim->submit(side);
  f.allocator().stream_ending(side);
  f.sim->destroy_stream(side);
  f.allocator().deallocate(p, block_bytes, main);
  EXPECT_EQ(f.stack->stats().pool.allocated, 0u) << "the free went to the policy at once";
  void* q = f.allocator().allocate(block_bytes, main);
  f.allocator().deallocate(q, block_bytes, main);
  f.allocator().release_cached();
  EXPECT_EQ(f.sim->destroyed_stream_calls(), 0u);
}

TEST_P(stream_use, a_stream_known_from_record_stream_is_waited_for_and_forgotten_when_it_ends) {
  end_a_recorded_stream(GetParam(), /*announce=*/true);
  end_a_recorded_stream(GetParam(), /*announce=*/false);
}

INSTANTIATE_TEST_SUITE_P(policies, stream_use, ::testing::Values("arena", "caching", "buckets:arena"),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           std::string name = param.param;
                           for (char& c : name) {
                             if (c == ':') c = '_';
                           }
                           return name;
                         });

TEST(stream_use_adaptor, a_bare_policy_refuses_record_stream) {
  sim_backend backend;
  config cfg;
  auto policy = make_policy("caching", cfg, backend);
  void* p = policy->allocate(4096);
  EXPECT_THROW(policy->record_stream(p, nullptr), invalid_argument);
  policy->deallocate(p, 4096);
}

// The live-block table names each block's stream, which a caller freeing by
// pointer alone passes back (PyTorch's free): after stream_ending it names
// the default stream.
TEST(block_table_adaptor, a_block_of_a_stream_that_ended_names_the_default_stream) {
  config cfg;
  cfg.block_table = true;
  auto backend = std::make_unique<sim_backend>();
  sim_backend& sim = *backend;
  allocator_stack stack(std::move(backend), cfg);
  stream_t s = sim.create_stream();
  stream_t kept = sim.create_stream();
  void* p = stack.allocator().allocate(4096, s);
  void* q = stack.allocator().allocate(4096, kept);
  ASSERT_EQ(stack.allocator().block_info(p)->stream, s);
  stack.allocator().stream_ending(s);
  EXPECT_EQ(stack.allocator().block_info(p)->stream, nullptr);
  EXPECT_EQ(stack.allocator().block_info(q)->stream, kept) << "another stream's blocks keep theirs";
  sim.destroy_stream(s);
  stack.allocator().deallocate(p, 4096, stack.allocator().block_info(p)->stream);
  stack.allocator().deallocate(q, 4096, kept);
  stack.allocator().release_cached();
  EXPECT_EQ(sim.destroyed_stream_calls(), 0u);
}

TEST(allocator_stack, set_limit_caps_and_reset_peaks_starts_a_window) {
  config cfg;
  cfg.policy = "caching";
  allocator_stack stack(std::make_unique<sim_backend>(), cfg);
  device_allocator& a = stack.allocator();
  void* big = a.allocate(64 * MiB);
  a.deallocate(big, 64 * MiB);
  EXPECT_EQ(stack.stats().window_peak.requested, 64 * MiB);
  stack.reset_peaks();
  void* small = a.allocate(MiB);
  allocator_stats s = stack.stats();
  EXPECT_EQ(s.window_peak.requested, MiB);
  EXPECT_EQ(s.requested.peak, 64 * MiB) << "the lifetime peak is kept";
  EXPECT_EQ(s.totals.requested, 65 * MiB);
  EXPECT_EQ(s.totals.requested_freed, 64 * MiB);
  EXPECT_EQ(s.window_peak.live_blocks, 1u);

  stack.set_limit(2 * MiB);
  EXPECT_EQ(stack.limit(), 2 * MiB);
  EXPECT_THROW((void)a.allocate(4 * MiB), out_of_memory);
  stack.set_limit(0);
  void* ok = a.allocate(4 * MiB);
  a.deallocate(ok, 4 * MiB);
  a.deallocate(small, MiB);
}

}  // namespace
}  // namespace fragctl
