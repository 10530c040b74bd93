// Memory pools of other libraries (forwarding_pools.hpp).
#include "forwarding_pools.hpp"

#include <algorithm>
#include <utility>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

namespace fragctl_torch {

namespace cca = c10::cuda::CUDACachingAllocator;

namespace {
constexpr std::size_t alignment = 512;
constexpr std::size_t reuse_slack = std::size_t{2} << 20;  // a kept block serves requests up to 2 MiB smaller...

std::size_t rounded(std::size_t bytes) { return (bytes + alignment - 1) / alignment * alignment; }

// ... or up to half its size: larger gaps would hold X's memory idle.
bool fits(std::size_t block, std::size_t need) { return block >= need && (block - need <= reuse_slack || block <= 2 * need); }

// Whether work queued on `stream` now goes into a graph being captured (or
// into a capture that failed and has not ended yet).
bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

// A relaxed capture mode for this thread while `on`: calls that a global
// capture forbids (event queries, X's allocation) never touch the captured stream.
class relaxed_if {
 public:
  explicit relaxed_if(bool on) {
    if (on) guard_.emplace(cudaStreamCaptureModeRelaxed);
  }

 private:
  std::optional<c10::cuda::CUDAStreamCaptureModeGuard> guard_;
};
}  // namespace

void forwarding_pools::add_user(c10::DeviceIndex device, c10::MempoolId_t id,
                                std::shared_ptr<cca::CUDAAllocator> allocator) {
  const std::lock_guard lock(mutex_);
  auto [it, created] = pools_.try_emplace(id);
  pool& p = it->second;
  if (created) {
    p.device = device;
    p.allocator = std::move(allocator);
    any_.store(true, std::memory_order_release);
  }
  TORCH_CHECK(p.device == device, "fragctl: pool (", id.first, ", ", id.second, ") belongs to device ", p.device,
              ", not ", device);
  ++p.use_count;
}

bool forwarding_pools::has(c10::MempoolId_t id) {
  if (!any_.load(std::memory_order_acquire)) return false;
  const std::lock_guard lock(mutex_);
  return pools_.count(id) != 0;
}

forwarding_pools::pool* forwarding_pools::find_on(c10::MempoolId_t id, c10::DeviceIndex device, const char* what) {
  const auto it = pools_.find(id);
  if (it == pools_.end()) return nullptr;
  TORCH_CHECK(it->second.device == device, "fragctl: ", what, " on device ", device, " of a pool of device ",
              it->second.device);
  return &it->second;
}

bool forwarding_pools::release(c10::DeviceIndex device, c10::MempoolId_t id) {
  if (!any_.load(std::memory_order_acquire)) return false;
  const std::lock_guard lock(mutex_);
  pool* p = find_on(id, device, "releasePool");
  if (p == nullptr) return false;
  if (p->use_count > 0) --p->use_count;
  return true;
}

std::optional<int> forwarding_pools::use_count(c10::MempoolId_t id) {
  if (!any_.load(std::memory_order_acquire)) return std::nullopt;
  const std::lock_guard lock(mutex_);
  const auto it = pools_.find(id);
  if (it == pools_.end()) return std::nullopt;
  return it->second.use_count;
}

bool forwarding_pools::begin(c10::DeviceIndex device, c10::MempoolId_t id, std::function<bool(cudaStream_t)> filter) {
  if (!any_.load(std::memory_order_acquire)) return false;
  const std::lock_guard lock(mutex_);
  pool* p = find_on(id, device, "use_mem_pool");
  if (p == nullptr) return false;
  ++p->use_count;  // as PyTorch's: a pool allocated to is in use
  captures_.push_back({device, id, std::move(filter)});
  active_.store(true, std::memory_order_release);
  return true;
}

bool forwarding_pools::end(c10::DeviceIndex device, c10::MempoolId_t id) {
  if (!any_.load(std::memory_order_acquire)) return false;
  const std::lock_guard lock(mutex_);
  const auto it = std::find_if(captures_.begin(), captures_.end(),
                               [&](const capture& c) { return c.device == device && c.id == id; });
  if (it == captures_.end()) return false;
  captures_.erase(it);
  active_.store(!captures_.empty(), std::memory_order_release);
  record_deferred();  // the capture has ended (PyTorch ends it before endAllocateToPool)
  return true;
}

std::optional<c10::MempoolId_t> forwarding_pools::target(c10::DeviceIndex device, cudaStream_t stream) {
  const std::lock_guard lock(mutex_);
  // The latest use_mem_pool wins, as nested `with` blocks expect.
  for (auto it = captures_.rbegin(); it != captures_.rend(); ++it) {
    if (it->device == device && it->filter(stream)) return it->id;
  }
  return std::nullopt;
}

bool forwarding_pools::ready(const block& b, cudaStream_t stream) {
  // The allocation stream's own later work is ordered after its earlier work.
  if (stream == b.stream && !b.other_streams) return true;
  if (b.deferred) return false;  // its events are not recorded yet
  for (cudaEvent_t e : b.events) {
    const cudaError_t rc = cudaEventQuery(e);
    if (rc == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    C10_CUDA_CHECK(rc);
  }
  return true;
}

void* forwarding_pools::allocate(c10::MempoolId_t id, std::size_t bytes, cudaStream_t stream) {
  const std::size_t need = rounded(bytes);
  const bool in_capture = capturing(stream);
  std::shared_ptr<cca::CUDAAllocator> x;
  c10::DeviceIndex device = 0;
  {
    const std::lock_guard lock(mutex_);
    const auto pit = pools_.find(id);
    TORCH_CHECK(pit != pools_.end(), "fragctl: allocation into pool (", id.first, ", ", id.second,
                "), which does not exist");
    x = pit->second.allocator;
    device = pit->second.device;
    record_deferred();
    const relaxed_if relaxed(in_capture);  // event queries
    block* best = nullptr;
    for (auto& [ptr, b] : blocks_) {
      if (b.live || b.pool != id || !fits(b.size, need) || (best != nullptr && b.size >= best->size)) continue;
      if (ready(b, stream)) best = &b;
    }
    if (best != nullptr) {
      for (cudaEvent_t e : best->events) C10_CUDA_CHECK(cudaEventDestroy(e));
      best->events.clear();
      best->other_streams = false;
      if (best->deferred) {  // taken back in the capture's stream order
        best->deferred = false;
        best->used_on.clear();
        --deferred_;
      }
      best->live = true;
      best->requested = bytes;
      best->stream = stream;
      return best->ptr;
    }
  }
  c10::cuda::CUDAGuard guard(device);
  void* ptr = nullptr;
  for (int attempt = 0; attempt < 2 && ptr == nullptr; ++attempt) {
    if (attempt == 1) {
      // X refused: what this pool keeps goes back to it first, as PyTorch's
      // allocator does, but not during a capture (that waits on events).
      if (in_capture) break;
      give_back(take_kept([&](c10::MempoolId_t pid, const pool&) { return pid == id; }));
    }
    try {
      const relaxed_if relaxed(in_capture);
      ptr = x->raw_alloc_with_stream(need, stream);
    } catch (const c10::OutOfMemoryError&) {
      ptr = nullptr;
    }
  }
  if (ptr == nullptr) return nullptr;
  {
    const std::lock_guard lock(mutex_);
    blocks_[ptr] = block{ptr, need, bytes, stream, id, device, /*live=*/true, serial_++, {}, {}, false, false};
  }
  on_segment_(true, device, ptr, need, stream, id);
  return ptr;
}

std::optional<forwarding_pools::owner> forwarding_pools::owner_of(void* ptr) {
  if (!any_.load(std::memory_order_acquire)) return std::nullopt;
  const std::lock_guard lock(mutex_);
  const auto it = blocks_.find(ptr);
  if (it == blocks_.end() || !it->second.live) return std::nullopt;
  return owner{it->second.pool, it->second.device, it->second.requested, it->second.stream};
}

bool forwarding_pools::record_stream(void* ptr, cudaStream_t stream) {
  if (!any_.load(std::memory_order_acquire)) return false;
  const std::lock_guard lock(mutex_);
  const auto it = blocks_.find(ptr);
  if (it == blocks_.end() || !it->second.live) return false;
  block& b = it->second;
  if (stream != b.stream && std::find(b.used_on.begin(), b.used_on.end(), stream) == b.used_on.end()) {
    b.used_on.push_back(stream);
  }
  return true;
}

bool forwarding_pools::free(void* ptr) {
  if (!any_.load(std::memory_order_acquire)) return false;
  bool retired = false;
  {
    const std::lock_guard lock(mutex_);
    const auto it = blocks_.find(ptr);
    if (it == blocks_.end() || !it->second.live) return false;
    block& b = it->second;
    record_deferred();
    b.other_streams = !b.used_on.empty();
    b.live = false;
    b.requested = 0;
    const bool in_capture = captures(b);
    if (in_capture) {
      b.deferred = true;  // as PyTorch's allocator: no event on a capturing stream
      ++deferred_;
    } else {
      record_events(b);
    }
    const auto pit = pools_.find(b.pool);
    retired = !in_capture && (pit == pools_.end() || pit->second.use_count == 0);
  }
  if (retired) {
    // The MemPool is gone: its memory goes back to X now.
    give_back(take_kept([&](c10::MempoolId_t, const pool& p) { return p.use_count == 0; }));
  }
  return true;
}

bool forwarding_pools::captures(const block& b) {
  return capturing(b.stream) || std::any_of(b.used_on.begin(), b.used_on.end(), capturing);
}

void forwarding_pools::record_events(block& b) {
  c10::cuda::CUDAGuard guard(b.device);
  // Events mark the work queued on the streams that used the block; a
  // later request on another stream waits for them.
  std::vector<cudaStream_t> streams{b.stream};
  streams.insert(streams.end(), b.used_on.begin(), b.used_on.end());
  for (cudaStream_t s : streams) {
    cudaEvent_t e = nullptr;
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    C10_CUDA_CHECK(cudaEventRecord(e, s));
    b.events.push_back(e);
  }
  b.used_on.clear();
}

void forwarding_pools::record_deferred() {
  if (deferred_ == 0) return;
  for (auto& [ptr, b] : blocks_) {
    if (!b.deferred || captures(b)) continue;
    record_events(b);
    b.deferred = false;
    --deferred_;
  }
}

std::vector<forwarding_pools::block> forwarding_pools::take_kept(
    const std::function<bool(c10::MempoolId_t, const pool&)>& which) {
  const std::lock_guard lock(mutex_);
  record_deferred();
  std::vector<block> out;
  for (auto it = blocks_.begin(); it != blocks_.end();) {
    const auto pit = pools_.find(it->second.pool);
    if (!it->second.live && !it->second.deferred && pit != pools_.end() && which(pit->first, pit->second)) {
      out.push_back(std::move(it->second));
      it = blocks_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

void forwarding_pools::give_back(std::vector<block> blocks) {
  for (block& b : blocks) {
    std::shared_ptr<cca::CUDAAllocator> x;
    {
      const std::lock_guard lock(mutex_);
      const auto pit = pools_.find(b.pool);
      if (pit != pools_.end()) x = pit->second.allocator;
    }
    c10::cuda::CUDAGuard guard(b.device);
    for (cudaEvent_t e : b.events) {
      C10_CUDA_CHECK(cudaEventSynchronize(e));
      C10_CUDA_CHECK(cudaEventDestroy(e));
    }
    on_segment_(false, b.device, b.ptr, b.size, b.stream, b.pool);  // deregistration before X frees
    if (x != nullptr) x->raw_delete(b.ptr);
  }
  const std::lock_guard lock(mutex_);
  forget_idle_pools();
}

void forwarding_pools::forget_idle_pools() {
  for (auto it = pools_.begin(); it != pools_.end();) {
    const c10::MempoolId_t id = it->first;
    const bool has_blocks =
        std::any_of(blocks_.begin(), blocks_.end(), [&](const auto& kv) { return kv.second.pool == id; });
    it = it->second.use_count == 0 && !has_blocks ? pools_.erase(it) : std::next(it);
  }
  any_.store(!pools_.empty(), std::memory_order_release);
}

void forwarding_pools::empty(c10::MempoolId_t id) {
  if (!any_.load(std::memory_order_acquire)) return;
  const bool all = id == c10::MempoolId_t{0, 0};
  give_back(take_kept([&](c10::MempoolId_t pid, const pool& p) { return p.use_count == 0 && (all || pid == id); }));
}

forwarded_usage forwarding_pools::usage(c10::DeviceIndex device) {
  forwarded_usage u;
  if (!any_.load(std::memory_order_acquire)) return u;
  const std::lock_guard lock(mutex_);
  for (const auto& [id, p] : pools_) u.pools += p.device == device ? 1 : 0;
  for (const auto& [ptr, b] : blocks_) {
    if (b.device != device) continue;
    ++u.blocks;
    u.held_bytes += b.size;
    if (b.live) {
      u.live_bytes += b.requested;
    } else {
      u.cached_bytes += b.size;
    }
  }
  return u;
}

std::vector<c10::CachingDeviceAllocator::SegmentInfo> forwarding_pools::segments(c10::MempoolId_t id) {
  std::vector<c10::CachingDeviceAllocator::SegmentInfo> out;
  if (!any_.load(std::memory_order_acquire)) return out;
  const std::lock_guard lock(mutex_);
  const bool all = id == c10::MempoolId_t{0, 0};
  std::vector<const block*> chosen;
  for (const auto& [ptr, b] : blocks_) {
    if (all || b.pool == id) chosen.push_back(&b);
  }
  std::sort(chosen.begin(), chosen.end(), [](const block* a, const block* b) { return a->serial < b->serial; });
  for (const block* b : chosen) {
    c10::CachingDeviceAllocator::SegmentInfo s;
    s.device = b->device;
    s.registration_counter = b->serial;
    s.address = reinterpret_cast<std::size_t>(b->ptr);
    s.total_size = b->size;
    s.stream = b->stream;
    s.is_large = true;
    s.owner_private_pool_id = b->pool;
    c10::CachingDeviceAllocator::BlockInfo info;
    info.size = b->size;
    info.allocated = b->live;
    info.active = b->live;
    if (b->live) {
      info.requested_size = b->requested;
      s.requested_size = b->requested;
      s.allocated_size = b->size;
      s.active_size = b->size;
    }
    s.blocks.push_back(std::move(info));
    out.push_back(std::move(s));
  }
  return out;
}

bool forwarding_pools::live_blocks_are(c10::MempoolId_t id, const std::unordered_set<void*>& expected) {
  const std::lock_guard lock(mutex_);
  std::size_t live = 0;
  for (const auto& [ptr, b] : blocks_) {
    if (b.pool != id || !b.live) continue;
    ++live;
    if (expected.count(ptr) == 0) return false;
  }
  return live == expected.size();
}

}  // namespace fragctl_torch
