#include "core/stream_marker.hpp"

#include <algorithm>

namespace fragctl {

marker_ref marker_pool::record(stream_t stream) {
  const event_t e = events_.record(stream);
  const stream_marker* m = nullptr;
  try {
    m = new stream_marker{e, stream, next_seq_};
  } catch (...) {
    events_.give_back(e);
    throw;
  }
  ++next_seq_;
  // The shared_ptr runs the deleter itself if it cannot allocate its count.
  return marker_ref(m, [pool = &events_](const stream_marker* gone) noexcept {
    pool->give_back(gone->event);
    delete gone;
  });
}

bool marker_pool::order_after(stream_t stream, const stream_marker& m) {
  if (m.stream == stream) return false;
  events_.backend().wait_event(stream, m.event);
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

}  // namespace fragctl
