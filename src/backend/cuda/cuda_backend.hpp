// The CUDA backend: device_backend over the CUDA driver API (cuda_driver.hpp).
//
// Context. The backend retains the device's primary context (the one the CUDA
// runtime and PyTorch use) and releases it when destroyed. Every call makes
// that context current for its duration and puts back the calling thread's
// previous context afterwards, so a thread working on another device, or a
// thread with no context, sees no change. When the context is already current
// (the usual case) the cost is one cuCtxGetCurrent.
//
// Cost. Event and stream calls take no lock and allocate nothing: they are a
// context check plus the driver call. Only error paths allocate (the message).
//
// Handles are mapped from offset 0, the only offset cuMemMap accepts.
//
// Sharing. Physical handles are created with
// CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR where the device says it has that
// handle type, so any of them can be exported later
// (cuMemExportToShareableHandle) for another process to import and map; if
// cuMemCreate refuses the type, the backend creates handles without it from
// then on (one debug line) and exporting is refused. Raw allocations are
// shared with cuIpcGetMemHandle / cuIpcOpenMemHandle.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/cuda_driver.hpp"
#include "fragctl/backend.hpp"

namespace fragctl {

class cuda_backend final : public device_backend {
 public:
  /// Binds to CUDA device `device` and retains its primary context. Throws
  /// backend_error (one line) when the driver is missing or the device does
  /// not exist ("cuda backend: no CUDA device 3 (2 present)").
  explicit cuda_backend(int device);
  /// Releases the primary context; errors (e.g. the driver already shut down
  /// at process exit) are ignored.
  ~cuda_backend() override;

  [[nodiscard]] std::string_view name() const noexcept override { return "cuda"; }
  [[nodiscard]] int device() const noexcept override { return ordinal_; }
  /// CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, and the driver
  /// has the cuMem* virtual memory entry points.
  [[nodiscard]] bool supports_virtual_memory() const noexcept override { return virtual_memory_; }
  /// CU_MEM_ALLOC_GRANULARITY_MINIMUM for pinned device memory (2 MiB on
  /// H100/H200); 2 MiB where virtual memory is not supported.
  [[nodiscard]] std::size_t granularity() const noexcept override { return granularity_; }
  [[nodiscard]] bool shareable_handles() const noexcept override {
    return shareable_.load(std::memory_order_relaxed);
  }

 private:
  class context_scope;

  void* do_allocate(std::size_t bytes) override;
  void do_free(void* ptr, std::size_t bytes) override;
  void* do_reserve_address(std::size_t bytes, std::size_t alignment) override;
  void do_release_address(void* base, std::size_t bytes) override;
  std::optional<physical_handle> do_create_physical(std::size_t bytes) override;
  void do_release_physical(physical_handle handle, std::size_t bytes) override;
  bool do_map(void* va, std::size_t bytes, physical_handle handle) override;
  bool do_set_access(void* va, std::size_t bytes) override;
  void do_check_access_peer(int peer) const override;
  void do_add_access_peer(int peer) override;
  void do_remove_access_peer(std::size_t index) noexcept override;
  void do_unmap(void* va, std::size_t bytes) override;
  event_t do_create_event() override;
  void do_destroy_event(event_t event) override;
  void do_record_event(event_t event, stream_t stream) override;
  bool do_query_event(event_t event) override;
  void do_synchronize_event(event_t event) override;
  void do_synchronize_stream(stream_t stream) override;
  void do_wait_event(stream_t stream, event_t event) override;
  std::uintptr_t do_bind_device() override;
  void do_unbind_device(std::uintptr_t previous) noexcept override;
  stream_t do_create_stream() override;
  void do_destroy_stream(stream_t stream) override;
  memory_info do_get_memory_info() override;
  /// NVML's figures (nvml.hpp) for this device's PCI bus id.
  process_memory do_get_process_memory() const noexcept override;
  void* do_allocate_host(std::size_t bytes) override;
  void do_free_host(void* ptr, std::size_t bytes) override;
  void do_memcpy_async(void* dst, const void* src, std::size_t bytes, stream_t stream) override;
  int do_export_physical(physical_handle handle) override;
  void do_close_export(int fd) noexcept override;
  physical_handle do_import_physical(int fd, std::size_t bytes) override;
  ipc_memory_handle do_export_allocation(void* base) override;
  void* do_open_allocation(const ipc_memory_handle& handle) override;
  void do_close_allocation(void* base) override;

  /// Throws backend_error with code "not_supported" unless VM is supported.
  void require_virtual_memory(const char* call) const;
  [[noreturn]] void fail(CUresult result, const char* call) const;

  const cuda::driver_api& api_;
  int ordinal_;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  bool virtual_memory_ = false;
  std::size_t granularity_ = 0;
  std::string pci_bus_id_;                     ///< cuDeviceGetPCIBusId; empty where the driver lacks it
  CUmemAllocationProp physical_properties_{};  ///< pinned memory on this device, no handle type
  CUmemAllocationProp shareable_properties_{};  ///< the same, exportable as a POSIX file descriptor
  std::atomic<bool> shareable_{false};          ///< create with shareable_properties_
  // access_ is read by set_access and changed by enable_peer_access, which
  // may run on other threads (fragctl_import_block maps outside the
  // allocator's lock): access_mutex_ guards it.
  mutable std::mutex access_mutex_;
  std::vector<CUmemAccessDesc> access_;        ///< read-write for this device, then its peers
};

}  // namespace fragctl
