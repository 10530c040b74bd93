#include "checkpoint/markers.hpp"

#include <algorithm>

#include "fragctl/log.hpp"

namespace fragctl::checkpoint {

struct marker_pool::deleter {
  marker_pool* pool;
  void operator()(const marker* m) const noexcept {
    pool->idle_.push_back(m->event);
    delete m;
  }
};

marker_pool::~marker_pool() {
  if (idle_.size() != created_) {
    logger().warn("checkpoint store: {} stream markers still held at teardown", created_ - idle_.size());
  }
  for (event_t e : idle_) {
    try {
      backend_.destroy_event(e);
    } catch (const std::exception& ex) {
      logger().warn("checkpoint store: destroying an event failed: {}", ex.what());
    }
  }
}

marker_ref marker_pool::record(stream_t stream) {
  event_t e = nullptr;
  if (idle_.empty()) {
    idle_.reserve(created_ + 1);  // the deleter's push_back must not allocate
    e = backend_.create_event();
    ++created_;
  } else {
    e = idle_.back();
    idle_.pop_back();
  }
  try {
    backend_.record_event(e, stream);
  } catch (...) {
    idle_.push_back(e);
    throw;
  }
  return marker_ref(new marker{e, stream, next_seq_++}, deleter{this});
}

bool marker_pool::order_after(stream_t stream, const marker& m) {
  if (m.stream == stream) return false;
  backend_.wait_event(stream, m.event);
  return true;
}

void add_fence(std::vector<marker_ref>& fences, marker_ref m) {
  if (!m) return;
  auto same = std::find_if(fences.begin(), fences.end(),
                           [&](const marker_ref& f) { return f->stream == m->stream; });
  if (same == fences.end()) {
    fences.push_back(std::move(m));
  } else if ((*same)->seq < m->seq) {
    *same = std::move(m);
  }
}

}  // namespace fragctl::checkpoint
