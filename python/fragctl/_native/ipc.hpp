// CUDA IPC of fragctl's blocks for PyTorch (CUDAAllocator::shareIpcHandle
// and getIpcDevPtr): what torch.multiprocessing does with a CUDA tensor
// that crosses a process boundary (docs/interop.md, "Sharing tensors between
// processes").
//
// The producer's handle is fragctl_export_block's (the format is the C
// API's, src/capi/ipc.cpp): the file descriptors of the arena's physical
// handles under the block, or the runtime's IPC handle of a plain device
// allocation in PyTorch's own form. PyTorch adds its reference counting
// (torch/csrc/CudaIPCTypes: a shared counter and an event), so the
// producer's block is freed only once every consumer dropped it; fragctl
// frees it when PyTorch's deleter says so, as any block.
//
// The consumer maps each handle string once while any tensor of it lives
// (as PyTorch's allocator does): a second tensor of the same block, or of
// another block under the same handles, gets the same mapping; the last
// one to go unmaps it (fragctl_close_block).
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include <c10/cuda/CUDACachingAllocator.h>

#include "c_api.hpp"

namespace fragctl_torch {

class ipc_handles {
 public:
  /// shareIpcHandle for the live block [ptr, ptr + bytes) of `allocator`:
  /// the handle and ptr's offset from what the consumer maps.
  c10::cuda::CUDACachingAllocator::ShareableHandle share(fragctl_allocator* allocator, void* ptr,
                                                         std::size_t bytes);
  /// getIpcDevPtr: the memory `handle` names, mapped on `allocator`'s device
  /// (the current one), once per handle string while any holder lives.
  std::shared_ptr<void> open(fragctl_allocator* allocator, const std::string& handle);

 private:
  std::mutex mutex_;
  std::unordered_map<std::string, std::weak_ptr<void>> opened_;
};

}  // namespace fragctl_torch
