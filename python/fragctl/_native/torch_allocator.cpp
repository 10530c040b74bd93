// fragctl behind PyTorch's whole CUDA allocator interface
// (c10::cuda::CUDACachingAllocator::CUDAAllocator), so that everything a
// PyTorch program asks of its allocator is answered by fragctl:
// memory_stats() and friends, empty_cache, set_per_process_memory_fraction,
// Tensor.record_stream, CUDA graph pools (torch.cuda.graph and
// torch.compile's CUDA graph trees), cacheInfo (cudnn.benchmark) and
// memory_viz snapshots. Built against the user's torch by fragctl.torch on
// first use (torch.utils.cpp_extension) and cached; docs/pytorch.md.
//
// It talks to libfragctl.so through the C API only (fragctl/fragctl.h),
// resolved with dlsym from the copy the Python package already loaded, so
// there is one set of process-default allocators whichever way memory is
// reached (this module, the pluggable route, fragctl.stats()).
//
// What lives where:
//  * fragctl keeps the memory: the process-default allocator of each device
//    for ordinary tensors; one allocator per graph pool ("caching" with
//    release_on_oom off, so a pool never gives memory back while graphs may
//    replay into it). record_stream is fragctl's (fragctl_record_stream):
//    a freed block waits for every stream that used it.
//  * this file keeps what PyTorch's interface needs and fragctl's C API does
//    not: the size and stream of each live pointer (PyTorch frees by pointer
//    alone), the graph pools' bookkeeping and free lists (a pool's freed
//    blocks stay in the pool, reusable by later captures into it and
//    restorable by setCheckpointPoolState), PyTorch-shaped statistics with
//    their accumulated-stat baselines, and the allocation history of
//    _record_memory_history.
//
// Locking: one mutex guards this file's tables; fragctl calls on the
// ordinary path are made outside it (fragctl's allocators are thread-safe).
#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/flat_hash_map.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "fragctl/fragctl.h"

namespace fragctl_torch {

namespace cca = c10::cuda::CUDACachingAllocator;
using c10::CachingDeviceAllocator::BlockInfo;
using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::SegmentInfo;
using c10::CachingDeviceAllocator::Stat;
using c10::CachingDeviceAllocator::StatType;
using c10::CachingDeviceAllocator::TraceEntry;

// --- The C API, resolved from the loaded libfragctl -----------------------------

struct c_api {
#define FRAGCTL_FN(name) decltype(&::name) name = nullptr
  FRAGCTL_FN(fragctl_default_allocator);
  FRAGCTL_FN(fragctl_create);
  FRAGCTL_FN(fragctl_destroy);
  FRAGCTL_FN(fragctl_malloc);
  FRAGCTL_FN(fragctl_free);
  FRAGCTL_FN(fragctl_record_stream);
  FRAGCTL_FN(fragctl_release_cached);
  FRAGCTL_FN(fragctl_get_counters);
  FRAGCTL_FN(fragctl_reset_peaks);
  FRAGCTL_FN(fragctl_set_limit);
  FRAGCTL_FN(fragctl_memory_map);
  FRAGCTL_FN(fragctl_policy);
  FRAGCTL_FN(fragctl_last_error);
#undef FRAGCTL_FN

  void load(const std::string& path) {
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
    if (handle == nullptr) handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    TORCH_CHECK(handle != nullptr, "fragctl: cannot load ", path, ": ", dlerror());
    auto resolve = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
      TORCH_CHECK(fn != nullptr, "fragctl: ", path, " has no ", name,
                  " (a libfragctl.so older than this package?)");
    };
#define FRAGCTL_RESOLVE(name) resolve(name, #name)
    FRAGCTL_RESOLVE(fragctl_default_allocator);
    FRAGCTL_RESOLVE(fragctl_create);
    FRAGCTL_RESOLVE(fragctl_destroy);
    FRAGCTL_RESOLVE(fragctl_malloc);
    FRAGCTL_RESOLVE(fragctl_free);
    FRAGCTL_RESOLVE(fragctl_record_stream);
    FRAGCTL_RESOLVE(fragctl_release_cached);
    FRAGCTL_RESOLVE(fragctl_get_counters);
    FRAGCTL_RESOLVE(fragctl_reset_peaks);
    FRAGCTL_RESOLVE(fragctl_set_limit);
    FRAGCTL_RESOLVE(fragctl_memory_map);
    FRAGCTL_RESOLVE(fragctl_policy);
    FRAGCTL_RESOLVE(fragctl_last_error);
#undef FRAGCTL_RESOLVE
  }
};

c_api api;

