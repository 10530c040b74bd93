// CUDA IPC of fragctl's blocks for PyTorch (ipc.hpp).
#include "ipc.hpp"

#include <vector>

#include <c10/util/Exception.h>

namespace fragctl_torch {

c10::cuda::CUDACachingAllocator::ShareableHandle ipc_handles::share(fragctl_allocator* allocator, void* ptr,
                                                                    std::size_t bytes) {
  std::vector<char> buffer(4096);
  std::size_t size = 0;
  std::size_t offset = 0;
  fragctl_status status =
      api.fragctl_export_block(allocator, ptr, bytes, buffer.data(), buffer.size(), &size, &offset);
  if (status != FRAGCTL_OK && size > buffer.size()) {  // a block over many handles
    buffer.resize(size);
    status = api.fragctl_export_block(allocator, ptr, bytes, buffer.data(), buffer.size(), &size, &offset);
  }
  check(status, "sharing a CUDA tensor with another process (shareIpcHandle)");
  return {static_cast<std::ptrdiff_t>(offset), std::string(buffer.data(), size)};
}

std::shared_ptr<void> ipc_handles::open(fragctl_allocator* allocator, const std::string& handle) {
  const std::lock_guard lock(mutex_);
  if (const auto it = opened_.find(handle); it != opened_.end()) {
    if (std::shared_ptr<void> mapped = it->second.lock()) return mapped;
  }
  void* base = nullptr;
  check(api.fragctl_import_block(allocator, handle.data(), handle.size(), &base),
        "opening a CUDA tensor of another process (getIpcDevPtr)");
  std::shared_ptr<void> mapped(base, [this, allocator, handle](void* p) {
    {
      const std::lock_guard relock(mutex_);
      const auto it = opened_.find(handle);
      if (it != opened_.end() && it->second.expired()) opened_.erase(it);
    }
    if (api.fragctl_close_block(allocator, p) != FRAGCTL_OK) {
      TORCH_WARN("fragctl: unmapping a CUDA tensor of another process: ", api.fragctl_last_error());
    }
  });
  opened_[handle] = mapped;
  return mapped;
}

}  // namespace fragctl_torch
