// The LD_PRELOAD layer (interpose/interposer.hpp).
#include "interpose/interposer.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <exception>
#include <new>
#include <utility>

#include "fragctl/backend.hpp"
#include "fragctl/error.hpp"
#include "fragctl/log.hpp"
#include "util/error_class.hpp"

namespace fragctl::interpose {

namespace {

// Maps the exception being handled to the runtime's code, with one log line.
// `building`: it came from building the device's allocator (a bad
// FRAGCTL_CONF or policy: initialization error, which repeats on every call,
// so it is logged as an error once per layer through `build_failure_logged`,
// then at debug level). Otherwise it came from the request: invalid_argument
// there is a size no device holds, out of memory as the real runtime says it.
int code_of_current_exception(std::string_view runtime, std::string_view what, std::size_t bytes, int device,
                              bool building, std::atomic<bool>& build_failure_logged) noexcept {
  const util::caught_error e = util::classify_current_exception();
  switch (e.kind) {
    case util::error_class::out_of_memory:
      // The statistics adaptor has logged the diagnosis already.
      logger().debug("{} {}({} bytes) on device {}: {}", runtime, what, bytes, device, e.message);
      return error_out_of_memory;
    case util::error_class::invalid_argument:
    case util::error_class::state: {
      if (!building) {
        logger().warn("{} {}({} bytes) on device {}: {}", runtime, what, bytes, device, e.message);
        return error_out_of_memory;
      }
      const bool first = !build_failure_logged.exchange(true);
      logger().log(first ? spdlog::level::err : spdlog::level::debug, "{} {}({} bytes) on device {}: {}", runtime,
                   what, bytes, device, e.message);
      return error_not_initialized;
    }
    case util::error_class::backend:
    case util::error_class::other_fragctl:
    case util::error_class::internal:
      logger().error("{} {}({} bytes) on device {}: {}", runtime, what, bytes, device, e.message);
      return error_unknown;
    case util::error_class::unknown: break;
  }
  return error_unknown;
}

}  // namespace

interposer::interposer(const runtime_api& api, symbol_resolver resolve, bool scan_loaded_libraries,
                       allocator_source allocators, stack_source stacks)
    : real_(api, resolve, scan_loaded_libraries), allocators_(std::move(allocators)), stacks_(std::move(stacks)) {}

void* interposer::canonical_stream(void* stream, stream_mode mode) noexcept {
  if (stream == nullptr) return mode == stream_mode::per_thread ? per_thread_stream : nullptr;
  if (stream == legacy_stream) return nullptr;
  return stream;
}

int interposer::current_device(int& device) noexcept {
  device = 0;
  const auto get_device = real_.get_as<get_device_fn>(real_function::get_device);
  return get_device != nullptr ? get_device(&device) : success;
}

int interposer::synchronize_device(int device) noexcept {
  const auto synchronize = real_.get_as<device_synchronize_fn>(real_function::device_synchronize);
  if (synchronize == nullptr) return error_not_initialized;
  const auto set_device = real_.get_as<set_device_fn>(real_function::set_device);
  int current = device;
  if (const int rc = current_device(current); rc != success) return rc;
  if (current != device && set_device != nullptr) {
    if (const int rc = set_device(device); rc != success) return rc;
  }
  const int rc = synchronize();
  if (current != device && set_device != nullptr) (void)set_device(current);
  return rc;
}

int interposer::allocate(void** ptr, std::size_t bytes, void* stream) noexcept {
  if (ptr == nullptr) return error_invalid_value;
  *ptr = nullptr;
  if (bytes == 0) return success;  // as cudaMalloc(&p, 0): nullptr
  int device = 0;
  if (const int rc = current_device(device); rc != success) return rc;
  device_allocator* allocator = nullptr;
  try {
    allocator = allocators_(device, true);
  } catch (...) {
    return code_of_current_exception(real_.api().name, "malloc", bytes, device, true, build_failure_logged_);
  }
  if (allocator == nullptr) return error_not_initialized;
  try {
    void* p = allocator->allocate(bytes, stream);
    try {
      const std::lock_guard lock(mutex_);
      if (stream != nullptr) streams_met_.insert(stream);  // first: the allocator met it already
      owned_.insert_or_assign(p, owned_block{bytes, device, stream});
    } catch (...) {
      allocator->deallocate(p, bytes, stream);
      throw;
    }
    *ptr = p;
    if (device >= 0 && device < 64) {
      const std::uint64_t bit = std::uint64_t{1} << device;
      // A load first: the write, once per device, not on every allocation.
      if ((devices_used_.load(std::memory_order_relaxed) & bit) == 0) {
        devices_used_.fetch_or(bit, std::memory_order_relaxed);
      }
    }
    return success;
  } catch (...) {
    return code_of_current_exception(real_.api().name, "malloc", bytes, device, false, build_failure_logged_);
  }
}

int interposer::malloc(void** ptr, std::size_t bytes) noexcept { return allocate(ptr, bytes, nullptr); }

bool interposer::capturing(void* stream, stream_mode mode) noexcept {
  const auto is_capturing = real_.get_as<stream_is_capturing_fn>(real_function::stream_is_capturing);
  if (is_capturing == nullptr) return false;
  // The per-thread default stream has its own handle (2); the legacy one is 0.
  void* const queried = stream == nullptr && mode == stream_mode::per_thread ? reinterpret_cast<void*>(2) : stream;
  int status = 0;
  return is_capturing(queried, &status) == success && status == capture_status_active;
}

int interposer::malloc_async(void** ptr, std::size_t bytes, void* stream, stream_mode mode) noexcept {
  if (capturing(stream, mode)) {
    const auto real = mode == stream_mode::per_thread
                          ? real_.get_as<malloc_async_fn>(real_function::malloc_async_ptsz)
                          : real_.get_as<malloc_async_fn>(real_function::malloc_async);
    if (real != nullptr) return real(ptr, bytes, stream);
    logger().error("{}: malloc_async on a capturing stream: no real {} runtime to add the graph's allocation node",
                   real_.api().name, real_.api().name);
    return error_stream_capture_unsupported;
  }
  return allocate(ptr, bytes, canonical_stream(stream, mode));
}

std::optional<owned_block> interposer::take(void* ptr, void* freeing_stream) {
  const std::lock_guard lock(mutex_);
  const auto it = owned_.find(ptr);
  if (it == owned_.end()) return std::nullopt;
  if (freeing_stream != nullptr) streams_met_.insert(freeing_stream);  // may throw: the record stays
  const owned_block block = it->second;
  owned_.erase(it);
  return block;
}

void interposer::release(void* ptr, const owned_block& block) noexcept {
  device_allocator* allocator = nullptr;
  try {
    allocator = allocators_(block.device, false);
  } catch (...) {
  }
  if (allocator == nullptr) {
    logger().error("{}: free({}): block of device {} but no allocator for that device; leaked", real_.api().name,
                   ptr, block.device);
    return;
  }
  allocator->deallocate(ptr, block.size, block.stream);
}

int interposer::real_free(void* ptr) noexcept {
  const auto fn = real_.get_as<free_fn>(real_function::free);
  if (fn != nullptr) return fn(ptr);
  if (ptr == nullptr) return success;
  logger().warn("{}: free({}): not a fragctl block and no real {} runtime found to free it", real_.api().name, ptr,
                real_.api().name);
  return error_invalid_value;
}

int interposer::real_free_async(void* ptr, void* stream, stream_mode mode) noexcept {
  auto fn = mode == stream_mode::per_thread ? real_.get_as<free_async_fn>(real_function::free_async_ptsz)
                                            : real_.get_as<free_async_fn>(real_function::free_async);
  if (fn != nullptr) return fn(ptr, stream);
  if (ptr == nullptr) return success;
  logger().warn("{}: free_async({}): not a fragctl block and no real {} runtime found to free it",
                real_.api().name, ptr, real_.api().name);
  return error_invalid_value;
}

template <class Body>
void interposer::for_each_used_allocator(Body&& body) {
  for (std::uint64_t devices = devices_used_.load(std::memory_order_relaxed); devices != 0; devices &= devices - 1) {
    const int device = std::countr_zero(devices);
    device_allocator* allocator = nullptr;
    try {
      allocator = allocators_(device, false);
    } catch (...) {
    }
    if (allocator != nullptr) body(device, *allocator);
  }
}

bool interposer::held_by_fragctl(const void* ptr) noexcept {
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  bool held = false;
  try {
    for_each_used_allocator([&](int /*device*/, const device_allocator& allocator) {
      if (held) return;
      allocator.backend().for_each_span([&](void* base, std::size_t bytes) {
        const auto b = reinterpret_cast<std::uintptr_t>(base);
        held = held || (p - b < bytes);  // unsigned: false below base
      });
    });
  } catch (...) {
    // No answer (out of host memory): the pointer goes on as before.
  }
  return held;
}

int interposer::refuse_held(const char* call, void* ptr) noexcept {
  logger().error("{}: {}({}): not a live block (a second free?) but memory fragctl holds; not passed to the "
                 "runtime, which would free fragctl's memory under it",
                 real_.api().name, call, ptr);
  return error_invalid_value;
}

int interposer::free(void* ptr) noexcept {
  std::optional<owned_block> seen;
  try {
    if (ptr != nullptr) seen = find(ptr);
  } catch (...) {
    return error_unknown;
  }
  if (!seen) return ptr != nullptr && held_by_fragctl(ptr) ? refuse_held("free", ptr) : real_free(ptr);
  // The device wait with no lock held: under ending_ it would hold every
  // free and free_async behind it while a stream_destroy waits as writer.
  const int rc = synchronize_device(seen->device);
  if (rc != success && rc != error_not_initialized) {
    // A sticky error from earlier work: the device may still be running it.
    // Free anyway (as the real cudaFree does) and report the error.
    logger().warn("{}: free({}): synchronizing device {} failed with code {}", real_.api().name, ptr, seen->device,
                  rc);
  }
  {
    const std::shared_lock ending(ending_);  // the record's stream stays known until the block is freed
    std::optional<owned_block> block;
    try {
      block = take(ptr);
    } catch (...) {
      return error_unknown;
    }
    if (!block) return refuse_held("free", ptr);  // another thread freed it meanwhile: a second free
    release(ptr, *block);
  }
  return rc == error_not_initialized ? success : rc;
}

int interposer::free_async(void* ptr, void* stream, stream_mode mode) noexcept {
  {
    const std::shared_lock ending(ending_);  // as in free(), from the record to the free
    std::optional<owned_block> block;
    try {
      if (ptr != nullptr) block = take(ptr, canonical_stream(stream, mode));
    } catch (...) {
      return error_unknown;
    }
    if (block) return release_async(ptr, *block, stream, mode);
  }
  return ptr != nullptr && held_by_fragctl(ptr) ? refuse_held("free_async", ptr) : real_free_async(ptr, stream, mode);
}

int interposer::release_async(void* ptr, owned_block block, void* stream, stream_mode mode) noexcept {
  if (capturing(stream, mode)) {
    // The graph's replays may still use the block, and fragctl cannot know
    // when the graph goes: refusing keeps the block live rather than reused.
    try {
      const std::lock_guard lock(mutex_);
      owned_.insert_or_assign(ptr, block);
    } catch (...) {
      return error_unknown;
    }
    logger().error("{}: free_async({}) on a capturing stream: a fragctl block cannot be freed inside a CUDA graph; "
                   "free it outside the capture (PyTorch defers such frees itself)",
                   real_.api().name, ptr);
    return error_stream_capture_unsupported;
  }
  block.stream = canonical_stream(stream, mode);
  release(ptr, block);
  return success;
}

int interposer::stream_destroy(void* stream) noexcept {
  const auto real = real_.get_as<stream_destroy_fn>(real_function::stream_destroy);
  bool met = false;
  if (stream != nullptr && stream != legacy_stream && stream != per_thread_stream) {
    const std::lock_guard lock(mutex_);
    met = streams_met_.contains(stream);  // forgotten below, once the allocators forgot it
  }
  // A stream the layer never handed to fragctl (a library's own: NCCL's,
  // cuBLAS's) goes straight to the runtime, without a wait: it may hold
  // work that never ends (a collective ncclCommAbort gives up on).
  if (met) {
    // Whether every allocator did `body`; a failure is logged.
    const auto for_each_allocator = [&](const char* what, auto&& body) {
      bool all = true;
      for_each_used_allocator([&](int device, device_allocator& allocator) {
        try {
          body(allocator);
        } catch (const std::exception& e) {
          all = false;
          logger().warn("{}: stream_destroy({}): device {}'s allocator could not {} the stream: {}",
                        real_.api().name, stream, device, what, e.what());
        } catch (...) {
          all = false;
          logger().warn("{}: stream_destroy({}): device {}'s allocator could not {} the stream", real_.api().name,
                        stream, device, what);
        }
      });
      return all;
    };
    // The wait, with no lock held: it may be long, and frees go on meanwhile.
    // A failed wait (a sticky error) is the runtime's to report too.
    (void)for_each_allocator("wait for", [&](device_allocator& a) { a.backend().synchronize_stream(stream); });
    const std::unique_lock ending(ending_);  // no free between its record and its free
    bool out_of_host_memory = false;
    const bool forgotten = for_each_allocator("forget", [&](device_allocator& a) {  // the wait is done
      try {
        a.stream_ending(stream);
      } catch (const std::bad_alloc&) {
        out_of_host_memory = true;
        throw;
      }
    });
    if (!forgotten && out_of_host_memory) {
      // Out of host memory: an allocator still names the stream (it forgot
      // nothing), so the stream stays alive, as a leak, rather than die
      // under it.
      logger().error("{}: stream_destroy({}): not destroyed: out of host memory", real_.api().name, stream);
      return error_out_of_memory;
    }
    const std::lock_guard lock(mutex_);
    for (auto& [ptr, block] : owned_) {
      if (block.stream == stream) block.stream = nullptr;
    }
    streams_met_.erase(stream);
  }
  if (real == nullptr) return error_not_initialized;
  return real(stream);
}

int interposer::mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes) noexcept {
  if (free_bytes == nullptr || total_bytes == nullptr) return error_invalid_value;
  int device = 0;
  if (const int rc = current_device(device); rc != success) return rc;
  device_allocator* allocator = nullptr;
  try {
    allocator = allocators_(device, false);
  } catch (...) {
  }
  int rc = success;
  if (const auto fn = real_.get_as<mem_get_info_fn>(real_function::mem_get_info); fn != nullptr) {
    rc = fn(free_bytes, total_bytes);
  } else if (allocator != nullptr) {
    try {
      const memory_info info = allocator->backend().get_memory_info();
      *free_bytes = info.free;
      *total_bytes = info.total;
    } catch (...) {
      rc = error_unknown;
    }
  } else {
    rc = error_not_initialized;
  }
  if (rc != success || allocator == nullptr) return rc;
  try {
    *free_bytes = std::min(*total_bytes, *free_bytes + allocator->state().cached_free);
  } catch (...) {
  }
  return success;
}

