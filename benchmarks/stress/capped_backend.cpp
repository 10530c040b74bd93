#include "capped_backend.hpp"

#include <algorithm>

#include "fragctl/error.hpp"

namespace fragctl::bench {

capped_backend::capped_backend(std::unique_ptr<device_backend> inner, std::size_t cap)
    : inner_(std::move(inner)), cap_(cap) {
  if (!inner_) throw invalid_argument("capped_backend: no backend to wrap");
}

bool capped_backend::fits(std::size_t bytes) const noexcept {
  return cap_ == 0 || inner_->counters().held_bytes + bytes <= cap_;
}

void* capped_backend::do_allocate(std::size_t bytes) { return fits(bytes) ? inner_->allocate(bytes) : nullptr; }
void capped_backend::do_free(void* ptr, std::size_t bytes) { inner_->free(ptr, bytes); }
void* capped_backend::do_reserve_address(std::size_t bytes, std::size_t alignment) {
  return inner_->reserve_address(bytes, alignment);
}
void capped_backend::do_release_address(void* base, std::size_t bytes) { inner_->release_address(base, bytes); }
std::optional<physical_handle> capped_backend::do_create_physical(std::size_t bytes) {
  if (!fits(bytes)) return std::nullopt;
  return inner_->create_physical(bytes);
}
void capped_backend::do_release_physical(physical_handle handle, std::size_t bytes) {
  inner_->release_physical(handle, bytes);
}
bool capped_backend::do_map(void* va, std::size_t bytes, physical_handle handle) {
  return inner_->map(va, bytes, handle);
}
bool capped_backend::do_set_access(void* va, std::size_t bytes) { return inner_->set_access(va, bytes); }
void capped_backend::do_unmap(void* va, std::size_t bytes) { inner_->unmap(va, bytes); }
event_t capped_backend::do_create_event() { return inner_->create_event(); }
void capped_backend::do_destroy_event(event_t event) { inner_->destroy_event(event); }
void capped_backend::do_record_event(event_t event, stream_t stream) { inner_->record_event(event, stream); }
bool capped_backend::do_query_event(event_t event) { return inner_->query_event(event); }
void capped_backend::do_synchronize_event(event_t event) { inner_->synchronize_event(event); }
void capped_backend::do_synchronize_stream(stream_t stream) { inner_->synchronize_stream(stream); }
void capped_backend::do_wait_event(stream_t stream, event_t event) { inner_->wait_event(stream, event); }
stream_t capped_backend::do_create_stream() { return inner_->create_stream(); }
void capped_backend::do_destroy_stream(stream_t stream) { inner_->destroy_stream(stream); }

memory_info capped_backend::do_get_memory_info() {
  memory_info info = inner_->get_memory_info();
  if (cap_ == 0) return info;
  const std::size_t held = inner_->counters().held_bytes;
  info.total = cap_;
  info.free = std::min(info.free, held >= cap_ ? 0 : cap_ - held);
  return info;
}

void* capped_backend::do_allocate_host(std::size_t bytes) { return inner_->allocate_host(bytes); }
void capped_backend::do_free_host(void* ptr, std::size_t bytes) { inner_->free_host(ptr, bytes); }
void capped_backend::do_memcpy_async(void* dst, const void* src, std::size_t bytes, stream_t stream) {
  inner_->memcpy_async(dst, src, bytes, stream);
}

}  // namespace fragctl::bench
