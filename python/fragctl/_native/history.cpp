// The allocation history, trace trackers and out-of-memory observers (history.hpp).
#include "history.hpp"

#include <algorithm>
#include <utility>

#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>

namespace fragctl_torch {

using c10::CachingDeviceAllocator::RecordContext;

void history::configure(bool enabled, c10::CachingDeviceAllocator::CreateContextFn recorder, std::size_t max_entries,
                        RecordContext when, bool clear, const std::vector<std::string>& skip_actions) {
  const std::lock_guard lock(mutex_);
  recorder_ = enabled ? recorder : nullptr;
  when_ = when;
  max_entries_ = std::max<std::size_t>(max_entries, 1);
  skip_.clear();
  for (const std::string& a : skip_actions) skip_.insert(c10::CachingDeviceAllocator::parseTraceEntryAction(a));
  if (clear) {
    for (auto& t : traces_) t.clear();
  }
  if (!enabled) contexts_.clear();
  on_.store(enabled, std::memory_order_relaxed);
}

void history::add_devices(int count) {
  const std::lock_guard lock(mutex_);
  if (traces_.size() < static_cast<std::size_t>(count)) traces_.resize(static_cast<std::size_t>(count));
}

void history::attach_tracker(c10::CachingDeviceAllocator::AllocatorTraceTracker tracker) {
  const std::lock_guard lock(mutex_);
  trackers_.push_back(std::move(tracker));
  tracking_.store(true, std::memory_order_release);
}

void history::segment(bool allocated, c10::DeviceIndex device, std::size_t addr, std::size_t bytes,
                      cudaStream_t stream, c10::MempoolId_t pool) {
  if (!tracking()) return;
  std::vector<c10::CachingDeviceAllocator::AllocatorTraceTracker> trackers;
  {
    const std::lock_guard lock(mutex_);
    trackers = trackers_;
  }
  const TraceEntry entry(allocated ? TraceEntry::SEGMENT_ALLOC : TraceEntry::SEGMENT_FREE, device, addr, bytes, stream,
                         pool, c10::getApproximateTime());
  for (const auto& tracker : trackers) {
    try {
      tracker(entry);
    } catch (const std::exception& e) {
      TORCH_WARN("fragctl: a trace tracker failed on ", allocated ? "SEGMENT_ALLOC" : "SEGMENT_FREE", " of ", bytes,
                 " bytes at ", reinterpret_cast<void*>(addr), ": ", e.what());
    }
  }
}

void history::attach_oom_observer(c10::cuda::CUDACachingAllocator::OutOfMemoryObserver observer) {
  const std::lock_guard lock(mutex_);
  oom_observers_.push_back(std::move(observer));
}

std::vector<c10::cuda::CUDACachingAllocator::OutOfMemoryObserver> history::oom_observers() const {
  const std::lock_guard lock(mutex_);
  return oom_observers_;
}

void history::allocated(c10::DeviceIndex device, void* ptr, std::size_t bytes, cudaStream_t stream,
                        c10::MempoolId_t pool) {
  if (!on()) return;
  const std::lock_guard lock(mutex_);
  std::shared_ptr<c10::GatheredContext> context;
  if (recorder_ != nullptr && when_ != RecordContext::NEVER) {
    context = recorder_();
    contexts_[ptr] = context;
  }
  record(TraceEntry::ALLOC, device, reinterpret_cast<std::size_t>(ptr), bytes, stream, pool, std::move(context));
}

void history::freed(c10::DeviceIndex device, void* ptr, std::size_t bytes, cudaStream_t stream,
                    c10::MempoolId_t pool) {
  if (!on()) return;  // turning the history off dropped every stack
  const std::lock_guard lock(mutex_);
  std::shared_ptr<c10::GatheredContext> context;
  if (const auto it = contexts_.find(ptr); it != contexts_.end()) {
    context = std::move(it->second);
    contexts_.erase(it);
  }
  record(TraceEntry::FREE_REQUESTED, device, reinterpret_cast<std::size_t>(ptr), bytes, stream, pool,
         std::move(context));
}

void history::out_of_memory(c10::DeviceIndex device, std::size_t free, std::size_t bytes, cudaStream_t stream) {
  if (!on()) return;
  const std::lock_guard lock(mutex_);
  record(TraceEntry::OOM, device, free, bytes, stream, c10::MempoolId_t{0, 0}, nullptr);
}

std::shared_ptr<c10::GatheredContext> history::context_of(void* ptr) const {
  const std::lock_guard lock(mutex_);
  const auto it = contexts_.find(ptr);
  return it == contexts_.end() ? nullptr : it->second;
}

std::vector<std::vector<history::TraceEntry>> history::traces() const {
  const std::lock_guard lock(mutex_);
  std::vector<std::vector<TraceEntry>> out;
  for (const auto& t : traces_) out.emplace_back(t.begin(), t.end());
  return out;
}

// Under mutex_.
void history::record(TraceEntry::Action action, c10::DeviceIndex device, std::size_t addr, std::size_t bytes,
                     cudaStream_t stream, c10::MempoolId_t pool, std::shared_ptr<c10::GatheredContext> context) {
  if (skip_.count(action) != 0) return;
  while (static_cast<std::size_t>(device) >= traces_.size()) traces_.emplace_back();
  auto& trace = traces_[static_cast<std::size_t>(device)];
  if (when_ != RecordContext::ALL && action != TraceEntry::ALLOC) {
    context = nullptr;  // stacks of frees only with context="all"
  }
  trace.emplace_back(action, device, addr, bytes, stream, pool, c10::getApproximateTime(), std::move(context));
  for (const auto& tracker : trackers_) tracker(trace.back());
  while (trace.size() > max_entries_) trace.pop_front();
}

}  // namespace fragctl_torch
