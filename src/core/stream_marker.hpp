// Stream markers: events recorded on a stream at once, shared by everything
// that must order work after that point on the device (wait_event), and
// returned to the event pool when the last holder lets go. The checkpoint
// store builds on them; the stream-order theory, including why a marker is
// recorded eagerly, is in stream_clock.hpp.
//
// A marker is only ever waited on (wait_event) or queried; waiting captures
// the event at once, so an event may be recorded again as soon as no holder
// is left.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/event_pool.hpp"
#include "fragctl/backend.hpp"

namespace fragctl {

/// The point on `stream` where `event` was recorded; `seq` orders markers of
/// one pool (a later marker on the same stream implies every earlier one).
struct stream_marker {
  event_t event = nullptr;
  stream_t stream = nullptr;
  std::uint64_t seq = 0;
};
using marker_ref = std::shared_ptr<const stream_marker>;

/// Records markers with events from its own event_pool. Not thread-safe. Must
/// outlive every marker_ref it handed out; destroys its events when destroyed.
class marker_pool {
 public:
  explicit marker_pool(device_backend& backend) noexcept : events_(backend) {}
  marker_pool(const marker_pool&) = delete;
  marker_pool& operator=(const marker_pool&) = delete;

  /// Records an event on `stream` now and returns the marker. Throws
  /// backend_error (the marker pool is unchanged then).
  [[nodiscard]] marker_ref record(stream_t stream);
  /// Makes `stream` wait for `m` unless `m` was recorded on `stream` itself
  /// (a stream is ordered with itself). Returns whether a wait was queued.
  bool order_after(stream_t stream, const stream_marker& m);

  [[nodiscard]] device_backend& backend() const noexcept { return events_.backend(); }
  /// Markers handed out and still held.
  [[nodiscard]] std::size_t held() const noexcept { return events_.in_use(); }

 private:
  event_pool events_;
  std::uint64_t next_seq_ = 1;
};

/// Keeps, per stream, only the latest marker (the rule of two stamps of one
/// stream in stream_clock.hpp): the set of points a range of memory must be
/// ordered after before another stream may use it. A null `m` adds nothing.
void add_fence(std::vector<marker_ref>& fences, marker_ref m);

}  // namespace fragctl
