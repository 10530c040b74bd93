// Tests of device_backend::wait_event on the simulator: a stream that waits
// on another stream's event holds its later work, never the host.
#include <gtest/gtest.h>

#include "fragctl/error.hpp"
#include "fragctl/sim_backend.hpp"

namespace fragctl {
namespace {

sim_options manual() {
  sim_options o;
  o.manual_completion = true;
  return o;
}

TEST(sim_wait_event, holds_later_work_until_the_event_completes) {
  sim_backend sim(manual());
  stream_t producer = sim.create_stream();
  stream_t copier = sim.create_stream();
  event_t written = sim.create_event();
  event_t before = sim.create_event();
  event_t copied = sim.create_event();

  sim.submit(copier);  // work queued before the wait is not held
  sim.record_event(before, copier);
  sim.submit(producer);
  sim.record_event(written, producer);
  sim.wait_event(copier, written);
  sim.submit(copier);
  sim.record_event(copied, copier);

  sim.complete(copier);
  EXPECT_TRUE(sim.query_event(before));
  EXPECT_FALSE(sim.query_event(copied));  // held by the wait
  sim.complete(producer);
  EXPECT_TRUE(sim.query_event(written));
  EXPECT_FALSE(sim.query_event(copied));  // nothing completes by itself
  sim.complete(copier);
  EXPECT_TRUE(sim.query_event(copied));
  EXPECT_EQ(sim.counters().of(backend_call::wait_event), 1u);

  for (event_t e : {written, before, copied}) sim.destroy_event(e);
  sim.destroy_stream(producer);
  sim.destroy_stream(copier);
}

TEST(sim_wait_event, synchronize_and_complete_all_finish_what_is_awaited) {
  sim_backend sim(manual());
  stream_t a = sim.create_stream();
  stream_t b = sim.create_stream();
  event_t on_a = sim.create_event();
  event_t on_b = sim.create_event();

  sim.submit(a);
  sim.record_event(on_a, a);
  sim.wait_event(b, on_a);
  sim.submit(b);
  sim.record_event(on_b, b);
  sim.synchronize_event(on_b);  // completes a first, as a GPU would
  EXPECT_TRUE(sim.query_event(on_a));
  EXPECT_TRUE(sim.query_event(on_b));

  sim.submit(a);
  sim.record_event(on_a, a);
  sim.wait_event(b, on_a);
  sim.submit(b);
  sim.record_event(on_b, b);
  sim.complete_all();
  EXPECT_TRUE(sim.query_event(on_b));

  sim.submit(a);
  sim.record_event(on_a, a);
  sim.wait_event(b, on_a);
  sim.submit(b);
  sim.synchronize_stream(b);
  EXPECT_TRUE(sim.query_event(on_a));

  sim.destroy_event(on_a);
  sim.destroy_event(on_b);
  sim.destroy_stream(a);
  sim.destroy_stream(b);
}

TEST(sim_wait_event, completed_unrecorded_and_same_stream_events_hold_nothing) {
  sim_backend sim(manual());
  stream_t a = sim.create_stream();
  stream_t b = sim.create_stream();
  event_t never = sim.create_event();
  event_t e = sim.create_event();
  event_t after = sim.create_event();

  sim.wait_event(b, never);
  sim.submit(a);
  sim.record_event(e, a);
  sim.complete(a);
  sim.wait_event(b, e);  // already complete
  sim.submit(a);
  sim.record_event(e, a);
  sim.wait_event(a, e);  // a stream is ordered with itself
  sim.submit(b);
  sim.submit(a);
  sim.record_event(after, b);
  sim.complete(b);
  EXPECT_TRUE(sim.query_event(after));
  sim.complete(a);
  EXPECT_TRUE(sim.query_event(e));

  // Re-recording the event later does not change what an earlier wait waits for.
  sim.submit(a);
  sim.record_event(e, a);
  sim.wait_event(b, e);
  sim.submit(b);
  sim.record_event(after, b);
  sim.submit(a);
  sim.record_event(e, a);  // now marks two items of a
  sim.complete(a);
  sim.complete(b);
  EXPECT_TRUE(sim.query_event(after));

  EXPECT_THROW(sim.wait_event(b, reinterpret_cast<event_t>(std::uintptr_t{0x1234})), backend_error);
  for (event_t x : {never, e, after}) sim.destroy_event(x);
  sim.destroy_stream(a);
  sim.destroy_stream(b);
}

// Two streams that wait on each other at different points (no cycle in the
// work): a waits for b's first unit, b for a's second, a for b's second.
// Synchronizing a's third unit forces b, which forces a's second unit, which
// takes a wait off a's list while a's own walk of it is under way: before,
// the walk then erased past the list's end (ASan: negative-size-param;
// Release: heap corruption).
TEST(sim_wait_event, streams_waiting_on_each_other_at_different_points_complete_in_order) {
  sim_backend sim(manual());
  stream_t a = sim.create_stream();
  stream_t b = sim.create_stream();
  event_t b1 = sim.create_event(), a2 = sim.create_event(), b2 = sim.create_event(), a3 = sim.create_event();
  sim.submit(a);  // a:1
  sim.submit(b);  // b:1
  sim.record_event(b1, b);
  sim.wait_event(a, b1);
  sim.submit(a);  // a:2, after b:1
  sim.record_event(a2, a);
  sim.wait_event(b, a2);
  sim.submit(b);  // b:2, after a:2
  sim.record_event(b2, b);
  sim.wait_event(a, b2);
  sim.submit(a);  // a:3, after b:2
  sim.record_event(a3, a);
  EXPECT_FALSE(sim.query_event(a3));
  EXPECT_FALSE(sim.query_event(b2));
  sim.synchronize_event(a3);
  EXPECT_TRUE(sim.query_event(a3));
  EXPECT_TRUE(sim.query_event(b2)) << "a:3 waits for b:2";
  EXPECT_TRUE(sim.query_event(a2));
  EXPECT_TRUE(sim.query_event(b1));
  for (event_t e : {b1, a2, b2, a3}) sim.destroy_event(e);
  sim.destroy_stream(a);
  sim.destroy_stream(b);
}

TEST(sim_wait_event, automatic_completion_never_holds) {
  sim_backend sim;  // work completes at once
  stream_t a = sim.create_stream();
  stream_t b = sim.create_stream();
  event_t e = sim.create_event();
  sim.submit(a);
  sim.record_event(e, a);
  sim.wait_event(b, e);
  sim.submit(b);
  sim.record_event(e, b);
  EXPECT_TRUE(sim.query_event(e));
  sim.destroy_event(e);
  sim.destroy_stream(a);
  sim.destroy_stream(b);
}

}  // namespace
}  // namespace fragctl