int interposer::ipc_get_mem_handle(void* handle, void* ptr) noexcept {
  const auto real = real_.get_as<ipc_get_mem_handle_fn>(real_function::ipc_get_mem_handle);
  std::optional<shared_memory> shared;
  try {
    std::optional<owned_block> block = ptr != nullptr ? find(ptr) : std::nullopt;
    int device = 0;
    if (block) {
      device = block->device;
    } else if (ptr == nullptr || current_device(device) != success) {
      device = -1;
    }
    device_allocator* allocator = device >= 0 ? allocators_(device, false) : nullptr;
    if (allocator != nullptr) {
      try {
        shared = allocator->share(ptr, 1);
      } catch (const invalid_argument&) {  // not fragctl's memory
      }
    }
  } catch (const std::exception& e) {
    logger().warn("{}: ipc_get_mem_handle({}): {}", real_.api().name, ptr, e.what());
    return error_unknown;
  }
  if (shared && !shared->handles.empty()) {
    logger().error("{}: IpcGetMemHandle({}): this is fragctl arena memory (mapped with cuMemMap), which has no "
                   "runtime IPC handle; share it with fragctl_export_block/fragctl_import_block, or run with "
                   "FRAGCTL_POLICY=caching",
                   real_.api().name, ptr);
    return error_invalid_value;
  }
  if (shared && shared->offset != 0) {
    logger().error("{}: IpcGetMemHandle({}): this fragctl block lies {} bytes into a larger device allocation, "
                   "so the importer would open that allocation's start; share it with fragctl_export_block "
                   "(which gives the offset)",
                   real_.api().name, ptr, shared->offset);
    return error_invalid_value;
  }
  if (real == nullptr) return error_invalid_value;
  return real(handle, ptr);
}

