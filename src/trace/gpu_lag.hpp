// The replay's model of a GPU that runs behind the CPU (replay_lag,
// docs/replay.md "GPU lag").
//
// Work is one unit per trace event, queued on the event's stream just before
// the event is replayed and due at its trace time + lag.us and its index +
// lag.events. Before each event, every unit due by then completes, in
// submission order; as trace times are monotonic, so are due points, and the
// queue is FIFO. Synchronization by the allocator completes work early
// (sim_backend's synchronize_*); completing it again later changes nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>

#include "fragctl/allocator_stack.hpp"
#include "fragctl/config.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/replay.hpp"
#include "fragctl/sim_backend.hpp"
#include "fragctl/trace.hpp"

namespace fragctl::replay_detail {

class gpu_lag {
 public:
  /// The model of `lag` over `backend`, which must be the sim backend that
  /// make_lagged_stack built when lag.enabled(); does nothing otherwise.
  gpu_lag(replay_lag lag, device_backend& backend);

  /// Called before event `index` at `time_us` on `stream` is replayed:
  /// completes the work due by then, then queues the event's own unit (the
  /// kernels the program launched up to this call, which a free's event must
  /// wait for).
  void step(std::size_t index, std::int64_t time_us, stream_t stream);

 private:
  struct unit {
    std::int64_t due_us;
    std::size_t due_index;
    stream_t stream;
    std::uint64_t item;
  };

  replay_lag lag_;
  sim_backend* sim_ = nullptr;  // null: the model is off
  std::deque<unit> queue_;
};

/// The allocator stack a replay runs on: make_allocator(cfg), or with
/// lag.enabled() the same stack on a sim backend with manual completion.
/// Throws invalid_argument when a lag is asked of a cuda or hip backend.
[[nodiscard]] std::unique_ptr<allocator_stack> make_lagged_stack(const config& cfg, replay_lag lag);

}  // namespace fragctl::replay_detail
