#include "backend/hip/hip_backend.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "fmt/format.h"
#include "fragctl/error.hpp"

namespace fragctl {

namespace {

/// Why virtual memory is off for this build and runtime, or "" when the
/// runtime side allows it (the device attribute is asked separately).
std::string virtual_memory_obstacle(const hip::runtime_api& api) {
#ifdef FRAGCTL_HIP_VIRTUAL_MEMORY
  if (api.version / 10000000 != HIP_VERSION_MAJOR) {
    return fmt::format("the HIP runtime is version {} but fragctl was built with HIP {}.{} headers, whose virtual "
                       "memory structures may differ",
                       api.version / 10000000, HIP_VERSION_MAJOR, HIP_VERSION_MINOR);
  }
  if (!api.has_virtual_memory()) return fmt::format("{} lacks the hipMem* virtual memory calls", api.library);
  return {};
#else
  (void)api;
  return fmt::format("fragctl was built with HIP {}.{} headers; it uses HIP virtual memory from HIP 6 on",
                     HIP_VERSION_MAJOR, HIP_VERSION_MINOR);
#endif
}

}  // namespace

/// Makes the backend's device current on this thread for one call and puts
/// the thread's previous device back afterwards.
class hip_backend::device_scope {
 public:
  explicit device_scope(const hip_backend& backend) : backend_(backend) {
    int current = -1;
    if (const hipError_t rc = backend.api_.get_device(&current); rc != hipSuccess) backend.fail(rc, "hipGetDevice");
    if (current == backend.ordinal_) return;
    if (const hipError_t rc = backend.api_.set_device(backend.ordinal_); rc != hipSuccess) {
      backend.fail(rc, "hipSetDevice");
    }
    previous_ = current;
    restore_ = true;
  }
  ~device_scope() {
    if (restore_) (void)backend_.api_.set_device(previous_);
  }
  device_scope(const device_scope&) = delete;
  device_scope& operator=(const device_scope&) = delete;

 private:
  const hip_backend& backend_;
  int previous_ = 0;
  bool restore_ = false;
};

hip_backend::hip_backend(int device) : api_(hip::runtime()), ordinal_(device) {
  int count = 0;
  if (const hipError_t rc = api_.get_device_count(&count); rc != hipSuccess) fail(rc, "hipGetDeviceCount");
  if (device < 0 || device >= count) {
    throw backend_error(fmt::format("hip backend: no HIP device {} ({} present)", device, count),
                        hipErrorInvalidDevice, hip::error_name(api_, hipErrorInvalidDevice));
  }
  granularity_ = 2 * MiB;
#ifdef FRAGCTL_HIP_VIRTUAL_MEMORY
  physical_properties_.type = hipMemAllocationTypePinned;
  physical_properties_.location.type = hipMemLocationTypeDevice;
  physical_properties_.location.id = device;
  hipMemAccessDesc own{};
  own.location = physical_properties_.location;
  own.flags = hipMemAccessFlagsProtReadWrite;
  access_.push_back(own);
  if (virtual_memory_obstacle(api_).empty()) {
    int supported = 0;
    const hipError_t rc =
        api_.device_get_attribute(&supported, hipDeviceAttributeVirtualMemoryManagementSupported, device);
    if (rc != hipSuccess) fail(rc, "hipDeviceGetAttribute(VirtualMemoryManagementSupported)");
    if (supported != 0) {
      std::size_t minimum = 0;
      const hipError_t grc = api_.mem_get_allocation_granularity(&minimum, &physical_properties_,
                                                                 hipMemAllocationGranularityMinimum);
      if (grc != hipSuccess) fail(grc, "hipMemGetAllocationGranularity");
      granularity_ = std::max(minimum, 2 * MiB);
      virtual_memory_ = true;
    }
  }
#endif
}

void hip_backend::fail(hipError_t result, const char* call) const { hip::throw_error(api_, result, call); }

void hip_backend::require_virtual_memory(const char* call) const {
  if (virtual_memory_) return;
  std::string why = virtual_memory_obstacle(api_);
  if (why.empty()) why = "the device reports no virtual memory management support";
  throw backend_error(
      fmt::format("hip backend: {}: virtual memory is not supported on HIP device {} ({})", call, ordinal_, why),
      hipErrorNotSupported, "not_supported");
}

// --- Raw device memory --------------------------------------------------------

void* hip_backend::do_allocate(std::size_t bytes) {
  device_scope scope(*this);
  void* p = nullptr;
  const hipError_t rc = api_.mem_alloc(&p, bytes);
  if (rc == hipErrorOutOfMemory) return nullptr;
  if (rc != hipSuccess) fail(rc, "hipMalloc");
  return p;
}

void hip_backend::do_free(void* ptr, std::size_t /*bytes*/) {
  device_scope scope(*this);
  if (const hipError_t rc = api_.mem_free(ptr); rc != hipSuccess) fail(rc, "hipFree");
}

// --- Virtual memory ---------------------------------------------------------------

#ifdef FRAGCTL_HIP_VIRTUAL_MEMORY

namespace {

hipMemGenericAllocationHandle_t to_hip(physical_handle handle) noexcept {
  return reinterpret_cast<hipMemGenericAllocationHandle_t>(static_cast<std::uintptr_t>(handle.value));
}

}  // namespace

void* hip_backend::do_reserve_address(std::size_t bytes, std::size_t alignment) {
  require_virtual_memory("reserve_address");
  device_scope scope(*this);
  void* p = nullptr;
  if (const hipError_t rc = api_.mem_address_reserve(&p, bytes, alignment, nullptr, 0); rc != hipSuccess) {
    fail(rc, "hipMemAddressReserve");
  }
  return p;
}

void hip_backend::do_release_address(void* base, std::size_t bytes) {
  require_virtual_memory("release_address");
  device_scope scope(*this);
  if (const hipError_t rc = api_.mem_address_free(base, bytes); rc != hipSuccess) fail(rc, "hipMemAddressFree");
}

std::optional<physical_handle> hip_backend::do_create_physical(std::size_t bytes) {
  require_virtual_memory("create_physical");
  device_scope scope(*this);
  hipMemGenericAllocationHandle_t handle = nullptr;
  const hipError_t rc = api_.mem_create(&handle, bytes, &physical_properties_, 0);
  if (rc == hipErrorOutOfMemory) return std::nullopt;
  if (rc != hipSuccess) fail(rc, "hipMemCreate");
  return physical_handle{static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(handle))};
}

