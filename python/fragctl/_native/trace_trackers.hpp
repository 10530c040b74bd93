// fragctl's physical spans as PyTorch's trace trackers see segments, so that
// ProcessGroupNCCL's allocator hooks (TORCH_NCCL_USE_TENSOR_REGISTER_
// ALLOCATOR_HOOK=1, register_mem_pool) register fragctl memory with NCCL
// (ncclCommRegister), one span at a time: a span is one handle the arena
// mapped or one plain device allocation (fragctl_watch_spans), never a range
// that crosses two handles. Every fragctl allocator of this backend is
// watched: a span that became usable is a SEGMENT_ALLOC, one about to be
// unmapped a SEGMENT_FREE sent before the unmap, so a registration is taken
// back while the memory is still mapped. While a tracker is attached, the
// snapshot's segments are cut at span boundaries too (split_at_spans): a
// communicator created later registers the spans that exist already from
// the snapshot, and each of those gets its SEGMENT_FREE by the same address.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include <c10/cuda/CUDACachingAllocator.h>

#include "fragctl/fragctl.h"
#include "history.hpp"

namespace fragctl_torch {

class span_watch {
 public:
  explicit span_watch(history& h) : history_(h) {}
  /// Reports `allocator`'s spans as segments of `device` and pool `pool`.
  void watch(fragctl_allocator* allocator, c10::DeviceIndex device, c10::MempoolId_t pool);
  /// Forgets `allocator` (after fragctl_destroy, whose unmaps it reported).
  void forget(fragctl_allocator* allocator);

 private:
  struct source {
    history* h;
    c10::DeviceIndex device;
    c10::MempoolId_t pool;
  };
  history& history_;
  std::mutex mutex_;
  std::unordered_map<fragctl_allocator*, std::unique_ptr<source>> sources_;
};

/// (address, bytes) of every span of `allocator` usable now, in address order.
[[nodiscard]] std::vector<std::pair<std::uint64_t, std::uint64_t>> spans_of(fragctl_allocator* allocator);

/// `segment` cut at every span boundary inside it (`spans` in address
/// order); its blocks are cut where they cross one. Each piece gets the
/// next `counter` as its registration_counter.
[[nodiscard]] std::vector<c10::CachingDeviceAllocator::SegmentInfo> split_at_spans(
    const c10::CachingDeviceAllocator::SegmentInfo& segment,
    const std::vector<std::pair<std::uint64_t, std::uint64_t>>& spans, std::int32_t& counter);

}  // namespace fragctl_torch
