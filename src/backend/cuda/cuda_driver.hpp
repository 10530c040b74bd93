// The CUDA driver entry points fragctl calls, loaded at run time.
//
// Nothing links libcuda: the table is filled once per process from
// dlopen("libcuda.so.1"), so a binary built with fragctl starts on a machine
// without an NVIDIA driver, and an LD_PRELOADed cudaMalloc never recurses into
// itself (fragctl never calls the runtime API).
//
// ABI versions. The driver exports several ABI versions of many functions
// (cuMemAlloc and cuMemAlloc_v2, cuEventRecord and cuEventRecord_ptsz), and
// cuda.h silently renames calls to the newest one. Each entry here is typed
// with the PFN_<name>_v<version> typedef of cudaTypedefs.h and resolved for
// exactly that ABI version: with cuGetProcAddress_v2(name, version,
// CU_GET_PROC_ADDRESS_LEGACY_STREAM) on drivers 12.0 and newer, else with dlsym
// of the exported name of that version ("cuMemAlloc_v2"). Stream arguments
// therefore have legacy default-stream semantics: a null stream is the legacy
// default stream.
//
// Members are snake_case on purpose: cuda.h #defines most cuXxx names to their
// versioned symbols, which would silently rename members spelled that way.
#pragma once

#include <cudaTypedefs.h>

#include <string>

namespace fragctl::cuda {

/// Function pointers into libcuda.so.1. Required entries are never null in a
/// loaded table; the virtual memory entries are null where the driver lacks
/// them (before CUDA 10.2).
struct driver_api {
  PFN_cuInit_v2000 init = nullptr;
  PFN_cuDriverGetVersion_v2020 driver_get_version = nullptr;
  PFN_cuGetErrorName_v6000 get_error_name = nullptr;
  PFN_cuGetErrorString_v6000 get_error_string = nullptr;

  PFN_cuDeviceGetCount_v2000 device_get_count = nullptr;
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetAttribute_v2000 device_get_attribute = nullptr;
  PFN_cuDeviceCanAccessPeer_v4000 device_can_access_peer = nullptr;
  PFN_cuDevicePrimaryCtxRetain_v7000 primary_ctx_retain = nullptr;
  PFN_cuDevicePrimaryCtxRelease_v11000 primary_ctx_release = nullptr;
  PFN_cuCtxGetCurrent_v4000 ctx_get_current = nullptr;
  PFN_cuCtxSetCurrent_v4000 ctx_set_current = nullptr;
  /// Optional: how NVML finds the device (nvml.hpp); null where missing.
  PFN_cuDeviceGetPCIBusId_v4010 device_get_pci_bus_id = nullptr;

  PFN_cuMemAlloc_v3020 mem_alloc = nullptr;
  PFN_cuMemFree_v3020 mem_free = nullptr;
  PFN_cuMemGetInfo_v3020 mem_get_info = nullptr;
  PFN_cuMemHostAlloc_v2020 mem_host_alloc = nullptr;
  PFN_cuMemFreeHost_v2000 mem_free_host = nullptr;
  PFN_cuMemcpyAsync_v4000 memcpy_async = nullptr;

  PFN_cuEventCreate_v2000 event_create = nullptr;
  PFN_cuEventDestroy_v4000 event_destroy = nullptr;
  PFN_cuEventRecord_v2000 event_record = nullptr;
  PFN_cuEventQuery_v2000 event_query = nullptr;
  PFN_cuEventSynchronize_v2000 event_synchronize = nullptr;
  PFN_cuStreamCreate_v2000 stream_create = nullptr;
  PFN_cuStreamSynchronize_v2000 stream_synchronize = nullptr;
  PFN_cuStreamWaitEvent_v3020 stream_wait_event = nullptr;
  PFN_cuStreamDestroy_v4000 stream_destroy = nullptr;

  // IPC of raw allocations (optional).
  PFN_cuIpcGetMemHandle_v4010 ipc_get_mem_handle = nullptr;
  PFN_cuIpcOpenMemHandle_v11000 ipc_open_mem_handle = nullptr;
  PFN_cuIpcCloseMemHandle_v4010 ipc_close_mem_handle = nullptr;

  // Virtual memory management (optional).
  PFN_cuMemAddressReserve_v10020 mem_address_reserve = nullptr;
  PFN_cuMemAddressFree_v10020 mem_address_free = nullptr;
  PFN_cuMemCreate_v10020 mem_create = nullptr;
  PFN_cuMemRelease_v10020 mem_release = nullptr;
  PFN_cuMemMap_v10020 mem_map = nullptr;
  PFN_cuMemUnmap_v10020 mem_unmap = nullptr;
  PFN_cuMemSetAccess_v10020 mem_set_access = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 mem_get_allocation_granularity = nullptr;
  // Shareable physical handles (optional, not part of has_virtual_memory).
  PFN_cuMemExportToShareableHandle_v10020 mem_export_to_shareable_handle = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 mem_import_from_shareable_handle = nullptr;

  int version = 0;  ///< cuDriverGetVersion: 1000 * major + 10 * minor

  /// Whether every virtual memory entry point was found.
  [[nodiscard]] bool has_virtual_memory() const noexcept;
};

/// The process-wide table: on first use loads libcuda.so.1, calls cuInit(0)
/// and resolves every entry; later calls return the same table (never
/// unloaded, so backends destroyed during static destruction stay safe).
/// Thread-safe. Throws backend_error with a one-line message when the library
/// is missing ("cuda backend: libcuda.so.1 not found (no NVIDIA driver on this
/// machine)"), cuInit fails, or a required entry point is missing; the outcome
/// is remembered and every later call throws the same error.
[[nodiscard]] const driver_api& driver();

/// Symbolic name of a driver result ("CUDA_ERROR_INVALID_VALUE"), or
/// "CUresult <n>" for a code the driver does not know.
[[nodiscard]] std::string error_name(const driver_api& api, CUresult result);

/// Throws backend_error "cuda backend: <call> failed: <NAME> (<description>)"
/// with the result's code and name.
[[noreturn]] void throw_error(const driver_api& api, CUresult result, const char* call);

}  // namespace fragctl::cuda
