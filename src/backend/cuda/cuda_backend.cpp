#include "backend/cuda/cuda_backend.hpp"

#include <cstdint>
#include <memory>

#include <unistd.h>

#include <cstring>

#include "backend/cuda/nvml.hpp"
#include "fmt/format.h"
#include "fragctl/error.hpp"
#include "fragctl/log.hpp"

namespace fragctl {

namespace {

constexpr int not_supported_code = CUDA_ERROR_NOT_SUPPORTED;

CUdeviceptr device_address(const void* p) noexcept {
  return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p));
}

void* host_pointer(CUdeviceptr p) noexcept { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)); }

}  // namespace

/// Makes the backend's context current on this thread for one call and puts
/// the thread's previous context back afterwards.
class cuda_backend::context_scope {
 public:
  explicit context_scope(const cuda_backend& backend) : backend_(backend) {
    CUcontext current = nullptr;
    if (const CUresult rc = backend.api_.ctx_get_current(&current); rc != CUDA_SUCCESS) {
      backend.fail(rc, "cuCtxGetCurrent");
    }
    if (current == backend.context_) return;
    if (const CUresult rc = backend.api_.ctx_set_current(backend.context_); rc != CUDA_SUCCESS) {
      backend.fail(rc, "cuCtxSetCurrent");
    }
    previous_ = current;
    restore_ = true;
  }
  ~context_scope() {
    if (restore_) (void)backend_.api_.ctx_set_current(previous_);
  }
  context_scope(const context_scope&) = delete;
  context_scope& operator=(const context_scope&) = delete;

 private:
  const cuda_backend& backend_;
  CUcontext previous_ = nullptr;
  bool restore_ = false;
};

