// The stream-order helpers of core (stream_clock.hpp, event_pool.hpp,
// stream_marker.hpp) on a sim backend whose work completes only when the test
// says so.
#include <memory>
#include <vector>

#include "core/event_pool.hpp"
#include "core/stream_clock.hpp"
#include "core/stream_marker.hpp"
#include "fragctl/error.hpp"
#include "fragctl/sim_backend.hpp"
#include "gtest/gtest.h"
#include "support/test_support.hpp"

namespace fragctl {
namespace {

std::uint64_t calls(const sim_backend& b, backend_call c) { return b.counters().of(c); }

// A clock over one stream of a sim backend whose work completes when the
// test says so.
class stream_clock_one_stream : public ::testing::Test {
 protected:
  ~stream_clock_one_stream() override { sim.destroy_stream(s); }

  sim_backend sim{testing::manual_events()};
  const stream_t s = sim.create_stream();
  stream_clock clock{sim};
  const std::uint32_t i = clock.index_of(s);
};

// A stamp whose event was recorded at the free completes with the work queued
// before the free, even though more work was queued after it. Recorded
// lazily (refresh), the same stamp waits for that later work too.
TEST(stream_clock, record_now_fixes_the_point_a_free_waits_for) {
  for (const bool eager : {true, false}) {
    sim_backend sim(testing::manual_events());
    const stream_t s = sim.create_stream();
    {
      stream_clock clock(sim);
      const std::uint32_t i = clock.index_of(s);
      const std::uint64_t before = sim.submit(s);  // work that used the memory
      const free_stamp stamp = clock.on_free(i);
      if (eager) clock.record_now(i);
      sim.submit(s);  // later work on s, unrelated to the free
      clock.refresh(i);
      EXPECT_FALSE(clock.complete(stamp));
      sim.complete_through(s, before);
      clock.refresh(i);
      EXPECT_EQ(clock.complete(stamp), eager) << (eager ? "recorded at the free" : "recorded at the refresh");
      sim.complete(s);
      clock.refresh(i);
      EXPECT_TRUE(clock.complete(stamp));
    }
    sim.destroy_stream(s);
  }
}

// record_now records once per batch of frees: a second call without a free
// in between, and refresh after it, record nothing more.
TEST_F(stream_clock_one_stream, record_now_covers_every_free_so_far_with_one_event) {
  sim.submit(s);
  const free_stamp a = clock.on_free(i);
  const free_stamp b = clock.on_free(i);
  clock.record_now(i);
  clock.record_now(i);
  clock.refresh(i);
  EXPECT_EQ(calls(sim, backend_call::record_event), 1U);
  EXPECT_FALSE(clock.complete(a));
  sim.complete(s);
  clock.refresh(i);
  EXPECT_TRUE(clock.complete(a));
  EXPECT_TRUE(clock.complete(b));
}

// refresh keeps at most a few events in flight per stream; record_now records
// whenever there are uncovered frees.
TEST_F(stream_clock_one_stream, record_now_ignores_the_cap_on_events_in_flight) {
  for (int n = 0; n < 20; ++n) {
    sim.submit(s);
    (void)clock.on_free(i);
    clock.refresh(i);
  }
  const std::uint64_t lazy = calls(sim, backend_call::record_event);
  EXPECT_LT(lazy, 20U);
  for (int n = 0; n < 20; ++n) {
    sim.submit(s);
    (void)clock.on_free(i);
    clock.record_now(i);
  }
  EXPECT_EQ(calls(sim, backend_call::record_event), lazy + 20);
  clock.synchronize_all();
  EXPECT_EQ(calls(sim, backend_call::create_event), lazy + 20) << "every event is in flight until the end";
}

// end_stream: the stream's frees so far are complete without a backend
// call, the clock never records on it again, and its index goes to the next
// new stream, whose frees are pending as any stream's are while the ended
// stream's old stamps stay complete.
TEST(stream_clock, an_ended_stream_is_forgotten_and_its_index_serves_the_next_stream) {
  sim_backend sim(testing::manual_events());
  const stream_t ended = sim.create_stream();
  const stream_t next = sim.create_stream();
  {
    stream_clock clock(sim);
    const std::uint32_t i = clock.index_of(ended);
    sim.submit(ended);
    const free_stamp old = clock.on_free(i);
    clock.refresh(i);  // one event in flight on the stream
    EXPECT_FALSE(clock.complete(old));
    sim.synchronize_stream(ended);  // stream_ending's wait
    const std::uint64_t records = calls(sim, backend_call::record_event);
    clock.end_stream(ended);
    EXPECT_TRUE(clock.complete(old));
    EXPECT_EQ(clock.stream_of(i), nullptr);
    sim.destroy_stream(ended);
    clock.refresh_all();
    clock.synchronize_all();
    EXPECT_EQ(calls(sim, backend_call::record_event), records) << "nothing is recorded on the ended stream";
    EXPECT_EQ(sim.destroyed_stream_calls(), 0u);

    EXPECT_EQ(clock.index_of(next), i) << "the ended stream's index is taken again";
    EXPECT_EQ(clock.stream_count(), 1u);
    EXPECT_TRUE(clock.complete(old)) << "a stamp of the ended stream stays complete";
    sim.submit(next);
    const free_stamp fresh = clock.on_free(i);
    clock.refresh(i);
    EXPECT_FALSE(clock.complete(fresh)) << "the new stream's free waits for its work";
    sim.complete(next);
    clock.refresh(i);
    EXPECT_TRUE(clock.complete(fresh));
  }
  sim.destroy_stream(next);
}

// Many streams (red team, 2026-11-28: a trace of 100,000 streams replayed in
// time quadratic in them, every new stream's lookup a scan of all): past a
// few, streams are found through an index, which ending a stream and taking
// its index again keep right.
TEST(stream_clock, many_streams_keep_their_indices_through_ends_and_reuse) {
  sim_backend sim(testing::manual_events());
  std::vector<stream_t> streams;
  for (int i = 0; i < 200; ++i) streams.push_back(sim.create_stream());
  {
    stream_clock clock(sim);
    std::vector<std::uint32_t> index;
    for (const stream_t s : streams) index.push_back(clock.index_of(s));
    for (std::size_t i = 0; i < streams.size(); ++i) {
      EXPECT_EQ(index[i], i);
      EXPECT_EQ(clock.stream_of(index[i]), streams[i]);
    }
    // Out of order, so that the last-stream shortcut does not answer.
    for (std::size_t i = streams.size(); i-- > 0;) EXPECT_EQ(clock.index_of(streams[i]), index[i]);
    for (std::size_t i = 0; i < streams.size(); i += 2) clock.end_stream(streams[i]);
    for (std::size_t i = 1; i < streams.size(); i += 2) EXPECT_EQ(clock.index_of(streams[i]), index[i]);
    std::vector<stream_t> later;
    for (int i = 0; i < 100; ++i) later.push_back(sim.create_stream());
    std::vector<bool> taken(streams.size(), false);
    for (const stream_t s : later) {
      const std::uint32_t k = clock.index_of(s);
      ASSERT_LT(k, streams.size()) << "an ended stream's index is taken again";
      EXPECT_EQ(k % 2, 0u);
      EXPECT_FALSE(taken[k]);
      taken[k] = true;
      EXPECT_EQ(clock.stream_of(k), s);
    }
    EXPECT_EQ(clock.stream_count(), streams.size());
    for (std::size_t i = 0; i < later.size(); ++i) EXPECT_EQ(clock.stream_of(clock.index_of(later[i])), later[i]);
    // An ended stream's handle met again (the runtime reuses handle values):
    // a stream of its own, not the slot another stream took over.
    const std::uint32_t again = clock.index_of(streams[0]);
    EXPECT_EQ(again, streams.size()) << "no ended index left: a new one";
    EXPECT_EQ(clock.stream_of(again), streams[0]);
    for (const stream_t s : later) EXPECT_NE(clock.index_of(s), again);
    const stream_t one_more = sim.create_stream();
    EXPECT_EQ(clock.index_of(one_more), streams.size() + 1);
    later.push_back(one_more);
    for (const stream_t s : later) sim.destroy_stream(s);
  }
  for (std::size_t i = 1; i < streams.size(); i += 2) sim.destroy_stream(streams[i]);
  for (std::size_t i = 0; i < streams.size(); i += 2) sim.destroy_stream(streams[i]);
}

TEST(event_pool, reuses_returned_events_and_destroys_them_at_teardown) {
  sim_backend sim;
  {
    event_pool pool(sim);
    const event_t a = pool.take();
    pool.give_back(a);
    const event_t b = pool.take();
    EXPECT_EQ(a, b);
    const event_t c = pool.take();
    EXPECT_NE(b, c);
    EXPECT_EQ(pool.created(), 2U);
    EXPECT_EQ(pool.in_use(), 2U);
    pool.give_back(b);
    pool.give_back(c);
    EXPECT_EQ(pool.in_use(), 0U);
  }
  EXPECT_EQ(calls(sim, backend_call::create_event), 2U);
  EXPECT_EQ(calls(sim, backend_call::destroy_event), 2U);
}

TEST(event_pool, a_failed_record_gives_the_event_back) {
  sim_backend sim;
  const stream_t s = sim.create_stream();
  sim.destroy_stream(s);
  event_pool pool(sim);
  EXPECT_THROW((void)pool.record(s), backend_error);
  EXPECT_EQ(pool.created(), 1U);
  EXPECT_EQ(pool.in_use(), 0U);
}

// A marker's event returns to the pool when its last holder lets go, and is
// then recorded again for the next marker.
TEST(marker_pool, markers_share_an_event_until_the_last_holder_goes) {
  sim_backend sim(testing::manual_events());
  const stream_t s = sim.create_stream();
  {
    marker_pool markers(sim);
    marker_ref m = markers.record(s);
    marker_ref copy = m;
    m.reset();
    EXPECT_EQ(markers.held(), 1U);
    const event_t first = copy->event;
    copy.reset();
    EXPECT_EQ(markers.held(), 0U);
    const marker_ref next = markers.record(s);
    EXPECT_EQ(next->event, first);
    EXPECT_EQ(calls(sim, backend_call::create_event), 1U);
  }
  sim.destroy_stream(s);
}

TEST(marker_pool, order_after_waits_only_across_streams) {
  sim_backend sim(testing::manual_events());
  const stream_t a = sim.create_stream();
  const stream_t b = sim.create_stream();
  {
    marker_pool markers(sim);
    sim.submit(a);
    const marker_ref m = markers.record(a);
    EXPECT_FALSE(markers.order_after(a, *m));
    EXPECT_TRUE(markers.order_after(b, *m));
    EXPECT_EQ(calls(sim, backend_call::wait_event), 1U);
    sim.complete_all();
  }
  sim.destroy_stream(a);
  sim.destroy_stream(b);
}

// Per stream only the latest marker stays; other streams' markers are kept.
TEST(marker_pool, add_fence_keeps_the_latest_marker_of_each_stream) {
  sim_backend sim;
  const stream_t a = sim.create_stream();
  const stream_t b = sim.create_stream();
  {
    marker_pool markers(sim);
    const marker_ref a1 = markers.record(a);
    const marker_ref b1 = markers.record(b);
    const marker_ref a2 = markers.record(a);
    std::vector<marker_ref> fences;
    add_fence(fences, a2);
    add_fence(fences, b1);
    add_fence(fences, a1);  // older than a2: ignored
    add_fence(fences, nullptr);
    ASSERT_EQ(fences.size(), 2U);
    EXPECT_EQ(fences[0], a2);
    EXPECT_EQ(fences[1], b1);
  }
  sim.destroy_stream(a);
  sim.destroy_stream(b);
}

}  // namespace
}  // namespace fragctl
