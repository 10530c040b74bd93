// fragctl behind PyTorch's whole CUDA allocator interface
// (c10::cuda::CUDACachingAllocator::CUDAAllocator), so that everything a
// PyTorch program asks of its allocator is answered by fragctl:
// memory_stats() and friends, empty_cache, set_per_process_memory_fraction,
// Tensor.record_stream, CUDA graph pools (torch.cuda.graph and
// torch.compile's CUDA graph trees), cacheInfo (cudnn.benchmark) and
// memory_viz snapshots. Built against the user's torch by fragctl.torch on
// first use (torch.utils.cpp_extension) and cached; docs/pytorch.md.
//
// The rooms of the module, each with one concern:
//  * torch_allocator.cpp (this file): the CUDAAllocator subclass, forwarding
//    to the others, and the Python module;
//  * c_api.{hpp,cpp}: the C API (fragctl/fragctl.h) resolved from the
//    libfragctl.so the Python package loaded, so there is one set of
//    process-default allocators whichever way memory is reached;
//  * graph_pools.{hpp,cpp}: CUDA graph private pools, each a fragctl
//    allocator of policy graph_pool;
//  * device_stats.{hpp,cpp}: PyTorch-shaped statistics from fragctl's counters;
//  * history.{hpp,cpp}: the allocation history of _record_memory_history,
//    trace trackers and out-of-memory observers;
//  * trace_trackers.{hpp,cpp}: fragctl's physical spans as the segments
//    trace trackers see (NCCL buffer registration);
//  * forwarding_pools.{hpp,cpp}: MemPool(allocator=X), pools whose
//    allocations go to another library's allocator.

//  * ipc.{hpp,cpp}: CUDA IPC of tensors (shareIpcHandle, getIpcDevPtr).
//
// fragctl keeps the memory and every live block's size and stream: the
// process-default allocator of each device (built with block_table:true by
// fragctl.torch.enable) for ordinary tensors, a graph_pool allocator per graph
// pool. PyTorch frees by pointer alone; fragctl_block_info finds the size and
// stream. record_stream is fragctl's (fragctl_record_stream). fragctl's
// allocators are thread-safe; this module adds a lock only for its graph
// pool registry and the history.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "c_api.hpp"
#include "device_stats.hpp"
#include "forwarding_pools.hpp"
#include "graph_pools.hpp"
#include "history.hpp"
#include "trace_trackers.hpp"

#include "ipc.hpp"

namespace fragctl_torch {

namespace cca = c10::cuda::CUDACachingAllocator;
using c10::CachingDeviceAllocator::BlockInfo;
using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::SegmentInfo;

void raw_delete_fn(void* ptr);

// Runs `call` (a fragctl call that may reach the driver) so that a stream
// capturing in global mode does not fail it: driver memory calls are
// "unsafe" during such a capture and never touch the captured stream (as
// PyTorch's allocator does).
template <class Call>
fragctl_status outside_capture(bool capturing, Call&& call) {
  if (!capturing) return call();
  c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
  return call();
}

class allocator final : public cca::CUDAAllocator {
 public:
  allocator() {
    pools_.on_allocator([this](fragctl_allocator* a, c10::DeviceIndex device, c10::MempoolId_t id, bool created) {
      if (created) {
        spans_.watch(a, device, id);
      } else {
        spans_.forget(a);
        const std::lock_guard lock(mutex_);
        baselines_.erase(a);  // a later pool may get the same address
      }
    });
  }

  // --- allocation ---------------------------------------------------------------
  c10::DataPtr allocate(size_t bytes) override {
    const c10::DeviceIndex device = c10::cuda::current_device();
    void* ptr = allocate_on(bytes, device, c10::cuda::getCurrentCUDAStream(device).stream());
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
    history_.add_devices(device_count);
    initialized_ = true;
  }
  bool initialized() override { return initialized_; }
  void enable(bool value) override { enabled_ = value; }
  bool isEnabled() const override { return enabled_; }