void check(fragctl_status status, const char* what) {
  TORCH_CHECK(status == FRAGCTL_OK, "fragctl: ", what, ": ", api.fragctl_last_error());
}

fragctl_counters counters_of(fragctl_allocator* a) {
  fragctl_counters c{};
  c.struct_size = sizeof c;
  check(api.fragctl_get_counters(a, &c), "statistics");
  return c;
}

// --- Graph pools -------------------------------------------------------------------

struct mempool_hash {
  std::size_t operator()(const c10::MempoolId_t& id) const noexcept {
    return std::hash<std::uint64_t>()(id.first) ^ (std::hash<std::uint64_t>()(id.second) << 1);
  }
};

struct pool {
  c10::DeviceIndex device = 0;
  c10::MempoolId_t id{0, 0};
  fragctl_allocator* allocator = nullptr;
  int use_count = 0;
  std::unordered_set<void*> live;
  // Freed blocks, kept in the pool: size -> (pointer, stream), newest last.
  std::multimap<std::size_t, std::pair<void*, cudaStream_t>> free_blocks;
};

using pool_map = std::unordered_map<c10::MempoolId_t, std::unique_ptr<pool>, mempool_hash>;

struct block {
  std::size_t size = 0;
  cudaStream_t stream = nullptr;
  c10::DeviceIndex device = 0;
  pool* owner = nullptr;  // nullptr: the device's default allocator
  bool used_elsewhere = false;
  std::shared_ptr<c10::GatheredContext> context;
};

// What getCheckpointState hands out: the pool's live blocks at that moment.
struct checkpoint_state : cca::AllocatorState {
  c10::DeviceIndex device = 0;
  c10::MempoolId_t id{0, 0};
  std::vector<std::pair<void*, block>> live;
};

void raw_delete_fn(void* ptr);