int interposer::device_enable_peer_access(int peer, unsigned flags) noexcept {
  const auto real = real_.get_as<device_enable_peer_access_fn>(real_function::device_enable_peer_access);
  if (real == nullptr) return error_not_initialized;
  const int rc = real(peer, flags);
  if (rc != success && rc != error_peer_access_already_enabled) return rc;
  int device = 0;
  if (const int got = current_device(device); got != success) return got;
  const int granted = grant_peer_access(peer, device, "DeviceEnablePeerAccess");
  return granted == success ? rc : granted;
}

int interposer::grant_peer_access(int owner, int peer, std::string_view call) noexcept {
  try {
    device_allocator* allocator = allocators_(owner, true);
    if (allocator != nullptr) allocator->enable_peer_access(peer);
    return success;
  } catch (...) {
    const util::caught_error e = util::classify_current_exception();
    logger().error("{}: {}({}): granting device {} access to fragctl's memory of device {} failed: {}",
                   real_.api().name, call, owner, peer, owner, e.message);
    if (e.kind == util::error_class::out_of_memory) return error_out_of_memory;
    if (e.kind == util::error_class::invalid_argument) return error_invalid_device;
    return error_unknown;
  }
}

int interposer::mem_pool_set_access(void* pool, const mem_access_desc* descs, std::size_t count) noexcept {
  const auto real = real_.get_as<mem_pool_set_access_fn>(real_function::mem_pool_set_access);
  if (real == nullptr) return error_not_initialized;
  const int rc = real(pool, descs, count);
  if (rc != success || descs == nullptr) return rc;
  // Whose default pool: the layer's record of the pools it handed out
  // (PyTorch asks for the pool just before), else each device's asked of
  // the runtime. Only existing devices are asked: a failed runtime call
  // would leave its error for the program's next cudaGetLastError.
  int owner = default_pool_device(pool).value_or(-1);
  const auto default_pool = real_.get_as<device_get_default_mem_pool_fn>(real_function::device_get_default_mem_pool);
  const auto device_count = real_.get_as<get_device_count_fn>(real_function::get_device_count);
  int devices = 0;
  if (owner < 0 && default_pool != nullptr && device_count != nullptr && device_count(&devices) == success) {
    for (int d = 0; d < devices && owner < 0; ++d) {
      void* p = nullptr;
      if (default_pool(&p, d) == success && p == pool) owner = d;
    }
  }
  if (owner < 0) return rc;  // a pool of the program's own: not served by the layer
  for (std::size_t i = 0; i < count; ++i) {
    const mem_access_desc& d = descs[i];
    if (d.location_type != mem_location_type_device || d.location_id == owner || d.flags == 0) continue;
    if (const int granted = grant_peer_access(owner, d.location_id, "MemPoolSetAccess"); granted != success) {
      return granted;
    }
  }
  return rc;
}

std::optional<owned_block> interposer::find(const void* ptr) const {
  const std::lock_guard lock(mutex_);
  const auto it = owned_.find(ptr);
  if (it == owned_.end()) return std::nullopt;
  return it->second;
}

std::size_t interposer::owned_count() const {
  const std::lock_guard lock(mutex_);
  return owned_.size();
}

}  // namespace fragctl::interpose