cuda_backend::cuda_backend(int device) : api_(cuda::driver()), ordinal_(device) {
  int count = 0;
  if (const CUresult rc = api_.device_get_count(&count); rc != CUDA_SUCCESS) fail(rc, "cuDeviceGetCount");
  if (device < 0 || device >= count) {
    throw backend_error(fmt::format("cuda backend: no CUDA device {} ({} present)", device, count),
                        CUDA_ERROR_INVALID_DEVICE, cuda::error_name(api_, CUDA_ERROR_INVALID_DEVICE));
  }
  if (const CUresult rc = api_.device_get(&device_, device); rc != CUDA_SUCCESS) fail(rc, "cuDeviceGet");
  if (const CUresult rc = api_.primary_ctx_retain(&context_, device_); rc != CUDA_SUCCESS) {
    fail(rc, "cuDevicePrimaryCtxRetain");
  }
  try {
    context_scope scope(*this);
    physical_properties_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    physical_properties_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    physical_properties_.location.id = device_;
    CUmemAccessDesc own{};
    own.location = physical_properties_.location;
    own.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    access_.push_back(own);
    granularity_ = 2 * MiB;
    if (api_.device_get_pci_bus_id != nullptr) {
      char bus_id[32] = {};
      if (api_.device_get_pci_bus_id(bus_id, static_cast<int>(sizeof bus_id), device_) == CUDA_SUCCESS)
        pci_bus_id_ = bus_id;
    }

    int supported = 0;
    if (api_.has_virtual_memory()) {
      const CUresult rc = api_.device_get_attribute(
          &supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device_);
      if (rc != CUDA_SUCCESS) fail(rc, "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)");
    }
    if (supported != 0) {
      std::size_t minimum = 0;
      const CUresult rc = api_.mem_get_allocation_granularity(&minimum, &physical_properties_,
                                                              CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      if (rc != CUDA_SUCCESS) fail(rc, "cuMemGetAllocationGranularity");
      granularity_ = minimum;
      virtual_memory_ = true;
      // Shareable from the start where the device has POSIX descriptors.
      int posix_fd = 0;
      if (api_.mem_export_to_shareable_handle != nullptr && api_.mem_import_from_shareable_handle != nullptr &&
          api_.device_get_attribute(&posix_fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                                    device_) == CUDA_SUCCESS &&
          posix_fd != 0) {
        shareable_properties_ = physical_properties_;
        shareable_properties_.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        shareable_.store(true, std::memory_order_relaxed);
      }
    }
  } catch (...) {
    (void)api_.primary_ctx_release(device_);
    throw;
  }
}

cuda_backend::~cuda_backend() { (void)api_.primary_ctx_release(device_); }

void cuda_backend::fail(CUresult result, const char* call) const { cuda::throw_error(api_, result, call); }

void cuda_backend::require_virtual_memory(const char* call) const {
  if (virtual_memory_) return;
  throw backend_error(
      fmt::format("cuda backend: {}: virtual memory management is not supported on CUDA device {} (driver {}.{})",
                  call, ordinal_, api_.version / 1000, (api_.version % 1000) / 10),
      not_supported_code, "not_supported");
}

// --- Raw device memory --------------------------------------------------------

void* cuda_backend::do_allocate(std::size_t bytes) {
  context_scope scope(*this);
  CUdeviceptr p = 0;
  const CUresult rc = api_.mem_alloc(&p, bytes);
  if (rc == CUDA_ERROR_OUT_OF_MEMORY) return nullptr;
  if (rc != CUDA_SUCCESS) fail(rc, "cuMemAlloc");
  return host_pointer(p);
}

void cuda_backend::do_free(void* ptr, std::size_t /*bytes*/) {
  context_scope scope(*this);
  if (const CUresult rc = api_.mem_free(device_address(ptr)); rc != CUDA_SUCCESS) fail(rc, "cuMemFree");
}

// --- Virtual memory ---------------------------------------------------------------

void* cuda_backend::do_reserve_address(std::size_t bytes, std::size_t alignment) {
  require_virtual_memory("reserve_address");
  context_scope scope(*this);
  CUdeviceptr p = 0;
  if (const CUresult rc = api_.mem_address_reserve(&p, bytes, alignment, 0, 0); rc != CUDA_SUCCESS) {
    fail(rc, "cuMemAddressReserve");
  }
  return host_pointer(p);
}

void cuda_backend::do_release_address(void* base, std::size_t bytes) {
  require_virtual_memory("release_address");
  context_scope scope(*this);
  if (const CUresult rc = api_.mem_address_free(device_address(base), bytes); rc != CUDA_SUCCESS) {
    fail(rc, "cuMemAddressFree");
  }
}

std::optional<physical_handle> cuda_backend::do_create_physical(std::size_t bytes) {
  require_virtual_memory("create_physical");
  context_scope scope(*this);
  CUmemGenericAllocationHandle handle = 0;
  CUresult rc = CUDA_ERROR_UNKNOWN;
  if (shareable_.load(std::memory_order_relaxed)) {
    rc = api_.mem_create(&handle, bytes, &shareable_properties_, 0);
    if (rc == CUDA_ERROR_NOT_SUPPORTED || rc == CUDA_ERROR_INVALID_VALUE) {
      // The driver may refuse the handle type (a container without it, say):
      // if a plain handle is granted, plain handles from now on, memory that
      // cannot be shared.
      const CUresult refused = rc;
      rc = api_.mem_create(&handle, bytes, &physical_properties_, 0);
      if (rc == CUDA_SUCCESS && shareable_.exchange(false, std::memory_order_relaxed)) {
        logger().debug("cuda backend: cuMemCreate refused POSIX file descriptor handles on device {} ({}); "
                       "physical memory is created without a shareable handle type",
                       ordinal_, cuda::error_name(api_, refused));
      }
    }
  } else {
    rc = api_.mem_create(&handle, bytes, &physical_properties_, 0);
  }
  if (rc == CUDA_ERROR_OUT_OF_MEMORY) return std::nullopt;
  if (rc != CUDA_SUCCESS) fail(rc, "cuMemCreate");
  return physical_handle{static_cast<std::uint64_t>(handle)};
}

void cuda_backend::do_release_physical(physical_handle handle, std::size_t /*bytes*/) {
  require_virtual_memory("release_physical");
  context_scope scope(*this);
  const CUresult rc = api_.mem_release(static_cast<CUmemGenericAllocationHandle>(handle.value));
  if (rc != CUDA_SUCCESS) fail(rc, "cuMemRelease");
}

bool cuda_backend::do_map(void* va, std::size_t bytes, physical_handle handle) {
  require_virtual_memory("map");
  context_scope scope(*this);
  const CUresult rc = api_.mem_map(device_address(va), bytes, 0,
                                   static_cast<CUmemGenericAllocationHandle>(handle.value), 0);
  if (rc == CUDA_ERROR_OUT_OF_MEMORY) return false;
  if (rc != CUDA_SUCCESS) fail(rc, "cuMemMap");
  return true;
}

bool cuda_backend::do_set_access(void* va, std::size_t bytes) {
  require_virtual_memory("set_access");
  context_scope scope(*this);
  const std::lock_guard<std::mutex> lock(access_mutex_);
  const CUresult rc = api_.mem_set_access(device_address(va), bytes, access_.data(), access_.size());
  if (rc == CUDA_ERROR_OUT_OF_MEMORY) return false;
  if (rc != CUDA_SUCCESS) fail(rc, "cuMemSetAccess");
  return true;
}

void cuda_backend::do_remove_access_peer(std::size_t index) noexcept {
  const std::lock_guard<std::mutex> lock(access_mutex_);
  access_.erase(access_.begin() + static_cast<std::ptrdiff_t>(index + 1));  // [0] is this device
}

void cuda_backend::do_check_access_peer(int peer) const {
  int count = 0;
  if (const CUresult rc = api_.device_get_count(&count); rc != CUDA_SUCCESS) fail(rc, "cuDeviceGetCount");
  if (peer >= count) {
    throw backend_error(fmt::format("cuda backend: no CUDA device {} ({} present) to grant access to device {}",
                                    peer, count, ordinal_),
                        CUDA_ERROR_INVALID_DEVICE, cuda::error_name(api_, CUDA_ERROR_INVALID_DEVICE));
  }
  CUdevice other = 0;
  if (const CUresult rc = api_.device_get(&other, peer); rc != CUDA_SUCCESS) fail(rc, "cuDeviceGet");
  int can = 0;
  if (const CUresult rc = api_.device_can_access_peer(&can, other, device_); rc != CUDA_SUCCESS) {
    fail(rc, "cuDeviceCanAccessPeer");
  }
  if (can == 0) {
    throw backend_error(fmt::format("cuda backend: device {} cannot access device {}'s memory "
                                    "(cuDeviceCanAccessPeer)",
                                    peer, ordinal_),
                        CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, cuda::error_name(api_, CUDA_ERROR_PEER_ACCESS_UNSUPPORTED));
  }
}

void cuda_backend::do_add_access_peer(int peer) {
  CUdevice other = 0;
  if (const CUresult rc = api_.device_get(&other, peer); rc != CUDA_SUCCESS) fail(rc, "cuDeviceGet");
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = other;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const std::lock_guard<std::mutex> lock(access_mutex_);
  access_.push_back(desc);
}

void cuda_backend::do_unmap(void* va, std::size_t bytes) {
  require_virtual_memory("unmap");
  context_scope scope(*this);
  if (const CUresult rc = api_.mem_unmap(device_address(va), bytes); rc != CUDA_SUCCESS) fail(rc, "cuMemUnmap");
}

// --- Events and streams -------------------------------------------------------------

event_t cuda_backend::do_create_event() {
  context_scope scope(*this);
  CUevent event = nullptr;
  if (const CUresult rc = api_.event_create(&event, CU_EVENT_DISABLE_TIMING); rc != CUDA_SUCCESS) {
    fail(rc, "cuEventCreate");
  }
  return event;
}

void cuda_backend::do_destroy_event(event_t event) {
  context_scope scope(*this);
  if (const CUresult rc = api_.event_destroy(static_cast<CUevent>(event)); rc != CUDA_SUCCESS) {
    fail(rc, "cuEventDestroy");
  }
}

void cuda_backend::do_record_event(event_t event, stream_t stream) {
  context_scope scope(*this);
  const CUresult rc = api_.event_record(static_cast<CUevent>(event), static_cast<CUstream>(stream));
  if (rc != CUDA_SUCCESS) fail(rc, "cuEventRecord");
}

bool cuda_backend::do_query_event(event_t event) {
  context_scope scope(*this);
  const CUresult rc = api_.event_query(static_cast<CUevent>(event));
  if (rc == CUDA_SUCCESS) return true;
  if (rc == CUDA_ERROR_NOT_READY) return false;
  fail(rc, "cuEventQuery");
}

void cuda_backend::do_synchronize_event(event_t event) {
  context_scope scope(*this);
  if (const CUresult rc = api_.event_synchronize(static_cast<CUevent>(event)); rc != CUDA_SUCCESS) {
    fail(rc, "cuEventSynchronize");
  }
}

void cuda_backend::do_synchronize_stream(stream_t stream) {
  context_scope scope(*this);
  if (const CUresult rc = api_.stream_synchronize(static_cast<CUstream>(stream)); rc != CUDA_SUCCESS) {
    fail(rc, "cuStreamSynchronize");
  }
}

// The primary context current until the binding ends; the token is the
// thread's previous context (nullptr: none).
std::uintptr_t cuda_backend::do_bind_device() {
  CUcontext previous = nullptr;
  if (const CUresult rc = api_.ctx_get_current(&previous); rc != CUDA_SUCCESS) fail(rc, "cuCtxGetCurrent");
  if (previous != context_) {
    if (const CUresult rc = api_.ctx_set_current(context_); rc != CUDA_SUCCESS) fail(rc, "cuCtxSetCurrent");
  }
  return reinterpret_cast<std::uintptr_t>(previous);
}

void cuda_backend::do_unbind_device(std::uintptr_t previous) noexcept {
  const auto context = reinterpret_cast<CUcontext>(previous);  // NOLINT(performance-no-int-to-ptr)
  if (context != context_) (void)api_.ctx_set_current(context);
}

void cuda_backend::do_wait_event(stream_t stream, event_t event) {
  context_scope scope(*this);
  const CUresult rc = api_.stream_wait_event(static_cast<CUstream>(stream), static_cast<CUevent>(event), 0);
  if (rc != CUDA_SUCCESS) fail(rc, "cuStreamWaitEvent");
}

stream_t cuda_backend::do_create_stream() {
  context_scope scope(*this);
  CUstream stream = nullptr;
  if (const CUresult rc = api_.stream_create(&stream, CU_STREAM_NON_BLOCKING); rc != CUDA_SUCCESS) {
    fail(rc, "cuStreamCreate");
  }
  return stream;
}

void cuda_backend::do_destroy_stream(stream_t stream) {
  context_scope scope(*this);
  if (const CUresult rc = api_.stream_destroy(static_cast<CUstream>(stream)); rc != CUDA_SUCCESS) {
    fail(rc, "cuStreamDestroy");
  }
}

// --- Memory information, pinned host memory, copies -----------------------------------

memory_info cuda_backend::do_get_memory_info() {
  context_scope scope(*this);
  memory_info info;
  if (const CUresult rc = api_.mem_get_info(&info.free, &info.total); rc != CUDA_SUCCESS) fail(rc, "cuMemGetInfo");
  return info;
}

process_memory cuda_backend::do_get_process_memory() const noexcept {
  if (pci_bus_id_.empty()) return {};
  return cuda::nvml_process_memory(pci_bus_id_);
}

void* cuda_backend::do_allocate_host(std::size_t bytes) {
  context_scope scope(*this);
  void* p = nullptr;
  const CUresult rc = api_.mem_host_alloc(&p, bytes, CU_MEMHOSTALLOC_PORTABLE);
  if (rc == CUDA_ERROR_OUT_OF_MEMORY) return nullptr;
  if (rc != CUDA_SUCCESS) fail(rc, "cuMemHostAlloc");
  return p;
}

void cuda_backend::do_free_host(void* ptr, std::size_t /*bytes*/) {
  context_scope scope(*this);
  if (const CUresult rc = api_.mem_free_host(ptr); rc != CUDA_SUCCESS) fail(rc, "cuMemFreeHost");
}

void cuda_backend::do_memcpy_async(void* dst, const void* src, std::size_t bytes, stream_t stream) {
  context_scope scope(*this);
  const CUresult rc =
      api_.memcpy_async(device_address(dst), device_address(src), bytes, static_cast<CUstream>(stream));
  if (rc != CUDA_SUCCESS) fail(rc, "cuMemcpyAsync");
}

// --- Sharing ---------------------------------------------------------------------------

int cuda_backend::do_export_physical(physical_handle handle) {
  require_virtual_memory("export_physical");
  if (!shareable_.load(std::memory_order_relaxed)) {
    throw backend_error(fmt::format("cuda backend: export_physical: device {}'s physical memory is not created "
                                    "shareable (the driver has no POSIX file descriptor handles here)",
                                    ordinal_),
                        not_supported_code, "not_supported");
  }
  context_scope scope(*this);
  int fd = -1;
  const CUresult rc = api_.mem_export_to_shareable_handle(
      &fd, static_cast<CUmemGenericAllocationHandle>(handle.value), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  if (rc != CUDA_SUCCESS) fail(rc, "cuMemExportToShareableHandle");
  return fd;
}

void cuda_backend::do_close_export(int fd) noexcept { (void)::close(fd); }

physical_handle cuda_backend::do_import_physical(int fd, std::size_t /*bytes*/) {
  require_virtual_memory("import_physical");
  if (api_.mem_import_from_shareable_handle == nullptr) {
    throw backend_error(fmt::format("cuda backend: import_physical: driver {}.{} has no "
                                    "cuMemImportFromShareableHandle",
                                    api_.version / 1000, (api_.version % 1000) / 10),
                        not_supported_code, "not_supported");
  }
  context_scope scope(*this);
  CUmemGenericAllocationHandle handle = 0;
  // A POSIX descriptor travels in the pointer-sized argument itself.
  void* os_handle = reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd));  // NOLINT(performance-no-int-to-ptr)
  const CUresult rc =
      api_.mem_import_from_shareable_handle(&handle, os_handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (rc != CUDA_SUCCESS) fail(rc, "cuMemImportFromShareableHandle");
  return physical_handle{static_cast<std::uint64_t>(handle)};
}

ipc_memory_handle cuda_backend::do_export_allocation(void* base) {
  if (api_.ipc_get_mem_handle == nullptr) {
    throw backend_error("cuda backend: export_allocation: the driver has no cuIpcGetMemHandle", not_supported_code,
                        "not_supported");
  }
  context_scope scope(*this);
  CUipcMemHandle handle{};
  if (const CUresult rc = api_.ipc_get_mem_handle(&handle, device_address(base)); rc != CUDA_SUCCESS) {
    fail(rc, "cuIpcGetMemHandle");
  }
  static_assert(sizeof handle == sizeof(ipc_memory_handle));
  ipc_memory_handle out{};
  std::memcpy(out.data(), &handle, out.size());
  return out;
}

void* cuda_backend::do_open_allocation(const ipc_memory_handle& handle) {
  if (api_.ipc_open_mem_handle == nullptr) {
    throw backend_error("cuda backend: open_allocation: the driver has no cuIpcOpenMemHandle", not_supported_code,
                        "not_supported");
  }
  context_scope scope(*this);
  CUipcMemHandle h{};
  std::memcpy(&h, handle.data(), handle.size());
  CUdeviceptr p = 0;
  if (const CUresult rc = api_.ipc_open_mem_handle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS); rc != CUDA_SUCCESS) {
    fail(rc, "cuIpcOpenMemHandle");
  }
  return host_pointer(p);
}

void cuda_backend::do_close_allocation(void* base) {
  context_scope scope(*this);
  if (const CUresult rc = api_.ipc_close_mem_handle(device_address(base)); rc != CUDA_SUCCESS) {
    fail(rc, "cuIpcCloseMemHandle");
  }
}

std::unique_ptr<device_backend> make_cuda_backend(int device) { return std::make_unique<cuda_backend>(device); }

}  // namespace fragctl