void hip_backend::do_release_physical(physical_handle handle, std::size_t /*bytes*/) {
  require_virtual_memory("release_physical");
  device_scope scope(*this);
  if (const hipError_t rc = api_.mem_release(to_hip(handle)); rc != hipSuccess) fail(rc, "hipMemRelease");
}

bool hip_backend::do_map(void* va, std::size_t bytes, physical_handle handle) {
  require_virtual_memory("map");
  device_scope scope(*this);
  const hipError_t rc = api_.mem_map(va, bytes, 0, to_hip(handle), 0);
  if (rc == hipErrorOutOfMemory) return false;
  if (rc != hipSuccess) fail(rc, "hipMemMap");
  return true;
}

bool hip_backend::do_set_access(void* va, std::size_t bytes) {
  require_virtual_memory("set_access");
  device_scope scope(*this);
  const std::lock_guard<std::mutex> lock(access_mutex_);
  const hipError_t rc = api_.mem_set_access(va, bytes, access_.data(), access_.size());
  if (rc == hipErrorOutOfMemory) return false;
  if (rc != hipSuccess) fail(rc, "hipMemSetAccess");
  return true;
}

void hip_backend::do_remove_access_peer(std::size_t index) noexcept {
  const std::lock_guard<std::mutex> lock(access_mutex_);
  access_.erase(access_.begin() + static_cast<std::ptrdiff_t>(index + 1));  // [0] is this device
}

void hip_backend::do_check_access_peer(int peer) const {
  int count = 0;
  if (const hipError_t rc = api_.get_device_count(&count); rc != hipSuccess) fail(rc, "hipGetDeviceCount");
  if (peer >= count) {
    throw backend_error(fmt::format("hip backend: no HIP device {} ({} present) to grant access to device {}", peer,
                                    count, ordinal_),
                        hipErrorInvalidDevice, hip::error_name(api_, hipErrorInvalidDevice));
  }
  int can = 0;
  if (const hipError_t rc = api_.device_can_access_peer(&can, peer, ordinal_); rc != hipSuccess) {
    fail(rc, "hipDeviceCanAccessPeer");
  }
  if (can == 0) {
    throw backend_error(fmt::format("hip backend: device {} cannot access device {}'s memory "
                                    "(hipDeviceCanAccessPeer)",
                                    peer, ordinal_),
                        hipErrorPeerAccessUnsupported, hip::error_name(api_, hipErrorPeerAccessUnsupported));
  }
}

