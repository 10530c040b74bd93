// The non-virtual half of device_backend: counting and byte accounting.
#include "fragctl/backend.hpp"

#include <algorithm>
#include <numeric>

#include "backend/span_registry.hpp"
#include "fmt/format.h"
#include "fragctl/error.hpp"

namespace fragctl {

std::string_view to_string(backend_call call) noexcept {
  switch (call) {
    case backend_call::allocate: return "allocate";
    case backend_call::free: return "free";
    case backend_call::reserve_address: return "reserve_address";
    case backend_call::release_address: return "release_address";
    case backend_call::create_physical: return "create_physical";
    case backend_call::release_physical: return "release_physical";
    case backend_call::map: return "map";
    case backend_call::set_access: return "set_access";
    case backend_call::unmap: return "unmap";
    case backend_call::create_event: return "create_event";
    case backend_call::destroy_event: return "destroy_event";
    case backend_call::record_event: return "record_event";
    case backend_call::query_event: return "query_event";
    case backend_call::synchronize_event: return "synchronize_event";
    case backend_call::synchronize_stream: return "synchronize_stream";
    case backend_call::create_stream: return "create_stream";
    case backend_call::destroy_stream: return "destroy_stream";
    case backend_call::memory_info: return "memory_info";
    case backend_call::allocate_host: return "allocate_host";
    case backend_call::free_host: return "free_host";
    case backend_call::memcpy_async: return "memcpy_async";
    case backend_call::wait_event: return "wait_event";
    case backend_call::count_: break;
  }
  return "unknown";
}

std::uint64_t backend_counters::memory_calls() const noexcept {
  return of(backend_call::allocate) + of(backend_call::free) + of(backend_call::reserve_address) +
         of(backend_call::release_address) + of(backend_call::create_physical) +
         of(backend_call::release_physical) + of(backend_call::map) + of(backend_call::set_access) +
         of(backend_call::unmap);
}

std::uint64_t backend_counters::total_calls() const noexcept {
  return std::accumulate(calls.begin(), calls.end(), std::uint64_t{0});
}

namespace {
void raise_to(std::atomic<std::size_t>& peak, std::size_t now) noexcept {
  std::size_t seen = peak.load(std::memory_order_relaxed);
  while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}
}  // namespace

void device_backend::add_held(std::size_t bytes) noexcept {
  const std::size_t now = held_bytes_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  held_total_.fetch_add(bytes, std::memory_order_relaxed);
  raise_to(peak_held_bytes_, now);
  raise_to(window_peak_held_bytes_, now);
}

void device_backend::sub_held(std::size_t bytes) noexcept {
  held_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
  released_total_.fetch_add(bytes, std::memory_order_relaxed);
}

void device_backend::reset_window_peak() noexcept {
  window_peak_held_bytes_.store(held_bytes_.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

void* device_backend::allocate(std::size_t bytes) {
  count(backend_call::allocate);
  void* p = do_allocate(bytes);
  if (p != nullptr) {
    add_held(bytes);
    spans_->added(p, bytes, true);
  } else {
    failed_allocations_.fetch_add(1, std::memory_order_relaxed);
  }
  return p;
}

void device_backend::free(void* ptr, std::size_t bytes) {
  count(backend_call::free);
  spans_->taking(ptr, bytes, [&] { do_free(ptr, bytes); });
  sub_held(bytes);
}

void* device_backend::reserve_address(std::size_t bytes, std::size_t alignment) {
  count(backend_call::reserve_address);
  return do_reserve_address(bytes, alignment == 0 ? granularity() : alignment);
}

void device_backend::release_address(void* base, std::size_t bytes) {
  count(backend_call::release_address);
  do_release_address(base, bytes);
}

std::optional<physical_handle> device_backend::create_physical(std::size_t bytes) {
  count(backend_call::create_physical);
  auto handle = do_create_physical(bytes);
  if (handle) {
    add_held(bytes);
  } else {
    failed_allocations_.fetch_add(1, std::memory_order_relaxed);
  }
  return handle;
}

void device_backend::release_physical(physical_handle handle, std::size_t bytes) {
  count(backend_call::release_physical);
  try {
    do_release_physical(handle, bytes);
  } catch (...) {
    forget_export(handle);  // the caller gives the handle up either way: its export goes with it
    throw;
  }
  forget_export(handle);
  sub_held(bytes);
}

bool device_backend::map(void* va, std::size_t bytes, physical_handle handle) {
  count(backend_call::map);
  const bool ok = do_map(va, bytes, handle);
  if (ok) {
    spans_->added(va, bytes, false);
  } else {
    failed_allocations_.fetch_add(1, std::memory_order_relaxed);
  }
  return ok;
}

bool device_backend::set_access(void* va, std::size_t bytes) {
  count(backend_call::set_access);
  const bool ok = do_set_access(va, bytes);
  if (ok) {
    spans_->granted(va, bytes);
  } else {
    failed_allocations_.fetch_add(1, std::memory_order_relaxed);
  }
  return ok;
}

void device_backend::unmap(void* va, std::size_t bytes) {
  count(backend_call::unmap);
  spans_->taking(va, bytes, [&] { do_unmap(va, bytes); });
}

device_backend::device_backend() : spans_(std::make_shared<span_registry>()) {}

void device_backend::watch_spans(span_observer observer, void* context) { spans_->watch(observer, context); }

void device_backend::for_each_span(const std::function<void(void*, std::size_t)>& f) const { spans_->for_each(f); }

event_t device_backend::create_event() {
  count(backend_call::create_event);
  return do_create_event();
}

void device_backend::destroy_event(event_t event) {
  count(backend_call::destroy_event);
  do_destroy_event(event);
}

void device_backend::record_event(event_t event, stream_t stream) {
  count(backend_call::record_event);
  do_record_event(event, stream);
}

bool device_backend::query_event(event_t event) {
  count(backend_call::query_event);
  return do_query_event(event);
}

void device_backend::synchronize_event(event_t event) {
  count(backend_call::synchronize_event);
  do_synchronize_event(event);
}

void device_backend::synchronize_stream(stream_t stream) {
  count(backend_call::synchronize_stream);
  do_synchronize_stream(stream);
}

void device_backend::wait_event(stream_t stream, event_t event) {
  count(backend_call::wait_event);
  do_wait_event(stream, event);
}

device_binding device_backend::bind_device() { return device_binding(this, do_bind_device()); }

device_binding::~device_binding() {
  if (backend_ != nullptr) backend_->do_unbind_device(previous_);
}

stream_t device_backend::create_stream() {
  count(backend_call::create_stream);
  return do_create_stream();
}

void device_backend::destroy_stream(stream_t stream) {
  count(backend_call::destroy_stream);
  do_destroy_stream(stream);
}

memory_info device_backend::get_memory_info() {
  count(backend_call::memory_info);
  return do_get_memory_info();
}

process_memory device_backend::get_process_memory() const noexcept { return do_get_process_memory(); }

void* device_backend::allocate_host(std::size_t bytes) {
  count(backend_call::allocate_host);
  void* p = do_allocate_host(bytes);
  if (p != nullptr) host_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  return p;
}

void device_backend::free_host(void* ptr, std::size_t bytes) {
  count(backend_call::free_host);
  do_free_host(ptr, bytes);
  host_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
}

void device_backend::memcpy_async(void* dst, const void* src, std::size_t bytes, stream_t stream) {
  count(backend_call::memcpy_async);
  do_memcpy_async(dst, src, bytes, stream);
}

void device_backend::add_access_peer(int peer) {
  if (std::find(peers_.begin(), peers_.end(), peer) != peers_.end()) return;
  check_access_peer(peer);
  peers_.reserve(peers_.size() + 1);  // so that a failure below leaves the list as it was
  do_add_access_peer(peer);
  peers_.push_back(peer);
}

void device_backend::check_access_peer(int peer) const {
  if (peer < 0 || peer == device()) {
    throw invalid_argument(fmt::format("{} backend: access peer {}: a peer is another device's ordinal "
                                       "(this is device {})",
                                       name(), peer, device()));
  }
  do_check_access_peer(peer);
}

void device_backend::remove_access_peer(int peer) noexcept {
  const auto it = std::find(peers_.begin(), peers_.end(), peer);
  if (it == peers_.end()) return;
  do_remove_access_peer(static_cast<std::size_t>(it - peers_.begin()));
  peers_.erase(it);
}

void device_backend::do_check_access_peer(int peer) const {
  throw backend_error(fmt::format("{} backend: device {} cannot grant peers access to its memory (peer {})",
                                  name(), device(), peer),
                      0, "not_supported");
}

// --- Sharing ----------------------------------------------------------------------

namespace {
/// Serials of exports, unique in the process (exported_handle::serial).
std::atomic<std::uint64_t> next_export_serial{1};
}  // namespace

exported_handle device_backend::export_physical(physical_handle handle) {
  const std::lock_guard lock(exports_mutex_);
  if (const auto it = exports_.find(handle.value); it != exports_.end()) return it->second;
  exported_handle e;
  e.fd = do_export_physical(handle);
  e.serial = next_export_serial.fetch_add(1, std::memory_order_relaxed);
  try {
    exports_.emplace(handle.value, e);
  } catch (...) {
    do_close_export(e.fd);
    throw;
  }
  any_exports_.store(true, std::memory_order_release);
  return e;
}

void device_backend::forget_export(physical_handle handle) noexcept {
  if (!any_exports_.load(std::memory_order_acquire)) return;
  const std::lock_guard lock(exports_mutex_);
  const auto it = exports_.find(handle.value);
  if (it == exports_.end()) return;
  do_close_export(it->second.fd);
  exports_.erase(it);
}

bool device_backend::exported(physical_handle handle) const noexcept {
  if (!any_exports_.load(std::memory_order_acquire)) return false;
  const std::lock_guard lock(exports_mutex_);
  return exports_.contains(handle.value);
}

std::size_t device_backend::exported_handles() const {
  const std::lock_guard lock(exports_mutex_);
  return exports_.size();
}

physical_handle device_backend::import_physical(int fd, std::size_t bytes) { return do_import_physical(fd, bytes); }

void device_backend::release_imported(physical_handle handle, std::size_t bytes) { do_release_physical(handle, bytes); }

ipc_memory_handle device_backend::export_allocation(void* base) { return do_export_allocation(base); }

void* device_backend::open_allocation(const ipc_memory_handle& handle) { return do_open_allocation(handle); }

void device_backend::close_allocation(void* base) { do_close_allocation(base); }

void device_backend::refuse_sharing(const char* call) const {
  throw backend_error(fmt::format("{} backend: {}: device {} cannot share memory with other processes", name(),
                                  call, device()),
                      0, "not_supported");
}

int device_backend::do_export_physical(physical_handle /*handle*/) { refuse_sharing("export_physical"); }
physical_handle device_backend::do_import_physical(int /*fd*/, std::size_t /*bytes*/) {
  refuse_sharing("import_physical");
}
ipc_memory_handle device_backend::do_export_allocation(void* /*base*/) { refuse_sharing("export_allocation"); }
void* device_backend::do_open_allocation(const ipc_memory_handle& /*handle*/) { refuse_sharing("open_allocation"); }
void device_backend::do_close_allocation(void* /*base*/) { refuse_sharing("close_allocation"); }

backend_counters device_backend::counters() const noexcept {
  backend_counters c;
  for (std::size_t i = 0; i < c.calls.size(); ++i) c.calls[i] = calls_[i].load(std::memory_order_relaxed);
  c.held_bytes = held_bytes_.load(std::memory_order_relaxed);
  c.peak_held_bytes = peak_held_bytes_.load(std::memory_order_relaxed);
  c.window_peak_held_bytes = window_peak_held_bytes_.load(std::memory_order_relaxed);
  c.held_total = held_total_.load(std::memory_order_relaxed);
  c.released_total = released_total_.load(std::memory_order_relaxed);
  c.host_bytes = host_bytes_.load(std::memory_order_relaxed);
  c.failed_allocations = failed_allocations_.load(std::memory_order_relaxed);
  return c;
}

}  // namespace fragctl
