// The HIP backend: device_backend over the HIP runtime (hip_runtime.hpp); the
// HIP mirror of cuda_backend.hpp.
//
// Device. The HIP runtime works on the calling thread's current device. Every
// call makes this backend's device current for its duration (hipSetDevice)
// and puts the thread's previous device back afterwards, so a thread working
// on another device sees no change. When the device is already current (the
// usual case) the cost is one hipGetDevice.
//
// Virtual memory is offered only where hip_runtime.hpp's conditions hold (HIP 6
// headers and a runtime of the same major, the device attribute set); elsewhere
// supports_virtual_memory() is false and the calls throw "not_supported".
//
// Cost. Event and stream calls take no lock and allocate nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "backend/hip/hip_runtime.hpp"
#include "fragctl/backend.hpp"

namespace fragctl {

class hip_backend final : public device_backend {
 public:
  /// Binds to HIP device `device`. Throws backend_error (one line) when the
  /// runtime is missing or the device does not exist ("hip backend: no HIP
  /// device 3 (2 present)").
  explicit hip_backend(int device);
  ~hip_backend() override = default;

  [[nodiscard]] std::string_view name() const noexcept override { return "hip"; }
  [[nodiscard]] int device() const noexcept override { return ordinal_; }
  [[nodiscard]] bool supports_virtual_memory() const noexcept override { return virtual_memory_; }
  /// The larger of hipMemAllocationGranularityMinimum and 2 MiB (AMD GPUs can
  /// report 4 KiB, which would make page stitching map thousands of tiny
  /// pieces); 2 MiB where virtual memory is not supported.
  [[nodiscard]] std::size_t granularity() const noexcept override { return granularity_; }

 private:
  class device_scope;

  void* do_allocate(std::size_t bytes) override;
  void do_free(void* ptr, std::size_t bytes) override;
  void* do_reserve_address(std::size_t bytes, std::size_t alignment) override;
  void do_release_address(void* base, std::size_t bytes) override;
  std::optional<physical_handle> do_create_physical(std::size_t bytes) override;
  void do_release_physical(physical_handle handle, std::size_t bytes) override;
  bool do_map(void* va, std::size_t bytes, physical_handle handle) override;
  bool do_set_access(void* va, std::size_t bytes) override;
#ifdef FRAGCTL_HIP_VIRTUAL_MEMORY
  void do_check_access_peer(int peer) const override;
  void do_add_access_peer(int peer) override;
  void do_remove_access_peer(std::size_t index) noexcept override;
#endif
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
  void* do_allocate_host(std::size_t bytes) override;
  void do_free_host(void* ptr, std::size_t bytes) override;
  void do_memcpy_async(void* dst, const void* src, std::size_t bytes, stream_t stream) override;
  // Raw allocations are shared with hipIpcGetMemHandle/hipIpcOpenMemHandle.
  // Physical handles are not exported (the base refuses with not_supported):
  // the HIP 5 headers fragctl builds against here have no
  // hipMemExportToShareableHandle, and the HIP 6 path is not yet written.
  ipc_memory_handle do_export_allocation(void* base) override;
  void* do_open_allocation(const ipc_memory_handle& handle) override;
  void do_close_allocation(void* base) override;
  /// Throws not_supported naming `entry` unless the runtime has it.
  void require_entry(const void* fn, const char* entry) const;

  /// Throws backend_error with code "not_supported" unless VM is supported.
  void require_virtual_memory(const char* call) const;
  [[noreturn]] void fail(hipError_t result, const char* call) const;

  const hip::runtime_api& api_;
  int ordinal_;
  bool virtual_memory_ = false;
  std::size_t granularity_ = 0;
#ifdef FRAGCTL_HIP_VIRTUAL_MEMORY
  hipMemAllocationProp physical_properties_{};  ///< pinned memory on this device
  // access_ is read by set_access and changed by enable_peer_access, which
  // may run on other threads (fragctl_import_block maps outside the
  // allocator's lock): access_mutex_ guards it.
  mutable std::mutex access_mutex_;
  std::vector<hipMemAccessDesc> access_;        ///< read-write for this device, then its peers
#endif
};

}  // namespace fragctl
