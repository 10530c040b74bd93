#include "trace/gpu_lag.hpp"

#include "fragctl/allocator_stack.hpp"
#include "fragctl/error.hpp"

namespace fragctl::replay_detail {

gpu_lag::gpu_lag(replay_lag lag, device_backend& backend) : lag_(lag) {
  if (lag_.enabled()) sim_ = dynamic_cast<sim_backend*>(&backend);
}

void gpu_lag::step(std::size_t index, std::int64_t time_us, stream_t stream) {
  if (sim_ == nullptr) return;
  while (!queue_.empty() && queue_.front().due_us <= time_us && queue_.front().due_index <= index) {
    sim_->complete_through(queue_.front().stream, queue_.front().item);
    queue_.pop_front();
  }
  // Saturated: a lag of INT64_MAX us (or events) is "never before the end",
  // not a due time that wraps to the past.
  const std::int64_t due_us = time_us > INT64_MAX - lag_.us ? INT64_MAX : time_us + lag_.us;
  const std::size_t due_index =
      lag_.events > SIZE_MAX - index ? SIZE_MAX : index + static_cast<std::size_t>(lag_.events);
  queue_.push_back({due_us, due_index, stream, sim_->submit(stream)});
}

std::unique_ptr<allocator_stack> make_lagged_stack(const config& cfg, replay_lag lag) {
  if (lag.us < 0) throw invalid_argument("replay: the GPU lag must not be negative");
  if (!lag.enabled()) return make_allocator(cfg);
  if (cfg.backend != backend_kind::sim && cfg.backend != backend_kind::automatic)
    throw invalid_argument("replay: a GPU lag is modelled on the sim backend only (--backend sim)");
  sim_options options = sim_options_from(cfg);
  options.manual_completion = true;
  config sim_cfg = cfg;
  sim_cfg.backend = backend_kind::sim;
  return std::make_unique<allocator_stack>(std::make_unique<sim_backend>(options), sim_cfg);
}

}  // namespace fragctl::replay_detail