  // --- cap, cache, statistics -------------------------------------------------------
  double getMemoryFraction(c10::DeviceIndex device) override {
    fragctl_allocator* a = default_allocator(device);
    const fragctl_counters c = counters_of(a);
    return c.limit == 0 ? 1.0 : static_cast<double>(c.limit) / static_cast<double>(memory_of(a).total);
  }
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    TORCH_CHECK(fraction >= 0 && fraction <= 1, "invalid fraction ", fraction, ": it must be in [0, 1]");
    fragctl_allocator* a = default_allocator(device);
    const auto cap = static_cast<std::size_t>(fraction * static_cast<double>(memory_of(a).total));
    // PyTorch's cap 1.0 is "no cap"; fragctl's 0 is.
    check(api.fragctl_set_limit(a, fraction >= 1.0 ? 0 : std::max<std::size_t>(cap, 1)),
          "set_per_process_memory_fraction");
  }
  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex) override { return {}; }

  void emptyCache(c10::MempoolId_t id) override {
    fwd_.empty(id);  // pools of other allocators: as PyTorch's, only those without users
    // A pool's memory stays while graphs may replay into it (releasePool).
    if (id != c10::MempoolId_t{0, 0}) return;
    for (fragctl_allocator* a : defaults()) check(api.fragctl_release_cached(a), "empty_cache");
  }

  void cacheInfo(c10::DeviceIndex device, size_t* largest_block) override {
    *largest_block = counters_of(default_allocator(device)).largest_free_block;
  }

  // The device's figures are those of its default allocator and of its
  // graph and MemPool pools summed; the totals count from each one's
  // baseline (reset_accumulated_memory_stats), a pool made since from zero.
  // (MemPool(allocator=X) pools' memory is X's and not in these figures.)
  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    const std::vector<fragctl_allocator*> sources = allocators_of(device);
    std::vector<fragctl_counters> all;
    std::vector<fragctl_counters> bases;
    for (fragctl_allocator* a : sources) all.push_back(counters_of(a));
    {
      const std::lock_guard lock(mutex_);
      for (fragctl_allocator* a : sources) {
        const auto it = baselines_.find(a);
        if (it != baselines_.end()) bases.push_back(it->second);
      }
    }
    return device_stats(sum_counters(all), sum_counters(bases));
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    for (fragctl_allocator* a : allocators_of(device)) {
      const fragctl_counters c = counters_of(a);
      const std::lock_guard lock(mutex_);
      baselines_[a] = c;
    }
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    for (fragctl_allocator* a : allocators_of(device)) check(api.fragctl_reset_peaks(a), "reset_peak_memory_stats");
  }

  // --- streams ------------------------------------------------------------------------
  void recordStream(const c10::DataPtr& data, c10::cuda::CUDAStream stream) override {
    void* ptr = data.get();
    if (ptr == nullptr || data.get_deleter() != &raw_delete_fn) return;
    if (fwd_.record_stream(ptr, stream.stream())) return;
    const std::optional<block_owner> owner = owner_of(ptr);
    TORCH_CHECK(owner.has_value(), "fragctl: record_stream of ", ptr, ", which is not a live tensor");
    if (owner->stream == stream.stream()) return;
    check(api.fragctl_record_stream(owner->allocator, ptr, stream.stream()), "record_stream");
  }

  // --- graph pools ---------------------------------------------------------------------
  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t id,
                           std::function<bool(cudaStream_t)> filter) override {
    if (fwd_.has(id)) {
      fwd_.begin(device, id, std::move(filter));
      return;
    }
    pools_.begin_capture(device, id, std::move(filter));
  }
  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t id) override {
    if (!fwd_.end(device, id)) pools_.end_capture(device, id);
  }
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t id) override {
    if (!fwd_.release(device, id)) pools_.release(device, id);
  }
  int getPoolUseCount(c10::DeviceIndex, c10::MempoolId_t id) override {
    if (const std::optional<int> n = fwd_.use_count(id)) return *n;
    return pools_.use_count(id);
  }
  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t id, bool use_on_oom) override {
    if (fwd_.has(id)) {
      TORCH_CHECK(!use_on_oom, "fragctl: use_on_oom is not supported for a memory pool with an allocator of its own");
      return;
    }
    pools_.set_use_on_oom(device, id, use_on_oom);
  }
  // MemPool(allocator=X): X other than this allocator makes a forwarding
  // pool (forwarding_pools.hpp); without one, the pool is fragctl's own.
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t id,
                          std::shared_ptr<cca::CUDAAllocator> allocator) override {
    if (allocator != nullptr && allocator.get() != this) {
      fwd_.add_user(device, id, std::move(allocator));
      return;
    }
    pools_.add_user(device, id);
  }
  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t id,
                                const std::unordered_set<void*>& expected) override {
    if (fwd_.has(id)) return fwd_.live_blocks_are(id, expected);
    return pools_.live_blocks_are(device, id, expected);
  }
  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device, c10::MempoolId_t id) override {
    return pools_.checkpoint(device, id);
  }
  cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                              std::shared_ptr<cca::AllocatorState> base) override {
    auto state = std::dynamic_pointer_cast<pool_checkpoint>(base);
    TORCH_CHECK(state != nullptr && state->device == device, "fragctl: a checkpoint state of another allocator");
    return pools_.restore(*state, &raw_delete_fn);
  }

  // --- history (memory_viz) ----------------------------------------------------------
  bool isHistoryEnabled() override { return history_.on(); }
  void recordHistory(bool enabled, c10::CachingDeviceAllocator::CreateContextFn recorder, size_t max_entries,
                     c10::CachingDeviceAllocator::RecordContext when, bool clear_history,
                     const std::vector<std::string>& skip_actions) override {
    history_.configure(enabled, recorder, max_entries, when, clear_history, skip_actions);
  }
  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override {
    history_.attach_oom_observer(std::move(observer));
  }
  void attachAllocatorTraceTracker(c10::CachingDeviceAllocator::AllocatorTraceTracker tracker) override {
    history_.attach_tracker(std::move(tracker));
  }

  cca::SnapshotInfo snapshot(c10::MempoolId_t id, bool include_traces) override {
    std::vector<std::pair<pool_ref, bool>> sources;  // (allocator, is a graph pool)
    if (id == c10::MempoolId_t{0, 0}) {
      for (std::size_t d = 0; d < defaults_.size(); ++d) {
        if (fragctl_allocator* a = defaults_[d].load(std::memory_order_acquire)) {
          sources.emplace_back(pool_ref{a, static_cast<c10::DeviceIndex>(d), {0, 0}}, false);
        }
      }
    }
    for (const pool_ref& p : pools_.pools(-1, id)) sources.emplace_back(p, true);
    cca::SnapshotInfo info;
    struct visit_context {
      allocator* self;
      const pool_ref* source;
      bool graph_pool;
      cca::SnapshotInfo* info;
    };
    // While a trace tracker listens (NCCL registration), segments are cut at
    // fragctl's span boundaries: what a communicator registers from the
    // snapshot is what a SEGMENT_FREE later takes back (trace_trackers.hpp).
    const bool by_span = history_.tracking();
    std::int32_t counter = 0;
    for (const auto& [source, graph_pool] : sources) {
      visit_context v{this, &source, graph_pool, &info};
      const std::size_t first = info.segments.size();
      api.fragctl_memory_map(
          source.allocator,
          [](const fragctl_map_segment* segment, void* context) {
            auto& v = *static_cast<visit_context*>(context);
            v.info->segments.push_back(v.self->segment_info(*segment, *v.source, v.graph_pool));
          },
          &v);  // a policy without a layout description gives no segments
      if (!by_span) {
        // register_mem_pool orders a pool's segments by registration_counter (and asserts it is set).
        for (std::size_t i = first; i < info.segments.size(); ++i) info.segments[i].registration_counter = counter++;
        continue;
      }
      std::vector<SegmentInfo> cut(info.segments.begin() + static_cast<std::ptrdiff_t>(first), info.segments.end());
      info.segments.resize(first);
      const auto spans = spans_of(source.allocator);
      for (const SegmentInfo& s : cut) {
        for (SegmentInfo& piece : split_at_spans(s, spans, counter)) info.segments.push_back(std::move(piece));
      }
    }
    for (SegmentInfo& s : fwd_.segments(id)) info.segments.push_back(std::move(s));
    if (include_traces) info.device_traces = history_.traces();
    info.config_metadata.expandable_segments = true;
    info.config_metadata.last_allocator_settings = "fragctl";
    return info;
  }

  // --- sharing, peers ------------------------------------------------------------------
  void* getBaseAllocation(void* ptr, size_t* size) override {
    if (const auto f = fwd_.owner_of(ptr)) {
      *size = f->bytes;
      return ptr;
    }
    const std::optional<block_owner> owner = owner_of(ptr);
    TORCH_CHECK(owner.has_value(), "fragctl: getBaseAllocation of ", ptr, ", which is not a live tensor");
    *size = owner->bytes;
    return ptr;
  }
  // CUDA IPC (torch.multiprocessing): the ipc room (ipc.hpp).
  cca::ShareableHandle shareIpcHandle(void* ptr) override {
    TORCH_CHECK(!fwd_.owner_of(ptr).has_value(), "fragctl: shareIpcHandle of ", ptr,
                ": the tensor lives in a MemPool whose allocator is another library's (MemPool(allocator=X)); ",
                "fragctl cannot share that library's memory with another process");
    const std::optional<block_owner> owner = owner_of(ptr);
    TORCH_CHECK(owner.has_value(), "fragctl: shareIpcHandle of ", ptr, ", which is not a live tensor");
    return ipc_.share(owner->allocator, ptr, owner->bytes);
  }
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override {
    return ipc_.open(default_allocator(c10::cuda::current_device()), handle);
  }
  // `dev` may access `dev_to_access`'s memory: the runtime's peer access
  // (cudaMalloc memory, graph pools' caching segments), then fragctl's
  // mapped spans on `dev_to_access`, now and later (fragctl_enable_peer_access).
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override {
    {
      c10::cuda::CUDAGuard guard(dev);
      const cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();
      } else {
        C10_CUDA_CHECK(err);
      }
    }
    check(api.fragctl_enable_peer_access(default_allocator(dev_to_access), dev), "enablePeerAccess");
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
    if (const auto f = fwd_.owner_of(ptr)) {
      history_.freed(f->device, ptr, f->bytes, f->stream, f->pool);
      fwd_.free(ptr);
      return;
    }
    const std::optional<block_owner> owner = owner_of(ptr);
    if (!owner) {
      TORCH_WARN("fragctl: free of ", ptr, ", which is not a live tensor; ignored");
      return;
    }
    history_.freed(owner->device, ptr, owner->bytes, owner->stream, owner->pool);
    const fragctl_status status = outside_capture(pools_.capturing(), [&] {
      return api.fragctl_free(owner->allocator, ptr, owner->bytes, owner->stream);
    });
    if (status != FRAGCTL_OK) TORCH_WARN("fragctl: free of ", ptr, ": ", api.fragctl_last_error());
    if (owner->pool != c10::MempoolId_t{0, 0}) pools_.retire_if_unused(owner->pool);
  }

  /// The bytes in pools of other allocators on `device` (MemPool(allocator=X)).
  forwarded_usage forwarded(c10::DeviceIndex device) { return fwd_.usage(device); }

  /// How later graph, MemPool and region pools are made (graph_pools::configure).
  void configure_pools(std::string options, std::string backend) {
    pools_.configure(std::move(options), std::move(backend));
  }

  /// fragctl.torch.region's allocator of `tag` on `device`, or nullptr.
  fragctl_allocator* region_allocator(const std::string& tag, c10::DeviceIndex device) {
    return pools_.region_allocator(tag, device);
  }

 private:
  fragctl_allocator* default_allocator(c10::DeviceIndex device) {
    TORCH_CHECK(device >= 0 && device < static_cast<c10::DeviceIndex>(defaults_.size()), "fragctl: device ", device,
                " out of range");
    fragctl_allocator* a = defaults_[static_cast<std::size_t>(device)].load(std::memory_order_acquire);
    if (a != nullptr) return a;
    check(api.fragctl_default_allocator(device, 1, &a), "allocator of the device");
    std::size_t bytes = 0;
    void* stream = nullptr;
    TORCH_CHECK(api.fragctl_block_info(a, nullptr, &bytes, &stream) != FRAGCTL_ERROR_STATE,
                "fragctl: the default allocator of device ", device,
                " keeps no live-block table; the native route needs block_table:true (fragctl.torch.enable sets it)");
    spans_.watch(a, device, {0, 0});
    defaults_[static_cast<std::size_t>(device)].store(a, std::memory_order_release);
    c10::DeviceIndex seen = devices_seen_.load(std::memory_order_relaxed);
    while (seen <= device && !devices_seen_.compare_exchange_weak(seen, static_cast<c10::DeviceIndex>(device + 1))) {
    }
    return a;
  }

  // The allocators whose figures are the device's: its default allocator, then its pools.
  std::vector<fragctl_allocator*> allocators_of(c10::DeviceIndex device) {
    std::vector<fragctl_allocator*> out{default_allocator(device)};
    for (const pool_ref& p : pools_.pools(device)) out.push_back(p.allocator);
    return out;
  }

  // The default allocators this route has used, in device order.
  std::vector<fragctl_allocator*> defaults() const {
    std::vector<fragctl_allocator*> out;
    for (const auto& slot : defaults_) {
      if (fragctl_allocator* a = slot.load(std::memory_order_acquire)) out.push_back(a);
    }
    return out;
  }

  // Who holds live block `ptr`: a graph pool, else a device's default allocator.
  std::optional<block_owner> owner_of(void* ptr) {
    if (auto in_pool = pools_.owner_of(ptr)) return in_pool;
    const c10::DeviceIndex devices = devices_seen_.load(std::memory_order_acquire);
    for (c10::DeviceIndex d = 0; d < devices; ++d) {
      fragctl_allocator* a = defaults_[static_cast<std::size_t>(d)].load(std::memory_order_acquire);
      if (a == nullptr) continue;
      std::size_t bytes = 0;
      void* stream = nullptr;
      if (api.fragctl_block_info(a, ptr, &bytes, &stream) == FRAGCTL_OK) {
        return block_owner{a, d, {0, 0}, bytes, static_cast<cudaStream_t>(stream)};
      }
    }
    return std::nullopt;
  }

  void* allocate_on(std::size_t bytes, c10::DeviceIndex device, cudaStream_t stream) {
    if (bytes == 0) return nullptr;
    if (fwd_.active()) {
      if (const std::optional<c10::MempoolId_t> id = fwd_.target(device, stream)) {
        void* ptr = fwd_.allocate(*id, bytes, stream);
        if (ptr == nullptr) {
          out_of_memory(bytes, device, stream, "the memory pool's own allocator has no memory for it");
        }
        history_.allocated(device, ptr, bytes, stream, *id);
        return ptr;
      }
    }
    const bool capturing = pools_.capturing();
    const std::optional<pool_ref> pool = capturing ? pools_.capturing_pool(device, stream) : std::nullopt;
    fragctl_allocator* target = pool ? pool->allocator : default_allocator(device);
    void* ptr = nullptr;
    const fragctl_status status =
        outside_capture(capturing, [&] { return api.fragctl_malloc(target, &ptr, bytes, stream); });
    if (status == FRAGCTL_ERROR_OUT_OF_MEMORY && !pool) {
      // MemPool(use_on_oom=True): a pool serves what the device's allocator could not.
      const std::string why = api.fragctl_last_error();  // the device allocator's diagnosis, for the error
      for (const pool_ref& fallback : pools_.use_on_oom_pools(device)) {
        if (api.fragctl_malloc(fallback.allocator, &ptr, bytes, stream) == FRAGCTL_OK) {
          history_.allocated(device, ptr, bytes, stream, fallback.id);
          return ptr;
        }
      }
      out_of_memory(bytes, device, stream, why);
    }
    if (status == FRAGCTL_ERROR_OUT_OF_MEMORY) out_of_memory(bytes, device, stream, api.fragctl_last_error());
    check(status, "allocate");
    history_.allocated(device, ptr, bytes, stream, pool ? pool->id : c10::MempoolId_t{0, 0});
    return ptr;
  }

  [[noreturn]] void out_of_memory(std::size_t bytes, c10::DeviceIndex device, cudaStream_t stream,
                                  const std::string& message) {
    fragctl_allocator* a = default_allocator(device);
    device_memory memory;
    (void)api.fragctl_device_memory(a, &memory.free, &memory.total);
    history_.out_of_memory(device, memory.free, bytes, stream);
    const fragctl_counters c = counters_of(a);
    for (const auto& observer : history_.oom_observers()) observer(device, c.allocated, memory.total, memory.free);
    TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory (fragctl) on device ", static_cast<int>(device),
                     ": tried to allocate ", bytes, " bytes. ", message);
  }

  SegmentInfo segment_info(const fragctl_map_segment& segment, const pool_ref& source, bool graph_pool) {
    SegmentInfo s;
    s.device = source.device;
    s.address = segment.address;
    s.total_size = segment.size;
    s.stream = static_cast<cudaStream_t>(segment.stream);
    s.is_large = true;
    s.is_expandable = !graph_pool;
    if (graph_pool) s.owner_private_pool_id = source.id;
    for (std::size_t i = 0; i < segment.block_count; ++i) {
      const fragctl_map_block& fb = segment.blocks[i];
      BlockInfo b;
      b.size = fb.size;
      b.allocated = fb.use == FRAGCTL_BLOCK_LIVE;  // a graph pool's kept blocks are FRAGCTL_BLOCK_FREE
      b.active = b.allocated || fb.use == FRAGCTL_BLOCK_PENDING;
      if (b.allocated) {
        b.requested_size = fb.requested;
        b.context_when_allocated = history_.context_of(reinterpret_cast<void*>(fb.address));
        s.requested_size += b.requested_size;
        s.allocated_size += b.size;
      }
      if (b.active) s.active_size += b.size;
      s.blocks.push_back(std::move(b));
    }
    return s;
  }

  graph_pools pools_;
  history history_;
  span_watch spans_{history_};
  forwarding_pools fwd_{[this](bool allocated, c10::DeviceIndex device, void* ptr, std::size_t bytes,
                               cudaStream_t stream, c10::MempoolId_t pool) {
    history_.segment(allocated, device, reinterpret_cast<std::size_t>(ptr), bytes, stream, pool);
  }};

  ipc_handles ipc_;
  std::array<std::atomic<fragctl_allocator*>, 64> defaults_{};
  std::atomic<c10::DeviceIndex> devices_seen_{0};  // defaults_ beyond this are empty

  std::mutex mutex_;  // baselines_
  // Each allocator's counters at the last reset_accumulated_memory_stats of its device.
  std::unordered_map<fragctl_allocator*, fragctl_counters> baselines_;
  bool initialized_ = false;
  bool enabled_ = true;
};