void hip_backend::do_add_access_peer(int peer) {
  hipMemAccessDesc desc{};
  desc.location.type = hipMemLocationTypeDevice;
  desc.location.id = peer;
  desc.flags = hipMemAccessFlagsProtReadWrite;
  const std::lock_guard<std::mutex> lock(access_mutex_);
  access_.push_back(desc);
}

void hip_backend::do_unmap(void* va, std::size_t bytes) {
  require_virtual_memory("unmap");
  device_scope scope(*this);
  if (const hipError_t rc = api_.mem_unmap(va, bytes); rc != hipSuccess) fail(rc, "hipMemUnmap");
}

#else  // HIP headers before 6: every virtual memory call is "not_supported".

void* hip_backend::do_reserve_address(std::size_t /*bytes*/, std::size_t /*alignment*/) {
  require_virtual_memory("reserve_address");
  return nullptr;
}
void hip_backend::do_release_address(void* /*base*/, std::size_t /*bytes*/) {
  require_virtual_memory("release_address");
}
std::optional<physical_handle> hip_backend::do_create_physical(std::size_t /*bytes*/) {
  require_virtual_memory("create_physical");
  return std::nullopt;
}
void hip_backend::do_release_physical(physical_handle /*handle*/, std::size_t /*bytes*/) {
  require_virtual_memory("release_physical");
}
bool hip_backend::do_map(void* /*va*/, std::size_t /*bytes*/, physical_handle /*handle*/) {
  require_virtual_memory("map");
  return false;
}
bool hip_backend::do_set_access(void* /*va*/, std::size_t /*bytes*/) {
  require_virtual_memory("set_access");
  return false;
}
void hip_backend::do_unmap(void* /*va*/, std::size_t /*bytes*/) { require_virtual_memory("unmap"); }

#endif

// --- Events and streams -------------------------------------------------------------

event_t hip_backend::do_create_event() {
  device_scope scope(*this);
  hipEvent_t event = nullptr;
  if (const hipError_t rc = api_.event_create_with_flags(&event, hipEventDisableTiming); rc != hipSuccess) {
    fail(rc, "hipEventCreateWithFlags");
  }
  return event;
}

void hip_backend::do_destroy_event(event_t event) {
  device_scope scope(*this);
  if (const hipError_t rc = api_.event_destroy(static_cast<hipEvent_t>(event)); rc != hipSuccess) {
    fail(rc, "hipEventDestroy");
  }
}

void hip_backend::do_record_event(event_t event, stream_t stream) {
  device_scope scope(*this);
  const hipError_t rc = api_.event_record(static_cast<hipEvent_t>(event), static_cast<hipStream_t>(stream));
  if (rc != hipSuccess) fail(rc, "hipEventRecord");
}

bool hip_backend::do_query_event(event_t event) {
  device_scope scope(*this);
  const hipError_t rc = api_.event_query(static_cast<hipEvent_t>(event));
  if (rc == hipSuccess) return true;
  if (rc == hipErrorNotReady) return false;
  fail(rc, "hipEventQuery");
}

void hip_backend::do_synchronize_event(event_t event) {
  device_scope scope(*this);
  if (const hipError_t rc = api_.event_synchronize(static_cast<hipEvent_t>(event)); rc != hipSuccess) {
    fail(rc, "hipEventSynchronize");
  }
}

void hip_backend::do_synchronize_stream(stream_t stream) {
  device_scope scope(*this);
  if (const hipError_t rc = api_.stream_synchronize(static_cast<hipStream_t>(stream)); rc != hipSuccess) {
    fail(rc, "hipStreamSynchronize");
  }
}

// hipSetDevice until the binding ends; the token is the thread's previous device.
std::uintptr_t hip_backend::do_bind_device() {
  int previous = 0;
  if (const hipError_t rc = api_.get_device(&previous); rc != hipSuccess) fail(rc, "hipGetDevice");
  if (previous != ordinal_) {
    if (const hipError_t rc = api_.set_device(ordinal_); rc != hipSuccess) fail(rc, "hipSetDevice");
  }
  return static_cast<std::uintptr_t>(previous);
}

void hip_backend::do_unbind_device(std::uintptr_t previous) noexcept {
  const int device = static_cast<int>(previous);
  if (device != ordinal_) (void)api_.set_device(device);
}

