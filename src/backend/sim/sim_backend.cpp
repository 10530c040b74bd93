// sim_backend: construction, capacity, raw and host memory, copies, fault
// injection and introspection. Virtual memory is in sim_virtual_memory.cpp,
// streams and events in sim_streams.cpp.
#include "fragctl/sim_backend.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <iterator>
#include <vector>

#include "backend/sim/host_pages.hpp"
#include "backend/sim/sim_state.hpp"
#include "fmt/format.h"
#include "fragctl/error.hpp"
#include "fragctl/log.hpp"

namespace fragctl {

using sim_detail::address_of;
using sim_detail::fail;
using sim_detail::pointer_to;
using sim_detail::sim_error;

namespace sim_detail {

void fail(sim_error code, const std::string& message) {
  const char* name = "invalid_value";
  switch (code) {
    case sim_error::invalid_value: name = "invalid_value"; break;
    case sim_error::out_of_memory: name = "out_of_memory"; break;
    case sim_error::invalid_handle: name = "invalid_handle"; break;
    case sim_error::not_supported: name = "not_supported"; break;
    case sim_error::injected: name = "injected_fault"; break;
  }
  throw backend_error(fmt::format("sim: {}", message), static_cast<int>(code), name);
}

}  // namespace sim_detail

namespace {

bool is_power_of_two(std::size_t x) noexcept { return x != 0 && (x & (x - 1)) == 0; }

const sim_options& checked(const sim_options& o) {
  if (!is_power_of_two(o.granularity) || o.granularity < min_alignment) {
    throw invalid_argument(fmt::format("sim_options.granularity must be a power of two >= {}, got {}",
                                       min_alignment, o.granularity));
  }
  if (o.context_bytes > o.capacity || o.other_process_bytes > o.capacity - o.context_bytes) {
    throw invalid_argument(
        fmt::format("sim_options: context ({}) and other processes' bytes ({}) exceed the "
                    "capacity ({})",
                    o.context_bytes, o.other_process_bytes, o.capacity));
  }
  if (o.backed && o.granularity < sim_detail::page_size()) {
    throw invalid_argument(
        fmt::format("sim_options.granularity must be at least the host page size ({}) "
                    "in backed mode, got {}",
                    sim_detail::page_size(), o.granularity));
  }
  return o;
}

}  // namespace

// --- state helpers ----------------------------------------------------------

sim_backend::state::state(const sim_options& opts) : options(checked(opts)), page(sim_detail::page_size()) {
  static std::atomic<std::uintptr_t> instances{0};
  const std::uintptr_t window = instances.fetch_add(1, std::memory_order_relaxed) % sim_detail::fake_windows;
  const std::lock_guard lock(mu);
  next_fake = sim_detail::fake_device_base + window * sim_detail::fake_window;
  fake_limit = next_fake + sim_detail::fake_window;
}

sim_backend::state::~state() {
  // Releases whatever the user still holds; errors cannot be reported here.
  for (const auto& [a, block] : host) sim_detail::release_pages(pointer_to(a), block.span);
  if (!options.backed) return;
  for (const auto& [a, block] : raw) sim_detail::release_pages(pointer_to(a), block.span);
  for (const auto& [a, bytes] : reservations) sim_detail::release_pages(pointer_to(a), bytes);
  sim_detail::close_memory_file(memory_file);
}

void sim_backend::state::require_virtual_memory(const char* call) const {
  if (!options.virtual_memory) {
    fail(sim_error::not_supported, fmt::format("{}: virtual memory is not supported (sim_options)", call));
  }
}

void sim_backend::state::require_granular(const char* call, std::uintptr_t va, std::size_t bytes) const {
  const std::size_t g = options.granularity;
  if (bytes == 0 || bytes % g != 0 || va % g != 0 || bytes > UINTPTR_MAX - va) {
    fail(sim_error::invalid_value,
         fmt::format("{}: address {:#x} and size {} must be non-zero multiples of the granularity {}", call,
                     va, bytes, g));
  }
}

bool sim_backend::state::take_fault(sim_fault_target target) {
  return faults[static_cast<std::size_t>(target)].next_call_fails();
}

bool sim_backend::state::fits(std::size_t bytes) const {
  return bytes <= options.capacity - std::min(device_used(), options.capacity);
}

std::uintptr_t sim_backend::state::fake_range(std::size_t span, std::size_t alignment) {
  const std::uintptr_t limit = fake_limit;
  if (alignment > limit || next_fake > limit - alignment) return 0;
  const std::uintptr_t a = (next_fake + alignment - 1) & ~(std::uintptr_t{alignment} - 1);
  if (span > limit - a) return 0;
  next_fake = a + span;
  return a;
}

bool sim_backend::state::in_raw_block(std::uintptr_t a, std::size_t bytes) const {
  auto it = raw.upper_bound(a);
  if (it == raw.begin()) return false;
  --it;
  const std::uintptr_t end = it->first + it->second.bytes;
  return a < end && bytes <= end - a;
}

bool sim_backend::state::device_range(const char* call, std::uintptr_t a, std::size_t bytes) const {
  bool device;
  if (options.backed) {
    auto in = [a](const auto& map, auto span_of) {
      auto it = map.upper_bound(a);
      if (it == map.begin()) return false;
      --it;
      return a < it->first + span_of(it->second);
    };
    device = in(raw, [](const sim_detail::raw_block& b) { return b.span; }) ||
             in(reservations, [](std::size_t b) { return b; });
  } else {
    device = a >= sim_detail::fake_device_base && a < sim_detail::fake_device_limit;
  }
  if (!device) return false;
  if (bytes > UINTPTR_MAX - a || !(in_raw_block(a, bytes) || accessible.covers(a, a + bytes))) {
    fail(sim_error::invalid_value,
         fmt::format("{}: device range [{:#x}, +{}) is not allocated, or not mapped with access granted",
                     call, a, bytes));
  }
  return true;
}

// --- identity ---------------------------------------------------------------

sim_backend::sim_backend(sim_options options) : state_(std::make_unique<state>(options)) {}

sim_backend::~sim_backend() {
  const live_objects l = live();
  const std::size_t leaked =
      l.allocations + l.physical + l.reservations + l.mappings + l.events + l.streams + l.host;
  if (leaked != 0) {
    logger().warn(
        "sim backend destroyed with {} live objects (allocations {}, physical {}, reservations {}, "
        "mappings {}, events {}, streams {}, host {}); releasing them",
        leaked, l.allocations, l.physical, l.reservations, l.mappings, l.events, l.streams, l.host);
  }
}

int sim_backend::device() const noexcept { return state_->options.device; }

namespace {

/// This thread's live sim bindings, oldest first.
thread_local std::vector<const sim_backend*> bound_backends;

}  // namespace

// The thread's bindings are a stack: a release pops this backend's, the
// latest; any other release is out of order.
std::uintptr_t sim_backend::do_bind_device() {
  state_->bindings.fetch_add(1, std::memory_order_relaxed);
  bound_backends.push_back(this);
  return 0;
}

void sim_backend::do_unbind_device(std::uintptr_t /*previous*/) noexcept {
  if (!bound_backends.empty() && bound_backends.back() == this) {
    bound_backends.pop_back();
    return;
  }
  state_->out_of_order.fetch_add(1, std::memory_order_relaxed);
  const auto mine = std::find(bound_backends.rbegin(), bound_backends.rend(), this);
  if (mine != bound_backends.rend()) bound_backends.erase(std::next(mine).base());
}

int sim_backend::bound_device() noexcept { return bound_backends.empty() ? -1 : bound_backends.back()->device(); }

sim_backend::binding_counts sim_backend::bindings() const noexcept {
  return {state_->bindings.load(std::memory_order_relaxed), state_->out_of_order.load(std::memory_order_relaxed)};
}
std::uint64_t sim_backend::destroyed_stream_calls() const noexcept {
  return state_->destroyed_stream_calls.load(std::memory_order_relaxed);
}
bool sim_backend::supports_virtual_memory() const noexcept { return state_->options.virtual_memory; }
std::size_t sim_backend::granularity() const noexcept { return state_->options.granularity; }
const sim_options& sim_backend::options() const noexcept { return state_->options; }

std::size_t sim_backend::used_bytes() const noexcept {
  const std::lock_guard lock(state_->mu);
  return state_->used;
}

std::size_t sim_backend::mapped_bytes() const {
  const std::lock_guard lock(state_->mu);
  std::size_t bytes = 0;
  for (const auto& [a, m] : state_->mappings) bytes += m.bytes;
  return bytes;
}

sim_backend::live_objects sim_backend::live() const {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  live_objects l;
  l.allocations = s.raw.size();
  l.physical = s.handles.size();
  l.reservations = s.reservations.size();
  l.mappings = s.mappings.size();
  l.events = s.events.size();
  l.streams = static_cast<std::size_t>(std::count_if(s.streams.begin(), s.streams.end(), [](const auto& kv) {
    return kv.second.created && !kv.second.destroyed;
  }));
  l.host = s.host.size();
  return l;
}

bool sim_backend::accessible_from(int device, const void* va, std::size_t bytes) const {
  if (device == state_->options.device) return accessible(va, bytes);
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  const std::uintptr_t a = address_of(va);
  const auto it = s.peer_accessible.find(device);
  return bytes <= UINTPTR_MAX - a && it != s.peer_accessible.end() && it->second.covers(a, a + bytes);
}

bool sim_backend::accessible(const void* va, std::size_t bytes) const {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  const std::uintptr_t a = address_of(va);
  if (bytes > UINTPTR_MAX - a) return false;
  return s.in_raw_block(a, bytes) || s.accessible.covers(a, a + bytes);
}

// --- fault injection --------------------------------------------------------

void sim_backend::fail_nth(sim_fault_target target, std::uint64_t nth) {
  if (nth == 0) throw invalid_argument("sim_backend::fail_nth: nth is 1-based, got 0");
  const std::lock_guard lock(state_->mu);
  auto& rule = state_->faults[static_cast<std::size_t>(target)];
  rule.fail_at.insert(rule.calls + nth);
}

void sim_backend::fail_every(sim_fault_target target, std::uint64_t k) {
  const std::lock_guard lock(state_->mu);
  auto& rule = state_->faults[static_cast<std::size_t>(target)];
  rule.every = k;
  rule.every_from = rule.calls;
}

void sim_backend::fail_from(sim_fault_target target, std::uint64_t nth) {
  if (nth == 0) throw invalid_argument("sim_backend::fail_from: nth is 1-based, got 0");
  const std::lock_guard lock(state_->mu);
  auto& rule = state_->faults[static_cast<std::size_t>(target)];
  rule.fail_from = rule.calls + nth;
}

void sim_backend::reset_faults() {
  const std::lock_guard lock(state_->mu);
  for (auto& rule : state_->faults) rule = {};
}

// --- raw device memory ------------------------------------------------------

void* sim_backend::do_allocate(std::size_t bytes) {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  if (bytes == 0) fail(sim_error::invalid_value, "allocate: zero bytes");
  if (s.take_fault(sim_fault_target::allocate) || !s.fits(bytes)) return nullptr;
  const std::size_t g = s.options.granularity;
  const std::size_t alignment = bytes >= g ? g : min_alignment;
  std::uintptr_t a = 0;
  std::size_t span = 0;
  if (s.options.backed) {
    span = round_up(bytes, s.page);
    void* p = sim_detail::map_anonymous(span, std::max(alignment, s.page), /*accessible=*/true);
    if (p == nullptr) return nullptr;
    a = address_of(p);
  } else {
    span = round_up(bytes, min_alignment);
    a = s.fake_range(span, alignment);
    if (a == 0) return nullptr;
  }
  s.raw.emplace(a, sim_detail::raw_block{bytes, span});
  s.used += bytes;
  return pointer_to(a);
}

void sim_backend::do_free(void* ptr, std::size_t bytes) {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  auto it = s.raw.find(address_of(ptr));
  if (it == s.raw.end())
    fail(sim_error::invalid_value, fmt::format("free: {} is not a live allocation", ptr));
  if (it->second.bytes != bytes) {
    fail(sim_error::invalid_value,
         fmt::format("free: size {} does not match the allocation's {} at {}", bytes, it->second.bytes, ptr));
  }
  if (it->second.opens != 0) {
    fail(sim_error::invalid_value,
         fmt::format("free: {} is still open in {} importer(s) (open_allocation)", ptr, it->second.opens));
  }
  if (s.options.backed) sim_detail::unmap_pages(ptr, it->second.span);
  s.used -= bytes;
  s.raw.erase(it);
}

// IPC of raw allocations: the handle carries the address; opening it in the
// same process gives that address and counts an open, which free refuses.
ipc_memory_handle sim_backend::do_export_allocation(void* base) {
  const std::lock_guard lock(state_->mu);
  if (!state_->raw.contains(address_of(base))) {
    fail(sim_error::invalid_value, fmt::format("export_allocation: {} is not the start of a live allocation", base));
  }
  ipc_memory_handle h{};
  const std::uintptr_t a = address_of(base);
  std::memcpy(h.data(), &a, sizeof a);
  return h;
}

void* sim_backend::do_open_allocation(const ipc_memory_handle& handle) {
  std::uintptr_t a = 0;
  std::memcpy(&a, handle.data(), sizeof a);
  const std::lock_guard lock(state_->mu);
  const auto it = state_->raw.find(a);
  if (it == state_->raw.end()) {
    fail(sim_error::invalid_value, fmt::format("open_allocation: {} is not a live allocation", pointer_to(a)));
  }
  ++it->second.opens;
  return pointer_to(a);
}

void sim_backend::do_close_allocation(void* base) {
  const std::lock_guard lock(state_->mu);
  const auto it = state_->raw.find(address_of(base));
  if (it == state_->raw.end() || it->second.opens == 0) {
    fail(sim_error::invalid_value, fmt::format("close_allocation: {} is not open", base));
  }
  --it->second.opens;
}

memory_info sim_backend::do_get_memory_info() {
  const std::lock_guard lock(state_->mu);
  const std::size_t capacity = state_->options.capacity;
  return {capacity - std::min(state_->device_used(), capacity), capacity};
}

process_memory sim_backend::do_get_process_memory() const noexcept {
  const std::lock_guard lock(state_->mu);
  const sim_options& o = state_->options;
  return {true, state_->used + state_->library + o.context_bytes, o.other_process_bytes};
}

void sim_backend::set_library_bytes(std::size_t bytes) {
  const std::lock_guard lock(state_->mu);
  state_->library = bytes;
}

// --- pinned host memory and copies ------------------------------------------

void* sim_backend::do_allocate_host(std::size_t bytes) {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  if (bytes == 0) fail(sim_error::invalid_value, "allocate_host: zero bytes");
  if (s.take_fault(sim_fault_target::allocate_host) || bytes > SIZE_MAX - s.page) return nullptr;
  const std::size_t span = round_up(bytes, s.page);
  void* p = sim_detail::map_anonymous(span, s.page, /*accessible=*/true);
  if (p == nullptr) return nullptr;
  s.host.emplace(address_of(p), sim_detail::host_block{bytes, span});
  return p;
}

void sim_backend::do_free_host(void* ptr, std::size_t bytes) {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  auto it = s.host.find(address_of(ptr));
  if (it == s.host.end()) {
    fail(sim_error::invalid_value, fmt::format("free_host: {} is not a live host allocation", ptr));
  }
  if (it->second.bytes != bytes) {
    fail(sim_error::invalid_value, fmt::format("free_host: size {} does not match the allocation's {} at {}",
                                               bytes, it->second.bytes, ptr));
  }
  sim_detail::unmap_pages(ptr, it->second.span);
  s.host.erase(it);
}

void sim_backend::do_memcpy_async(void* dst, const void* src, std::size_t bytes, stream_t stream) {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  if (bytes != 0 && (dst == nullptr || src == nullptr))
    fail(sim_error::invalid_value, "memcpy_async: null pointer");
  const bool device_dst = bytes != 0 && s.device_range("memcpy_async", address_of(dst), bytes);
  const bool device_src = bytes != 0 && s.device_range("memcpy_async", address_of(src), bytes);
  s.submit(s.stream_for("memcpy_async", stream));
  // Accounting-mode device addresses are fake: the copy only counts as work.
  const bool fake = !s.options.backed && (device_dst || device_src);
  if (bytes != 0 && !fake) std::memmove(dst, src, bytes);
}

}  // namespace fragctl
