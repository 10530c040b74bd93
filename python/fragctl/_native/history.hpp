// What PyTorch records and watches of its allocator: the allocation history
// of torch.cuda.memory._record_memory_history (memory_viz snapshots), trace
// trackers and out-of-memory observers. The stack of each live block is kept
// only while the history records stacks.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/flat_hash_map.h>

namespace fragctl_torch {

class history {
 public:
  using TraceEntry = c10::CachingDeviceAllocator::TraceEntry;

  [[nodiscard]] bool on() const noexcept { return on_.load(std::memory_order_relaxed); }
  /// recordHistory's arguments.
  void configure(bool enabled, c10::CachingDeviceAllocator::CreateContextFn recorder, std::size_t max_entries,
                 c10::CachingDeviceAllocator::RecordContext when, bool clear,
                 const std::vector<std::string>& skip_actions);
  /// One (empty) trace per device up to `count` (init).
  void add_devices(int count);
  void attach_tracker(c10::CachingDeviceAllocator::AllocatorTraceTracker tracker);
  void attach_oom_observer(c10::cuda::CUDACachingAllocator::OutOfMemoryObserver observer);
  [[nodiscard]] std::vector<c10::cuda::CUDACachingAllocator::OutOfMemoryObserver> oom_observers() const;

  /// An allocation (ALLOC), its stack taken when stacks are recorded.
  void allocated(c10::DeviceIndex device, void* ptr, std::size_t bytes, cudaStream_t stream, c10::MempoolId_t pool);
  /// A free (FREE_REQUESTED); the block's stack is dropped.
  void freed(c10::DeviceIndex device, void* ptr, std::size_t bytes, cudaStream_t stream, c10::MempoolId_t pool);
  /// An out-of-memory error (OOM; the address field holds the free bytes, as PyTorch's).
  void out_of_memory(c10::DeviceIndex device, std::size_t free, std::size_t bytes, cudaStream_t stream);

  /// Whether a trace tracker is attached.
  [[nodiscard]] bool tracking() const noexcept { return tracking_.load(std::memory_order_acquire); }
  /// A segment appeared (SEGMENT_ALLOC, after it became usable) or is about
  /// to go (SEGMENT_FREE, before it is unmapped or freed): told to the trace
  /// trackers (ProcessGroupNCCL's registration hooks), not kept in the
  /// history. A tracker that throws is reported as a warning.
  void segment(bool allocated, c10::DeviceIndex device, std::size_t addr, std::size_t bytes, cudaStream_t stream,
               c10::MempoolId_t pool);

  /// The stack `ptr` was allocated with, or nullptr.
  [[nodiscard]] std::shared_ptr<c10::GatheredContext> context_of(void* ptr) const;
  /// Every device's trace, oldest first.
  [[nodiscard]] std::vector<std::vector<TraceEntry>> traces() const;

 private:
  void record(TraceEntry::Action action, c10::DeviceIndex device, std::size_t addr, std::size_t bytes,
              cudaStream_t stream, c10::MempoolId_t pool, std::shared_ptr<c10::GatheredContext> context);

  mutable std::mutex mutex_;
  std::atomic<bool> on_{false};
  c10::CachingDeviceAllocator::CreateContextFn recorder_ = nullptr;
  c10::CachingDeviceAllocator::RecordContext when_ = c10::CachingDeviceAllocator::RecordContext::NEVER;
  std::size_t max_entries_ = SIZE_MAX;
  std::unordered_set<TraceEntry::Action> skip_;
  std::vector<std::deque<TraceEntry>> traces_;
  ska::flat_hash_map<void*, std::shared_ptr<c10::GatheredContext>> contexts_;
  std::vector<c10::cuda::CUDACachingAllocator::OutOfMemoryObserver> oom_observers_;
  std::vector<c10::CachingDeviceAllocator::AllocatorTraceTracker> trackers_;
  std::atomic<bool> tracking_{false};  // trackers_ is not empty
};

}  // namespace fragctl_torch