class allocator final : public cca::CUDAAllocator {
 public:
  // --- allocation ---------------------------------------------------------------
  c10::DataPtr allocate(size_t bytes) override {
    const c10::DeviceIndex device = c10::cuda::current_device();
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
    void* ptr = allocate_on(bytes, device, stream);
    return {ptr, ptr, &raw_delete_fn, c10::Device(c10::DeviceType::CUDA, device)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &raw_delete_fn; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }
  void* raw_alloc(size_t bytes) override {
    const c10::DeviceIndex device = c10::cuda::current_device();
    return allocate_on(bytes, device, c10::cuda::getCurrentCUDAStream(device).stream());
  }
  void* raw_alloc_with_stream(size_t bytes, cudaStream_t stream) override {
    return allocate_on(bytes, c10::cuda::current_device(), stream);
  }
  void raw_delete(void* ptr) override { free(ptr); }

  void init(int device_count) override {
    const std::lock_guard lock(mutex_);
    if (device_count_ < device_count) {
      device_count_ = device_count;
      baselines_.resize(static_cast<std::size_t>(device_count));
      traces_.resize(static_cast<std::size_t>(device_count));
    }
    initialized_ = true;
  }
  bool initialized() override { return initialized_; }
  void enable(bool value) override { enabled_ = value; }
  bool isEnabled() const override { return enabled_; }

  // --- cap, cache, statistics -------------------------------------------------------
  double getMemoryFraction(c10::DeviceIndex device) override {
    const fragctl_counters c = counters_of(default_allocator(device));
    return c.limit == 0 ? 1.0 : static_cast<double>(c.limit) / static_cast<double>(device_total(device));
  }
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    TORCH_CHECK(fraction >= 0 && fraction <= 1, "invalid fraction ", fraction, ": it must be in [0, 1]");
    const auto cap = static_cast<std::size_t>(fraction * static_cast<double>(device_total(device)));
    // PyTorch's cap 1.0 is "no cap"; fragctl's 0 is.
    check(api.fragctl_set_limit(default_allocator(device), fraction >= 1.0 ? 0 : std::max<std::size_t>(cap, 1)),
          "set_per_process_memory_fraction");
  }
  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex) override { return {}; }

  void emptyCache(c10::MempoolId_t id) override {
    std::vector<fragctl_allocator*> targets;
    {
      const std::lock_guard lock(mutex_);
      if (id == c10::MempoolId_t{0, 0}) targets = defaults();
      // A pool's memory stays while graphs may replay into it (releasePool).
    }
    for (fragctl_allocator* a : targets) check(api.fragctl_release_cached(a), "empty_cache");
  }

  void cacheInfo(c10::DeviceIndex device, size_t* largest_block) override {
    *largest_block = counters_of(default_allocator(device)).largest_free_block;
  }

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    std::vector<fragctl_counters> all{counters_of(default_allocator(device))};
    fragctl_counters base{};
    std::int64_t pool_cached = 0;
    {
      const std::lock_guard lock(mutex_);
      for (const auto& [id, p] : pools_) {
        if (p->device == device) {
          all.push_back(counters_of(p->allocator));
          for (const auto& f : p->free_blocks) pool_cached += static_cast<std::int64_t>(f.first);
        }
      }
      if (static_cast<std::size_t>(device) < baselines_.size()) base = baselines_[static_cast<std::size_t>(device)];
    }
    fragctl_counters sum{};
    for (const fragctl_counters& c : all) {
      sum.requested += c.requested;
      sum.requested_window_peak += c.requested_window_peak;
      sum.requested_total += c.requested_total;
      sum.requested_freed_total += c.requested_freed_total;
      sum.allocated += c.allocated;
      sum.allocated_window_peak += c.allocated_window_peak;
      sum.allocated_total += c.allocated_total;
      sum.allocated_freed_total += c.allocated_freed_total;
      sum.reserved += c.reserved;
      sum.reserved_window_peak += c.reserved_window_peak;
      sum.reserved_total += c.reserved_total;
      sum.reserved_freed_total += c.reserved_freed_total;
      sum.allocations += c.allocations;
      sum.frees += c.frees;
      sum.live_blocks_window_peak += c.live_blocks_window_peak;
      sum.ooms += c.ooms;
      sum.retries += c.retries;
      sum.device_allocations += c.device_allocations;
      sum.device_frees += c.device_frees;
      sum.segments += c.segments;
    }
    auto i64 = [](std::uint64_t v) { return static_cast<std::int64_t>(v); };
    // Blocks kept in a graph pool's free list are allocated to fragctl but
    // free to PyTorch: count them as cached, not allocated.
    const std::int64_t allocated = i64(sum.allocated) - pool_cached;
    DeviceStats s;
    auto fill = [](c10::CachingDeviceAllocator::StatArray& a, Stat st) {
      a[static_cast<std::size_t>(StatType::AGGREGATE)] = st;
      a[static_cast<std::size_t>(StatType::LARGE_POOL)] = st;  // fragctl has no small pool of PyTorch's kind
    };
    const Stat blocks{i64(sum.allocations - sum.frees), i64(sum.live_blocks_window_peak),
                      i64(sum.allocations - base.allocations), i64(sum.frees - base.frees)};
    fill(s.allocation, blocks);
    fill(s.active, blocks);
    fill(s.segment, {i64(sum.segments), i64(sum.segments), i64(sum.device_allocations - base.device_allocations),
                     i64(sum.device_frees - base.device_frees)});
    const Stat allocated_bytes{allocated, std::max(allocated, i64(sum.allocated_window_peak)),
                               i64(sum.allocated_total - base.allocated_total),
                               i64(sum.allocated_freed_total - base.allocated_freed_total)};
    fill(s.allocated_bytes, allocated_bytes);
    fill(s.active_bytes, allocated_bytes);
    fill(s.requested_bytes, {i64(sum.requested), i64(sum.requested_window_peak),
                             i64(sum.requested_total - base.requested_total),
                             i64(sum.requested_freed_total - base.requested_freed_total)});
    fill(s.reserved_bytes, {i64(sum.reserved), i64(sum.reserved_window_peak),
                            i64(sum.reserved_total - base.reserved_total),
                            i64(sum.reserved_freed_total - base.reserved_freed_total)});
    const std::int64_t cached = std::max<std::int64_t>(0, i64(sum.reserved) - allocated);
    fill(s.inactive_split_bytes, {cached, cached, 0, 0});
    s.num_alloc_retries = i64(sum.retries - base.retries);
    s.num_ooms = i64(sum.ooms - base.ooms);
    s.num_device_alloc = i64(sum.device_allocations - base.device_allocations);
    s.num_device_free = i64(sum.device_frees - base.device_frees);
    return s;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    const fragctl_counters c = counters_of(default_allocator(device));
    const std::lock_guard lock(mutex_);
    if (static_cast<std::size_t>(device) >= baselines_.size()) baselines_.resize(static_cast<std::size_t>(device) + 1);
    baselines_[static_cast<std::size_t>(device)] = c;
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    check(api.fragctl_reset_peaks(default_allocator(device)), "reset_peak_memory_stats");
    const std::lock_guard lock(mutex_);
    for (const auto& [id, p] : pools_) {
      if (p->device == device) check(api.fragctl_reset_peaks(p->allocator), "reset_peak_memory_stats");
    }
  }

  // --- streams ------------------------------------------------------------------------
  void recordStream(const c10::DataPtr& data, c10::cuda::CUDAStream stream) override {
    void* ptr = data.get();
    if (ptr == nullptr || data.get_deleter() != &raw_delete_fn) return;
    fragctl_allocator* target = nullptr;
    {
      const std::lock_guard lock(mutex_);
      const auto it = blocks_.find(ptr);
      TORCH_CHECK(it != blocks_.end(), "fragctl: record_stream of ", ptr, ", which is not a live tensor");
      if (it->second.stream == stream.stream()) return;
      it->second.used_elsewhere = true;
      target = it->second.owner != nullptr ? it->second.owner->allocator : default_allocator(it->second.device);
    }
    check(api.fragctl_record_stream(target, ptr, stream.stream()), "record_stream");
  }

  // --- graph pools ---------------------------------------------------------------------
  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t id,
                           std::function<bool(cudaStream_t)> filter) override {
    const std::lock_guard lock(mutex_);
    pool& p = pool_of(device, id);
    ++p.use_count;
    captures_.push_back({device, id, std::move(filter)});
    capturing_.store(true, std::memory_order_release);
  }
  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t id) override {
    const std::lock_guard lock(mutex_);
    const auto it = std::find_if(captures_.begin(), captures_.end(),
                                 [&](const capture& c) { return c.device == device && c.id == id; });
    TORCH_CHECK(it != captures_.end(), "fragctl: endAllocateToPool for a pool that is not being allocated to");
    captures_.erase(it);
    capturing_.store(!captures_.empty(), std::memory_order_release);
  }
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t id) override {
    const std::lock_guard lock(mutex_);
    const auto it = pools_.find(id);
    if (it == pools_.end()) return;
    pool& p = *it->second;
    TORCH_CHECK(p.device == device, "fragctl: releasePool on device ", device, " of a pool of device ", p.device);
    if (--p.use_count <= 0) retire_if_unused(it);
  }
  int getPoolUseCount(c10::DeviceIndex, c10::MempoolId_t id) override {
    const std::lock_guard lock(mutex_);
    const auto it = pools_.find(id);
    return it == pools_.end() ? 0 : it->second->use_count;
  }
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t id,
                          std::shared_ptr<cca::CUDAAllocator> allocator) override {
    TORCH_CHECK(allocator == nullptr || allocator.get() == this,
                "fragctl: a memory pool with an allocator of its own is not supported under fragctl");
    const std::lock_guard lock(mutex_);
    ++pool_of(device, id).use_count;
  }
  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t id,
                                const std::unordered_set<void*>& expected) override {
    const std::lock_guard lock(mutex_);
    const auto it = pools_.find(id);
    if (it == pools_.end()) return expected.empty();
    TORCH_CHECK(it->second->device == device, "fragctl: pool of another device");
    return it->second->live == expected;
  }
  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device, c10::MempoolId_t id) override {
    const std::lock_guard lock(mutex_);
    auto state = std::make_shared<checkpoint_state>();
    state->device = device;
    state->id = id;
    const auto it = pools_.find(id);
    if (it != pools_.end()) {
      for (void* ptr : it->second->live) state->live.emplace_back(ptr, blocks_.at(ptr));
    }
    return state;
  }
  cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                              std::shared_ptr<cca::AllocatorState> base) override {
    auto state = std::dynamic_pointer_cast<checkpoint_state>(base);
    TORCH_CHECK(state != nullptr && state->device == device, "fragctl: a checkpoint state of another allocator");
    const std::lock_guard lock(mutex_);
    pool& p = pool_of(device, state->id);
    cca::CheckpointDelta delta;
    std::unordered_set<void*> wanted;
    for (const auto& [ptr, b] : state->live) wanted.insert(ptr);
    // Live now, not in the checkpoint: back to the pool's free list.
    for (void* ptr : std::vector<void*>(p.live.begin(), p.live.end())) {
      if (wanted.count(ptr) != 0) continue;
      const block b = blocks_.at(ptr);
      blocks_.erase(ptr);
      p.live.erase(ptr);
      p.free_blocks.emplace(b.size, std::make_pair(ptr, b.stream));
      delta.ptrs_freed.push_back(ptr);
    }
    // In the checkpoint, not live now: taken out of the free list again.
    for (const auto& [ptr, b] : state->live) {
      if (p.live.count(ptr) != 0) continue;
      auto [lo, hi] = p.free_blocks.equal_range(b.size);
      auto it = std::find_if(lo, hi, [ptr = ptr](const auto& f) { return f.second.first == ptr; });
      TORCH_CHECK(it != hi, "fragctl: cannot restore the graph pool's checkpoint: block ", ptr,
                  " was handed to another owner since (a cross-stream free inside the pool)");
      p.free_blocks.erase(it);
      p.live.insert(ptr);
      blocks_[ptr] = b;
      delta.dataptrs_allocd.emplace_back(ptr, ptr, &raw_delete_fn, c10::Device(c10::DeviceType::CUDA, device));
    }
    return delta;
  }

  // --- history (memory_viz) ----------------------------------------------------------
  bool isHistoryEnabled() override { return history_on_.load(std::memory_order_relaxed); }
  void recordHistory(bool enabled, c10::CachingDeviceAllocator::CreateContextFn recorder, size_t max_entries,
                     c10::CachingDeviceAllocator::RecordContext when, bool clear_history,
                     const std::vector<std::string>& skip_actions) override {
    const std::lock_guard lock(mutex_);
    recorder_ = enabled ? recorder : nullptr;
    record_when_ = when;
    max_entries_ = std::max<std::size_t>(max_entries, 1);
    skip_actions_.clear();
    for (const std::string& a : skip_actions) skip_actions_.insert(c10::CachingDeviceAllocator::parseTraceEntryAction(a));
    if (clear_history) {
      for (auto& t : traces_) t.clear();
    }
    history_on_.store(enabled, std::memory_order_relaxed);
  }
  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override {
    const std::lock_guard lock(mutex_);
    oom_observers_.push_back(std::move(observer));
  }
  void attachAllocatorTraceTracker(c10::CachingDeviceAllocator::AllocatorTraceTracker tracker) override {
    const std::lock_guard lock(mutex_);
    trackers_.push_back(std::move(tracker));
  }

  cca::SnapshotInfo snapshot(c10::MempoolId_t id, bool include_traces) override {
    std::vector<std::pair<fragctl_allocator*, const pool*>> sources;
    {
      const std::lock_guard lock(mutex_);
      if (id == c10::MempoolId_t{0, 0}) {
        for (fragctl_allocator* a : defaults()) sources.emplace_back(a, nullptr);
      }
      for (const auto& [pid, p] : pools_) {
        if (id == c10::MempoolId_t{0, 0} || id == pid) sources.emplace_back(p->allocator, p.get());
      }
    }
    cca::SnapshotInfo info;
    struct visit_context {
      allocator* self;
      const pool* owner;
      c10::DeviceIndex device;
      cca::SnapshotInfo* info;
    };
    for (const auto& [a, owner] : sources) {
      visit_context v{this, owner, owner != nullptr ? owner->device : device_of(a), &info};
      api.fragctl_memory_map(
          a,
          [](const fragctl_map_segment* segment, void* context) {
            auto& v = *static_cast<visit_context*>(context);
            v.info->segments.push_back(v.self->segment_info(*segment, v.device, v.owner));
          },
          &v);  // a policy without a layout description gives no segments
    }
    if (include_traces) {
      const std::lock_guard lock(mutex_);
      for (const auto& t : traces_) info.device_traces.emplace_back(t.begin(), t.end());
    }
    info.config_metadata.expandable_segments = true;
    info.config_metadata.last_allocator_settings = "fragctl";
    return info;
  }

  // --- what fragctl memory does not support ----------------------------------------
  void* getBaseAllocation(void* ptr, size_t* size) override {
    const std::lock_guard lock(mutex_);
    const auto it = blocks_.find(ptr);
    TORCH_CHECK(it != blocks_.end(), "fragctl: getBaseAllocation of ", ptr, ", which is not a live tensor");
    *size = it->second.size;
    return ptr;
  }
  cca::ShareableHandle shareIpcHandle(void*) override {
    TORCH_CHECK(false, "fragctl: CUDA IPC of tensors (torch.multiprocessing sharing CUDA tensors) is not "
                       "supported under fragctl.torch.enable; keep such tensors out of fragctl or run without it");
  }
  std::shared_ptr<void> getIpcDevPtr(std::string) override {
    TORCH_CHECK(false, "fragctl: opening CUDA IPC handles is not supported under fragctl.torch.enable");
  }
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override {
    c10::cuda::CUDAGuard guard(dev);
    const cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
      return;
    }
    C10_CUDA_CHECK(err);
  }
  cudaError_t memcpyAsync(void* dst, int dst_device, const void* src, int src_device, size_t count,
                          cudaStream_t stream, bool p2p_enabled) override {
    // Mapped (cuMemMap) memory needs the peer copy when peers cannot access it.
    if (p2p_enabled || dst_device == src_device) {
      return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    }
    return cudaMemcpyPeerAsync(dst, dst_device, src, src_device, count, stream);
  }
  std::string name() override { return "fragctl"; }

  // --- called from the deleter -------------------------------------------------------
  void free(void* ptr) {
    if (ptr == nullptr) return;
    block b;
    fragctl_allocator* target = nullptr;
    {
      const std::lock_guard lock(mutex_);
      const auto it = blocks_.find(ptr);
      if (it == blocks_.end()) {
        TORCH_WARN("fragctl: free of ", ptr, ", which is not a live tensor; ignored");
        return;
      }
      b = std::move(it->second);
      blocks_.erase(it);
      if (history_on_.load(std::memory_order_relaxed)) {
        record(TraceEntry::FREE_REQUESTED, b.device, ptr, b.size, b.stream, b.owner, b.context);
      }
      if (b.owner != nullptr) {
        pool& p = *b.owner;
        p.live.erase(ptr);
        if (!b.used_elsewhere) {
          // Stays in the pool: graphs may replay into it; later captures reuse it.
          p.free_blocks.emplace(b.size, std::make_pair(ptr, b.stream));
          retire_if_unused(pools_.find(p.id));
          return;
        }
        target = p.allocator;  // fragctl waits for the other streams
      } else {
        target = default_allocator(b.device);
      }
    }
    fragctl_status status;
    if (capturing_.load(std::memory_order_acquire)) {
      c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
      status = api.fragctl_free(target, ptr, b.size, b.stream);
    } else {
      status = api.fragctl_free(target, ptr, b.size, b.stream);
    }
    if (status != FRAGCTL_OK) {
      TORCH_WARN("fragctl: free of ", ptr, ": ", api.fragctl_last_error());
    }
    if (b.owner != nullptr) {
      const std::lock_guard lock(mutex_);
      retire_if_unused(pools_.find(b.owner->id));
    }
  }

 private:
  struct capture {
    c10::DeviceIndex device;
    c10::MempoolId_t id;
    std::function<bool(cudaStream_t)> filter;
  };

  static std::size_t device_total(c10::DeviceIndex device) {
    c10::cuda::CUDAGuard guard(device);
    size_t free = 0;
    size_t total = 0;
    C10_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return total;
  }

  fragctl_allocator* default_allocator(c10::DeviceIndex device) {
    TORCH_CHECK(device >= 0 && device < 64, "fragctl: device ", device, " out of range");
    fragctl_allocator* a = defaults_[static_cast<std::size_t>(device)].load(std::memory_order_acquire);
    if (a != nullptr) return a;
    check(api.fragctl_default_allocator(device, 1, &a), "allocator of the device");
    defaults_[static_cast<std::size_t>(device)].store(a, std::memory_order_release);
    return a;
  }

  // The default allocators this route has used, in device order.
  std::vector<fragctl_allocator*> defaults() const {
    std::vector<fragctl_allocator*> out;
    for (const auto& slot : defaults_) {
      if (fragctl_allocator* a = slot.load(std::memory_order_acquire)) out.push_back(a);
    }
    return out;
  }

  c10::DeviceIndex device_of(fragctl_allocator* a) {
    for (std::size_t d = 0; d < defaults_.size(); ++d) {
      if (defaults_[d].load(std::memory_order_acquire) == a) return static_cast<c10::DeviceIndex>(d);
    }
    return 0;
  }

  // The pool of `id`, created on first use. Under mutex_.
  pool& pool_of(c10::DeviceIndex device, c10::MempoolId_t id) {
    auto& slot = pools_[id];
    if (slot == nullptr) {
      auto p = std::make_unique<pool>();
      p->device = device;
      p->id = id;
      check(api.fragctl_create("caching", "release_on_oom:false", nullptr, device, &p->allocator),
            "graph pool allocator");
      slot = std::move(p);
    }
    TORCH_CHECK(slot->device == device, "fragctl: pool (", id.first, ", ", id.second, ") belongs to device ",
                slot->device, ", not ", device);
    return *slot;
  }

  // Destroys a pool nobody uses any more once its last live block is freed.
  // Under mutex_.
  void retire_if_unused(pool_map::iterator it) {
    if (it == pools_.end()) return;
    pool& p = *it->second;
    if (p.use_count > 0 || !p.live.empty()) return;
    for (const auto& [size, f] : p.free_blocks) (void)api.fragctl_free(p.allocator, f.first, size, f.second);
    (void)api.fragctl_destroy(p.allocator);
    pools_.erase(it);
  }

  // The capture that allocation on (device, stream) belongs to, or nullptr. Under mutex_.
  pool* capturing_pool(c10::DeviceIndex device, cudaStream_t stream) {
    for (const capture& c : captures_) {
      if (c.device == device && c.filter(stream)) return pools_.at(c.id).get();
    }
    return nullptr;
  }

  void* allocate_on(std::size_t bytes, c10::DeviceIndex device, cudaStream_t stream) {
    if (bytes == 0) return nullptr;
    fragctl_allocator* target = nullptr;
    pool* owner = nullptr;
    if (capturing_.load(std::memory_order_acquire)) {
      const std::lock_guard lock(mutex_);
      owner = capturing_pool(device, stream);
      if (owner != nullptr) {
        // A block freed earlier into this pool on this stream, of this size.
        auto [lo, hi] = owner->free_blocks.equal_range(bytes);
        for (auto it = lo; it != hi; ++it) {
          if (it->second.second != stream) continue;
          void* ptr = it->second.first;
          owner->free_blocks.erase(it);
          remember(ptr, bytes, device, stream, owner);
          return ptr;
        }
        target = owner->allocator;
      }
    }
    if (target == nullptr) target = default_allocator(device);
    void* ptr = nullptr;
    fragctl_status status;
    if (owner != nullptr || capturing_.load(std::memory_order_acquire)) {
      // Driver memory calls are "unsafe" while a stream captures in global
      // mode; they never touch the captured stream (as PyTorch's allocator).
      c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
      status = api.fragctl_malloc(target, &ptr, bytes, stream);
    } else {
      status = api.fragctl_malloc(target, &ptr, bytes, stream);
    }
    if (status == FRAGCTL_ERROR_OUT_OF_MEMORY) out_of_memory(bytes, device, stream);
    check(status, "allocate");
    const std::lock_guard lock(mutex_);
    remember(ptr, bytes, device, stream, owner);
    return ptr;
  }

  // Under mutex_.
  void remember(void* ptr, std::size_t bytes, c10::DeviceIndex device, cudaStream_t stream, pool* owner) {
    block b{bytes, stream, device, owner, false, nullptr};
    if (history_on_.load(std::memory_order_relaxed) && recorder_ != nullptr &&
        record_when_ != c10::CachingDeviceAllocator::RecordContext::NEVER) {
      b.context = recorder_();
    }
    if (owner != nullptr) owner->live.insert(ptr);
    if (history_on_.load(std::memory_order_relaxed)) record(TraceEntry::ALLOC, device, ptr, bytes, stream, owner, b.context);
    blocks_[ptr] = std::move(b);
  }

  [[noreturn]] void out_of_memory(std::size_t bytes, c10::DeviceIndex device, cudaStream_t stream) {
    const std::string message = api.fragctl_last_error();
    size_t free = 0;
    size_t total = 0;
    {
      c10::cuda::CUDAGuard guard(device);
      (void)cudaMemGetInfo(&free, &total);
    }
    std::vector<cca::OutOfMemoryObserver> observers;
    {
      const std::lock_guard lock(mutex_);
      if (history_on_.load(std::memory_order_relaxed)) {
        record(TraceEntry::OOM, device, reinterpret_cast<void*>(free), bytes, stream, nullptr, nullptr);
      }
      observers = oom_observers_;
    }
    const fragctl_counters c = counters_of(default_allocator(device));
    for (const auto& observer : observers) observer(device, c.allocated, total, free);
    TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory (fragctl) on device ", static_cast<int>(device),
                     ": tried to allocate ", bytes, " bytes. ", message);
  }

  // Under mutex_.
  void record(TraceEntry::Action action, c10::DeviceIndex device, void* addr, std::size_t size, cudaStream_t stream,
              const pool* owner, std::shared_ptr<c10::GatheredContext> context) {
    if (skip_actions_.count(action) != 0) return;
    while (static_cast<std::size_t>(device) >= traces_.size()) traces_.emplace_back();
    auto& trace = traces_[static_cast<std::size_t>(device)];
    if (record_when_ != c10::CachingDeviceAllocator::RecordContext::ALL && action != TraceEntry::ALLOC) {
      context = nullptr;  // stacks of frees only with context="all"
    }
    trace.emplace_back(action, device, reinterpret_cast<std::size_t>(addr), size, stream,
                       owner != nullptr ? owner->id : c10::MempoolId_t{0, 0}, c10::getApproximateTime(),
                       std::move(context));
    for (const auto& tracker : trackers_) tracker(trace.back());
    while (trace.size() > max_entries_) trace.pop_front();
  }

  SegmentInfo segment_info(const fragctl_map_segment& segment, c10::DeviceIndex device, const pool* owner) {
    SegmentInfo s;
    s.device = device;
    s.address = segment.address;
    s.total_size = segment.size;
    s.stream = segment.stream;
    s.is_large = true;
    s.is_expandable = owner == nullptr;
    if (owner != nullptr) s.owner_private_pool_id = owner->id;
    const std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < segment.block_count; ++i) {
      const fragctl_map_block& fb = segment.blocks[i];
      BlockInfo b;
      b.size = fb.size;
      const auto it = blocks_.find(reinterpret_cast<void*>(fb.address));
      // Live to fragctl but in a graph pool's free list: free to PyTorch.
      b.allocated = fb.use == 0 && it != blocks_.end();
      b.active = b.allocated || fb.use == 2;
      if (b.allocated) {
        b.requested_size = it->second.size;
        b.context_when_allocated = it->second.context;
        s.requested_size += b.requested_size;
        s.allocated_size += b.size;
      }
      if (b.active) s.active_size += b.size;
      s.blocks.push_back(std::move(b));
    }
    return s;
  }

  std::mutex mutex_;
  ska::flat_hash_map<void*, block> blocks_;  // PyTorch's own allocator uses the same table
  pool_map pools_;
  std::vector<capture> captures_;
  std::atomic<bool> capturing_{false};
  std::array<std::atomic<fragctl_allocator*>, 64> defaults_{};
  std::vector<fragctl_counters> baselines_;
  c10::DeviceIndex device_count_ = 0;
  bool initialized_ = false;
  bool enabled_ = true;

  std::atomic<bool> history_on_{false};
  c10::CachingDeviceAllocator::CreateContextFn recorder_ = nullptr;
  c10::CachingDeviceAllocator::RecordContext record_when_ = c10::CachingDeviceAllocator::RecordContext::NEVER;
  std::size_t max_entries_ = SIZE_MAX;
  std::unordered_set<TraceEntry::Action> skip_actions_;
  std::vector<std::deque<TraceEntry>> traces_;
  std::vector<cca::OutOfMemoryObserver> oom_observers_;
  std::vector<c10::CachingDeviceAllocator::AllocatorTraceTracker> trackers_;
};

