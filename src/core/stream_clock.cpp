#include "core/stream_clock.hpp"

#include <algorithm>

#include "fragctl/error.hpp"
#include "fragctl/log.hpp"

namespace fragctl {
namespace {
// Events a stream may have in flight before refresh stops recording more:
// a GPU far behind the host would otherwise get one event per refresh.
constexpr std::size_t max_pending_events = 8;
}  // namespace

stream_clock::stream_clock(device_backend& backend) : backend_(backend), events_(backend) { streams_.reserve(16); }

stream_clock::~stream_clock() {
  for (stream_state& s : streams_) {
    for (const pending_event& p : s.pending) events_.give_back(p.event);
  }
}

std::uint32_t stream_clock::lookup(stream_t stream) {
  auto it = find(stream);
  if (it == streams_.end()) {
    // An ended stream's index first: its tick runs on, so stamps it gave
    // stay complete (its completed tick covers them). Room in both tables
    // first, so that a throw leaves the clock as it was.
    index_.reserve(index_.size() + 1);
    if (ended_.empty()) {
      streams_.emplace_back();
      it = streams_.end() - 1;
    } else {
      it = streams_.begin() + ended_.back();
      ended_.pop_back();
    }
    it->stream = stream;
    it->ended = false;
    index_.emplace(stream, static_cast<std::uint32_t>(it - streams_.begin()));
  }
  last_stream_ = stream;
  last_index_ = static_cast<std::uint32_t>(it - streams_.begin());
  return last_index_;
}

void stream_clock::record(stream_state& s) {
  const event_t event = events_.take();
  try {
    backend_.record_event(event, s.stream);
  } catch (const backend_error& e) {
    events_.give_back(event);
    // The stream is gone (destroyed by its owner while frees on it were
    // pending). Its queued work still finishes on a GPU, but nothing can wait
    // for it any more: treat its frees as complete.
    logger().warn("stream order: cannot record an event on stream {} ({}); treating its frees as complete",
                  s.stream, e.what());
    s.completed = s.tick++;
    s.dirty = false;
    return;
  }
  s.pending.push_back({event, s.tick});
  ++s.tick;
  s.dirty = false;
}

void stream_clock::refresh(std::uint32_t index) {
  stream_state& s = streams_[index];
  if (s.dirty && s.pending.size() < max_pending_events) record(s);
  std::size_t done = 0;
  while (done < s.pending.size() && backend_.query_event(s.pending[done].event)) ++done;
  if (done == 0) return;
  s.completed = s.pending[done - 1].tick;
  for (std::size_t i = 0; i < done; ++i) events_.give_back(s.pending[i].event);
  s.pending.erase(s.pending.begin(), s.pending.begin() + static_cast<std::ptrdiff_t>(done));
}

void stream_clock::refresh_all() {
  bool all_idle = true;
  for (std::uint32_t i = 0; i < streams_.size(); ++i) {
    refresh(i);
    all_idle = all_idle && idle(streams_[i]);
  }
  if (all_idle) ++quiescent_epoch_;
}

void stream_clock::synchronize(free_stamp stamp) {
  if (complete(stamp)) return;
  if (stamp.stream == free_stamp::multi) {
    synchronize_all();
    return;
  }
  stream_state& s = streams_[stamp.stream];
  if (s.tick <= stamp.tick) record(s);  // no event covers those frees yet
  std::size_t done = 0;
  while (done < s.pending.size() && s.completed < stamp.tick) {
    backend_.synchronize_event(s.pending[done].event);
    s.completed = s.pending[done].tick;
    events_.give_back(s.pending[done].event);
    ++done;
  }
  s.pending.erase(s.pending.begin(), s.pending.begin() + static_cast<std::ptrdiff_t>(done));
}

void stream_clock::end_stream(stream_t stream) noexcept {
  const auto it = find(stream);
  if (it == streams_.end()) return;
  stream_state& s = *it;
  for (const pending_event& p : s.pending) events_.give_back(p.event);
  s.pending.clear();
  s.completed = s.tick++;  // every stamp so far (tick <= s.tick) is complete
  s.dirty = false;
  s.ended = true;
  s.stream = nullptr;
  index_.erase(stream);
  try {
    ended_.push_back(static_cast<std::uint32_t>(it - streams_.begin()));
  } catch (...) {  // out of host memory: the index is not reused, nothing else changes
  }
  if (last_stream_ == stream) last_index_ = free_stamp::none;
}

void stream_clock::synchronize_all() {
  for (stream_state& s : streams_) {
    if (s.dirty) record(s);
    for (const pending_event& p : s.pending) {
      backend_.synchronize_event(p.event);
      events_.give_back(p.event);
    }
    if (!s.pending.empty()) s.completed = s.pending.back().tick;
    s.pending.clear();
  }
  ++quiescent_epoch_;
}

}  // namespace fragctl
