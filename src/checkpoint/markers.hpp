// Stream markers: backend events recorded on a stream, shared by everything
// that must order work after that point, and returned to a pool when the last
// holder lets go. A marker is only ever waited on (wait_event) or queried;
// waiting captures the event at once, so an event may be recorded again as
// soon as no holder is left.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "fragctl/backend.hpp"

namespace fragctl::checkpoint {

/// The point on `stream` where `event` was recorded; `seq` orders markers of
/// one pool (a later marker on the same stream implies every earlier one).
struct marker {
  event_t event = nullptr;
  stream_t stream = nullptr;
  std::uint64_t seq = 0;
};
using marker_ref = std::shared_ptr<const marker>;

/// Creates events on demand and recycles them. Not thread-safe. Must outlive
/// every marker_ref it handed out; destroys its events when destroyed.
class marker_pool {
 public:
  explicit marker_pool(device_backend& backend) : backend_(backend) {}
  ~marker_pool();
  marker_pool(const marker_pool&) = delete;
  marker_pool& operator=(const marker_pool&) = delete;

  /// Records an event on `stream` now and returns the marker.
  [[nodiscard]] marker_ref record(stream_t stream);
  /// Makes `stream` wait for `m` unless `m` was recorded on `stream` itself
  /// (a stream is ordered with itself). Returns whether a wait was queued.
  bool order_after(stream_t stream, const marker& m);

  [[nodiscard]] device_backend& backend() const noexcept { return backend_; }

 private:
  struct deleter;
  device_backend& backend_;
  std::vector<event_t> idle_;
  std::size_t created_ = 0;
  std::uint64_t next_seq_ = 1;
};

/// Keeps, per stream, only the latest marker: the set of points a range of
/// memory must be ordered after before another stream may use it.
void add_fence(std::vector<marker_ref>& fences, marker_ref m);

}  // namespace fragctl::checkpoint
