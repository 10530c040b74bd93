// Backend events, created on demand and reused: where every stream-order
// helper (stream_clock, marker_pool; the theory is in stream_clock.hpp) gets
// its events. Creating an event is a driver call; recording an idle one again
// is cheap. Not thread-safe (its owner is used under its caller's lock).
#pragma once

#include <cstddef>
#include <vector>

#include "fragctl/backend.hpp"
#include "fragctl/types.hpp"

namespace fragctl {

class event_pool {
 public:
  explicit event_pool(device_backend& backend) noexcept : backend_(backend) {}
  /// Destroys every idle event; events still taken are logged and left to
  /// the backend (their holder outlived the pool, a bug of the holder).
  ~event_pool();
  event_pool(const event_pool&) = delete;
  event_pool& operator=(const event_pool&) = delete;

  /// An idle event, or a new one (throws backend_error when the backend cannot
  /// create one). Room for its return is reserved now: give_back never allocates.
  [[nodiscard]] event_t take();
  /// Returns an event from take() for reuse. Never throws, never allocates.
  void give_back(event_t event) noexcept { idle_.push_back(event); }
  /// take(), then records the event on `stream` now. If recording throws, the
  /// event goes back to the pool and the error propagates.
  [[nodiscard]] event_t record(stream_t stream);

  [[nodiscard]] device_backend& backend() const noexcept { return backend_; }
  /// Events taken and not given back.
  [[nodiscard]] std::size_t in_use() const noexcept { return created_ - idle_.size(); }
  /// Events created so far (each one a backend create_event call).
  [[nodiscard]] std::size_t created() const noexcept { return created_; }

 private:
  device_backend& backend_;
  std::vector<event_t> idle_;
  std::size_t created_ = 0;
};

}  // namespace fragctl