void hip_backend::do_wait_event(stream_t stream, event_t event) {
  device_scope scope(*this);
  const hipError_t rc =
      api_.stream_wait_event(static_cast<hipStream_t>(stream), static_cast<hipEvent_t>(event), 0);
  if (rc != hipSuccess) fail(rc, "hipStreamWaitEvent");
}

stream_t hip_backend::do_create_stream() {
  device_scope scope(*this);
  hipStream_t stream = nullptr;
  if (const hipError_t rc = api_.stream_create_with_flags(&stream, hipStreamNonBlocking); rc != hipSuccess) {
    fail(rc, "hipStreamCreateWithFlags");
  }
  return stream;
}

void hip_backend::do_destroy_stream(stream_t stream) {
  device_scope scope(*this);
  if (const hipError_t rc = api_.stream_destroy(static_cast<hipStream_t>(stream)); rc != hipSuccess) {
    fail(rc, "hipStreamDestroy");
  }
}

// --- Memory information, pinned host memory, copies -----------------------------------

memory_info hip_backend::do_get_memory_info() {
  device_scope scope(*this);
  memory_info info;
  if (const hipError_t rc = api_.mem_get_info(&info.free, &info.total); rc != hipSuccess) fail(rc, "hipMemGetInfo");
  return info;
}

void* hip_backend::do_allocate_host(std::size_t bytes) {
  device_scope scope(*this);
  void* p = nullptr;
  const hipError_t rc = api_.host_malloc(&p, bytes, hipHostMallocPortable);
  if (rc == hipErrorOutOfMemory) return nullptr;
  if (rc != hipSuccess) fail(rc, "hipHostMalloc");
  return p;
}

void hip_backend::do_free_host(void* ptr, std::size_t /*bytes*/) {
  device_scope scope(*this);
  if (const hipError_t rc = api_.host_free(ptr); rc != hipSuccess) fail(rc, "hipHostFree");
}

void hip_backend::do_memcpy_async(void* dst, const void* src, std::size_t bytes, stream_t stream) {
  device_scope scope(*this);
  const hipError_t rc = api_.memcpy_async(dst, src, bytes, hipMemcpyDefault, static_cast<hipStream_t>(stream));
  if (rc != hipSuccess) fail(rc, "hipMemcpyAsync");
}

// --- Sharing (raw allocations) -------------------------------------------------------

void hip_backend::require_entry(const void* fn, const char* entry) const {
  if (fn != nullptr) return;
  throw backend_error(fmt::format("hip backend: the HIP runtime has no {}", entry), hipErrorNotSupported,
                      "not_supported");
}

ipc_memory_handle hip_backend::do_export_allocation(void* base) {
  require_entry(reinterpret_cast<const void*>(api_.ipc_get_mem_handle), "hipIpcGetMemHandle");
  device_scope scope(*this);
  hipIpcMemHandle_t handle{};
  if (const hipError_t rc = api_.ipc_get_mem_handle(&handle, base); rc != hipSuccess) fail(rc, "hipIpcGetMemHandle");
  static_assert(sizeof handle == sizeof(ipc_memory_handle));
  ipc_memory_handle out{};
  std::memcpy(out.data(), &handle, out.size());
  return out;
}

void* hip_backend::do_open_allocation(const ipc_memory_handle& handle) {
  require_entry(reinterpret_cast<const void*>(api_.ipc_open_mem_handle), "hipIpcOpenMemHandle");
  device_scope scope(*this);
  hipIpcMemHandle_t h{};
  std::memcpy(&h, handle.data(), handle.size());
  void* p = nullptr;
  if (const hipError_t rc = api_.ipc_open_mem_handle(&p, h, hipIpcMemLazyEnablePeerAccess); rc != hipSuccess) {
    fail(rc, "hipIpcOpenMemHandle");
  }
  return p;
}

void hip_backend::do_close_allocation(void* base) {
  require_entry(reinterpret_cast<const void*>(api_.ipc_close_mem_handle), "hipIpcCloseMemHandle");
  device_scope scope(*this);
  if (const hipError_t rc = api_.ipc_close_mem_handle(base); rc != hipSuccess) fail(rc, "hipIpcCloseMemHandle");
}

std::unique_ptr<device_backend> make_hip_backend(int device) { return std::make_unique<hip_backend>(device); }

}  // namespace fragctl