std::shared_ptr<allocator>& instance() {
  static auto* a = new std::shared_ptr<allocator>();  // never destroyed: tensors outlive static destructors
  return *a;
}

void raw_delete_fn(void* ptr) { instance()->free(ptr); }

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
  m.def(
      "configure_pools",
      [](std::string options, std::string backend) {
        auto& a = fragctl_torch::instance();
        TORCH_CHECK(a != nullptr, "fragctl: configure_pools before allocator()");
        a->configure_pools(std::move(options), std::move(backend));
      },
      pybind11::arg("options"), pybind11::arg("backend"),
      "Makes later graph, MemPool and region pools with `options` (FRAGCTL_CONF text, '' for none) on "
      "`backend` ('' for auto): the process-default allocators' (fragctl.torch.enable calls it).");
  m.def("arm_region", &fragctl_torch::graph_pools::arm_region, pybind11::arg("tag"),
        "Makes the next memory pool this thread creates the region `tag` (an arena that can pause); "
        "'' disarms. fragctl.torch.region calls it around torch.cuda.MemPool().");
  m.def(
      "region_allocator",
      [](const std::string& tag, int device) -> std::uintptr_t {
        auto& a = fragctl_torch::instance();
        return a == nullptr ? 0
                            : reinterpret_cast<std::uintptr_t>(
                                  a->region_allocator(tag, static_cast<c10::DeviceIndex>(device)));
      },
      pybind11::arg("tag"), pybind11::arg("device"),
      "The fragctl_allocator* of region `tag` on `device` (0 when there is none), for fragctl.torch.pause.");
  m.def(
      "forwarded",
      [](int device) -> pybind11::dict {
        pybind11::dict out;
        fragctl_torch::forwarded_usage u;
        if (auto& a = fragctl_torch::instance()) u = a->forwarded(static_cast<c10::DeviceIndex>(device));
        out["pools"] = u.pools;
        out["blocks"] = u.blocks;
        out["live_bytes"] = u.live_bytes;
        out["held_bytes"] = u.held_bytes;
        out["cached_bytes"] = u.cached_bytes;
        return out;
      },
      pybind11::arg("device"),
      "The bytes on `device` in memory pools of other allocators (MemPool(allocator=X)), for "
      "fragctl.torch.forwarded_pools.");
}
