#include "core/event_pool.hpp"

#include <exception>

#include "fragctl/log.hpp"

namespace fragctl {

event_pool::~event_pool() {
  if (in_use() != 0) logger().warn("stream order: {} events still in use at teardown", in_use());
  for (event_t e : idle_) {
    try {
      backend_.destroy_event(e);
    } catch (const std::exception& ex) {
      logger().warn("stream order: destroying an event failed: {}", ex.what());
    }
  }
}

event_t event_pool::take() {
  if (!idle_.empty()) {
    const event_t e = idle_.back();
    idle_.pop_back();
    return e;
  }
  idle_.reserve(created_ + 1);
  const event_t e = backend_.create_event();
  ++created_;
  return e;
}

event_t event_pool::record(stream_t stream) {
  const event_t e = take();
  try {
    backend_.record_event(e, stream);
  } catch (...) {
    give_back(e);
    throw;
  }
  return e;
}

}  // namespace fragctl