std::shared_ptr<allocator>& instance() {
  static auto* a = new std::shared_ptr<allocator>();  // never destroyed: tensors outlive static destructors
  return *a;
}

void raw_delete_fn(void* ptr) { instance()->free(ptr); }

// Replays allocations through whatever allocator PyTorch has installed now
// (native, fragctl, pluggable): ops[i] >= 0 allocates slot ops[i] with
// sizes[ops[i]] bytes on the current stream, ops[i] < 0 frees slot -ops[i]-1.
// Returns the nanoseconds per operation (allocations and frees alike).
double replay(const std::vector<std::int64_t>& ops, const std::vector<std::size_t>& sizes, int repeats) {
  cca::CUDAAllocator* a = cca::get();
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  std::vector<void*> slots(sizes.size(), nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < repeats; ++r) {
    for (std::int64_t op : ops) {
      if (op >= 0) {
        slots[static_cast<std::size_t>(op)] = a->raw_alloc_with_stream(sizes[static_cast<std::size_t>(op)], stream);
      } else {
        void*& p = slots[static_cast<std::size_t>(-op - 1)];
        a->raw_delete(p);
        p = nullptr;
      }
    }
    for (void*& p : slots) {
      if (p != nullptr) a->raw_delete(p);
      p = nullptr;
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()) /
         (static_cast<double>(ops.size()) * repeats);
}

}  // namespace fragctl_torch

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "fragctl's allocator behind PyTorch's CUDAAllocator interface (fragctl.torch.enable)";
  m.def(
      "allocator",
      [](const std::string& library) -> std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> {
        auto& a = fragctl_torch::instance();
        if (a == nullptr) {
          fragctl_torch::api.load(library);
          a = std::make_shared<fragctl_torch::allocator>();
        }
        return a;
      },
      pybind11::arg("library"),
      "The allocator (created once per process) over the libfragctl.so at `library`, ready for "
      "torch.cuda.memory.change_current_allocator.");
  m.def("replay", &fragctl_torch::replay, pybind11::arg("ops"), pybind11::arg("sizes"), pybind11::arg("repeats") = 1,
        "ns per operation of an allocate/free sequence through PyTorch's current CUDA allocator (benchmarks).");
}
