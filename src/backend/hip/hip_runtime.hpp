// The HIP runtime entry points fragctl calls, loaded at run time; the HIP
// mirror of cuda_driver.hpp.
//
// Nothing links libamdhip64: the table is filled once per process from
// dlopen("libamdhip64.so") (then the .so.7, .so.6 and .so.5 sonames), so a
// binary built with fragctl starts on a machine without ROCm. Entries are
// typed here with the C signatures of hip_runtime_api.h (the header's C++
// template overloads make decltype of the names ambiguous).
//
// Virtual memory. hipMemCreate/hipMemMap/... exist from HIP 5.1 on, but before
// HIP 6.0 they were a beta whose hipMemAllocationProp had another layout
// (compressionType first) and there was no
// hipDeviceAttributeVirtualMemoryManagementSupported to ask. fragctl therefore
// compiles the virtual memory path only against HIP 6 headers or newer
// (FRAGCTL_HIP_VIRTUAL_MEMORY below), and uses it only when the loaded runtime
// has the same major version as those headers (so the structures passed have
// the layout the runtime expects), every entry point is found, and the device
// reports the attribute. Debian 12 ships HIP 5.2 headers: there the hip backend
// reports no virtual memory, and the arena policy uses its contiguous fallback.
#pragma once

#include <hip/hip_runtime_api.h>
#include <hip/hip_version.h>

#include <string>

#if defined(HIP_VERSION_MAJOR) && HIP_VERSION_MAJOR >= 6
#define FRAGCTL_HIP_VIRTUAL_MEMORY 1
#endif

namespace fragctl::hip {

/// Function pointers into libamdhip64. Required entries are never null in a
/// loaded table; the virtual memory entries may be null.
struct runtime_api {
  hipError_t (*init)(unsigned int flags) = nullptr;
  hipError_t (*runtime_get_version)(int* version) = nullptr;
  const char* (*get_error_name)(hipError_t error) = nullptr;
  const char* (*get_error_string)(hipError_t error) = nullptr;

  hipError_t (*get_device_count)(int* count) = nullptr;
  hipError_t (*get_device)(int* device) = nullptr;
  hipError_t (*set_device)(int device) = nullptr;
  hipError_t (*device_get_attribute)(int* value, hipDeviceAttribute_t attribute, int device) = nullptr;
  hipError_t (*device_can_access_peer)(int* can, int device, int peer_device) = nullptr;

  hipError_t (*mem_alloc)(void** ptr, size_t bytes) = nullptr;
  hipError_t (*mem_free)(void* ptr) = nullptr;
  hipError_t (*mem_get_info)(size_t* free, size_t* total) = nullptr;
  hipError_t (*host_malloc)(void** ptr, size_t bytes, unsigned int flags) = nullptr;
  hipError_t (*host_free)(void* ptr) = nullptr;
  hipError_t (*memcpy_async)(void* dst, const void* src, size_t bytes, hipMemcpyKind kind,
                             hipStream_t stream) = nullptr;

  hipError_t (*event_create_with_flags)(hipEvent_t* event, unsigned int flags) = nullptr;
  hipError_t (*event_destroy)(hipEvent_t event) = nullptr;
  hipError_t (*event_record)(hipEvent_t event, hipStream_t stream) = nullptr;
  hipError_t (*event_query)(hipEvent_t event) = nullptr;
  hipError_t (*event_synchronize)(hipEvent_t event) = nullptr;
  hipError_t (*stream_create_with_flags)(hipStream_t* stream, unsigned int flags) = nullptr;
  hipError_t (*stream_synchronize)(hipStream_t stream) = nullptr;
  hipError_t (*stream_wait_event)(hipStream_t stream, hipEvent_t event, unsigned int flags) = nullptr;
  hipError_t (*stream_destroy)(hipStream_t stream) = nullptr;

  // IPC of raw allocations (optional).
  hipError_t (*ipc_get_mem_handle)(hipIpcMemHandle_t* handle, void* ptr) = nullptr;
  hipError_t (*ipc_open_mem_handle)(void** ptr, hipIpcMemHandle_t handle, unsigned int flags) = nullptr;
  hipError_t (*ipc_close_mem_handle)(void* ptr) = nullptr;

#ifdef FRAGCTL_HIP_VIRTUAL_MEMORY
  // Virtual memory management (optional).
  hipError_t (*mem_address_reserve)(void** ptr, size_t bytes, size_t alignment, void* addr,
                                    unsigned long long flags) = nullptr;
  hipError_t (*mem_address_free)(void* ptr, size_t bytes) = nullptr;
  hipError_t (*mem_create)(hipMemGenericAllocationHandle_t* handle, size_t bytes, const hipMemAllocationProp* prop,
                           unsigned long long flags) = nullptr;
  hipError_t (*mem_release)(hipMemGenericAllocationHandle_t handle) = nullptr;
  hipError_t (*mem_map)(void* ptr, size_t bytes, size_t offset, hipMemGenericAllocationHandle_t handle,
                        unsigned long long flags) = nullptr;
  hipError_t (*mem_unmap)(void* ptr, size_t bytes) = nullptr;
  hipError_t (*mem_set_access)(void* ptr, size_t bytes, const hipMemAccessDesc* desc, size_t count) = nullptr;
  hipError_t (*mem_get_allocation_granularity)(size_t* granularity, const hipMemAllocationProp* prop,
                                               hipMemAllocationGranularity_flags option) = nullptr;
#endif

  int version = 0;              ///< hipRuntimeGetVersion: major * 10^7 + minor * 10^5 + patch
  std::string library;          ///< the name dlopen succeeded with

  /// Whether the virtual memory path is compiled in, every entry point was
  /// found, and the runtime's major version equals the headers'.
  [[nodiscard]] bool has_virtual_memory() const noexcept;
};

/// The process-wide table: on first use loads libamdhip64, calls hipInit(0)
/// and resolves every entry; later calls return the same table (never
/// unloaded). Thread-safe. Throws backend_error with a one-line message when
/// the library is missing ("hip backend: libamdhip64.so not found (no ROCm
/// HIP runtime on this machine)"), hipInit fails (no device), or a required
/// entry point is missing; the outcome is remembered.
[[nodiscard]] const runtime_api& runtime();

/// Symbolic name of a HIP result ("hipErrorInvalidValue").
[[nodiscard]] std::string error_name(const runtime_api& api, hipError_t result);

/// Throws backend_error "hip backend: <call> failed: <name> (<description>)".
[[noreturn]] void throw_error(const runtime_api& api, hipError_t result, const char* call);

}  // namespace fragctl::hip
