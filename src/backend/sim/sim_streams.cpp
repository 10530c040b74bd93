// sim_backend: streams and events. A stream is two counters, work submitted
// and work completed; an event remembers the stream and the submitted count
// when it was recorded and is complete once the stream's completed count
// reaches it. Streams the caller did not create (a framework's, a trace's) are
// met on first use and live as long as the backend. A wait_event on a pending
// event adds a wait to the stream: its later work cannot complete before the
// awaited stream reaches the event's stamp.
#include <algorithm>

#include "backend/sim/sim_state.hpp"
#include "fmt/format.h"
#include "fragctl/sim_backend.hpp"

namespace fragctl {

using sim_detail::address_of;
using sim_detail::fail;
using sim_detail::pointer_to;
using sim_detail::sim_error;

sim_detail::stream_state& sim_backend::state::stream_for(const char* call, stream_t stream) {
  auto [it, met] = streams.try_emplace(address_of(stream));
  if (it->second.destroyed) {
    destroyed_stream_calls.fetch_add(1, std::memory_order_relaxed);
    fail(sim_error::invalid_handle, fmt::format("{}: stream {} was destroyed", call, stream));
  }
  return it->second;
}

void sim_backend::state::submit(sim_detail::stream_state& s) const {
  ++s.submitted;
  if (!options.manual_completion) s.completed = s.submitted;
}

bool sim_backend::state::advance(sim_detail::stream_state& s, std::uint64_t target, bool force,
                                 int depth) {
  // A cycle of waits is a deadlock on a GPU too; the depth bounds the search.
  if (depth > 64) fail(sim_error::invalid_value, "wait_event: the streams wait on each other (deadlock)");
  target = std::min(target, s.submitted);
  // The front wait each time: forcing the awaited stream may advance this
  // one too (the two wait on each other at different points), which takes
  // waits off its front on the way.
  while (!s.waits.empty() && s.waits.front().after < target) {
    const sim_detail::stream_wait w = s.waits.front();
    auto it = streams.find(w.stream);
    if (it == streams.end() || it->second.completed >= w.stamp) {
      s.waits.erase(s.waits.begin());
      continue;
    }
    if (!force) {
      target = w.after;
      break;
    }
    advance(it->second, w.stamp, true, depth + 1);  // it reaches the stamp: the wait goes next time round
  }
  if (target <= s.completed) return false;
  s.completed = target;
  return true;
}

sim_detail::event_state& sim_backend::state::event_for(const char* call, event_t event) {
  auto it = events.find(address_of(event));
  if (it == events.end())
    fail(sim_error::invalid_handle, fmt::format("{}: {} is not a live event", call, event));
  return it->second;
}

bool sim_backend::state::event_done(const sim_detail::event_state& e) const {
  if (!e.recorded) return true;
  auto it = streams.find(e.stream);
  return it == streams.end() || it->second.completed >= e.stamp;
}

event_t sim_backend::do_create_event() {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  const std::uintptr_t handle = sim_detail::event_handle_base + 16 * s.next_event++;
  s.events.emplace(handle, sim_detail::event_state{});
  return pointer_to(handle);
}

void sim_backend::do_destroy_event(event_t event) {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  if (s.events.erase(address_of(event)) == 0) {
    fail(sim_error::invalid_handle, fmt::format("destroy_event: {} is not a live event", event));
  }
}

void sim_backend::do_record_event(event_t event, stream_t stream) {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  sim_detail::event_state& e = s.event_for("record_event", event);
  // An event marks the work queued so far; it is not work itself, so an event
  // recorded on an idle stream is complete at once, as on a GPU.
  const sim_detail::stream_state& st = s.stream_for("record_event", stream);
  e = {true, address_of(stream), st.submitted};
}

bool sim_backend::do_query_event(event_t event) {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  return s.event_done(s.event_for("query_event", event));
}

void sim_backend::do_synchronize_event(event_t event) {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  const sim_detail::event_state& e = s.event_for("synchronize_event", event);
  if (!e.recorded) return;
  auto it = s.streams.find(e.stream);
  if (it != s.streams.end()) s.advance(it->second, e.stamp, /*force=*/true);
}

void sim_backend::do_synchronize_stream(stream_t stream) {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  sim_detail::stream_state& st = s.stream_for("synchronize_stream", stream);
  s.advance(st, st.submitted, /*force=*/true);
}

void sim_backend::do_wait_event(stream_t stream, event_t event) {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  const sim_detail::event_state e = s.event_for("wait_event", event);
  sim_detail::stream_state& st = s.stream_for("wait_event", stream);
  if (s.event_done(e) || e.stream == sim_detail::address_of(stream)) return;  // nothing to wait for
  st.waits.push_back({st.submitted, e.stream, e.stamp});
}

stream_t sim_backend::do_create_stream() {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  std::uintptr_t handle = 0;
  do {
    handle = sim_detail::stream_handle_base + 16 * s.next_stream++;
  } while (s.streams.contains(handle));  // a caller's stream already uses that value
  s.streams[handle].created = true;
  return pointer_to(handle);
}

void sim_backend::do_destroy_stream(stream_t stream) {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  auto it = s.streams.find(address_of(stream));
  if (it == s.streams.end() || !it->second.created || it->second.destroyed) {
    fail(sim_error::invalid_handle,
         fmt::format("destroy_stream: {} is not a live stream from create_stream", stream));
  }
  // Kept (as destroyed) so events recorded on it still resolve; work queued on
  // it completes when the test says so, as it would on a GPU.
  it->second.destroyed = true;
}

std::uint64_t sim_backend::submit(stream_t stream) {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  sim_detail::stream_state& st = s.stream_for("submit", stream);
  s.submit(st);
  return st.submitted;
}

void sim_backend::complete_through(stream_t stream, std::uint64_t item) {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  auto it = s.streams.find(address_of(stream));
  if (it != s.streams.end()) s.advance(it->second, item, /*force=*/false);
}

void sim_backend::complete(stream_t stream) {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  auto it = s.streams.find(address_of(stream));
  if (it != s.streams.end()) s.advance(it->second, it->second.submitted, /*force=*/false);
}

void sim_backend::complete_all() {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  bool moved = true;
  while (moved) {
    moved = false;
    for (auto& [handle, st] : s.streams) moved = s.advance(st, st.submitted, /*force=*/false) || moved;
  }
}

}  // namespace fragctl
