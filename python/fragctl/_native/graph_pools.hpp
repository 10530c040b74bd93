// CUDA graph private pools (torch.cuda.graph, torch.compile's CUDA graph
// trees) as PyTorch's allocator interface sees them: one fragctl allocator of
// policy "graph_pool:caching" per pool id (docs/policies/graph_pool.md), on
// the backend and with the options of the process-default allocators, which
// keeps the pool's memory, its freed blocks and its live blocks, and counts
// them in its own statistics. This file keeps what PyTorch's interface adds:
// which pool a capture allocates into, the pools' use counts, and pool
// checkpoints (getCheckpointState / setCheckpointPoolState).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <c10/cuda/CUDACachingAllocator.h>

#include "fragctl/fragctl.h"

namespace fragctl_torch {

/// Where a live block lives: its allocator, device, graph pool ({0, 0} for
/// the device's default allocator), request size and allocation stream.
struct block_owner {
  fragctl_allocator* allocator = nullptr;
  c10::DeviceIndex device = 0;
  c10::MempoolId_t pool{0, 0};
  std::size_t bytes = 0;
  cudaStream_t stream = nullptr;
};

/// A graph pool's allocator and where it belongs.
struct pool_ref {
  fragctl_allocator* allocator = nullptr;
  c10::DeviceIndex device = 0;
  c10::MempoolId_t id{0, 0};
};

/// What getCheckpointState hands out: the pool's live blocks at that moment.
struct pool_checkpoint : c10::cuda::CUDACachingAllocator::AllocatorState {
  c10::DeviceIndex device = 0;
  c10::MempoolId_t id{0, 0};
  std::vector<void*> live;
};

class graph_pools {
 public:
  /// How later pools are made: `options` (FRAGCTL_CONF text, "" for none)
  /// and `backend` ("" for auto), from the process-default allocators'
  /// configuration (fragctl.torch.enable's; fragctl/torch/_pools.py,
  /// native_pool_configuration, says which keys). A pool's policy is its
  /// kind's: graph_pool:caching, or arena for a region. Thread-safe.
  void configure(std::string options, std::string backend);

  /// True while some capture allocates into a pool.
  [[nodiscard]] bool capturing() const noexcept { return capturing_.load(std::memory_order_acquire); }

  void begin_capture(c10::DeviceIndex device, c10::MempoolId_t id, std::function<bool(cudaStream_t)> filter);
  void end_capture(c10::DeviceIndex device, c10::MempoolId_t id);
  /// One user fewer (releasePool); the pool is destroyed once it has neither users nor live blocks.
  void release(c10::DeviceIndex device, c10::MempoolId_t id);
  void add_user(c10::DeviceIndex device, c10::MempoolId_t id);
  [[nodiscard]] int use_count(c10::MempoolId_t id);
  /// Whether pool `id` serves, as a last resort, allocations outside any
  /// pool that the device's own allocator could not (MemPool(use_on_oom=True);
  /// PyTorch sets it back to false before releasing the pool).
  void set_use_on_oom(c10::DeviceIndex device, c10::MempoolId_t id, bool use_on_oom);
  /// The pools of `device` that serve allocations the device's allocator refused.
  [[nodiscard]] std::vector<pool_ref> use_on_oom_pools(c10::DeviceIndex device);

  /// Makes the next pool this thread creates a *region* named `tag`
  /// (fragctl.torch.region): an `arena` allocator that can pause and resume,
  /// instead of a graph_pool one. An empty tag disarms.
  static void arm_region(std::string tag);
  /// The allocator of region `tag` on `device`, or nullptr.
  [[nodiscard]] fragctl_allocator* region_allocator(const std::string& tag, c10::DeviceIndex device);

  /// The pool an allocation on (device, stream) goes to while a capture runs.
  [[nodiscard]] std::optional<pool_ref> capturing_pool(c10::DeviceIndex device, cudaStream_t stream);
  /// The pool whose live block `ptr` is, with the block's size and stream.
  [[nodiscard]] std::optional<block_owner> owner_of(void* ptr);
  /// Destroys pool `id` if it has neither users nor live blocks (after a free into it).
  void retire_if_unused(c10::MempoolId_t id);

  /// Called with each pool's allocator after it is created (true) and after
  /// it is destroyed (false), for the span watch (trace_trackers.hpp).
  void on_allocator(std::function<void(fragctl_allocator*, c10::DeviceIndex, c10::MempoolId_t, bool)> hook) {
    on_allocator_ = std::move(hook);
  }

  /// The pools of `device` (every pool for -1), of `id` only unless it is {0, 0}.
  [[nodiscard]] std::vector<pool_ref> pools(c10::DeviceIndex device, c10::MempoolId_t id = {0, 0});

  [[nodiscard]] bool live_blocks_are(c10::DeviceIndex device, c10::MempoolId_t id,
                                     const std::unordered_set<void*>& expected);
  [[nodiscard]] std::shared_ptr<pool_checkpoint> checkpoint(c10::DeviceIndex device, c10::MempoolId_t id);
  /// Frees the blocks live now and not in `state` into the pool, and makes
  /// those of `state` live again at their addresses; `deleter` is the
  /// DataPtr deleter of the reclaimed ones.
  [[nodiscard]] c10::cuda::CUDACachingAllocator::CheckpointDelta restore(const pool_checkpoint& state,
                                                                        c10::DeleterFnPtr deleter);

 private:
  struct id_hash {
    std::size_t operator()(const c10::MempoolId_t& id) const noexcept {
      return std::hash<std::uint64_t>()(id.first) ^ (std::hash<std::uint64_t>()(id.second) << 1);
    }
  };
  struct pool {
    pool_ref ref;
    int use_count = 0;
    bool use_on_oom = false;
    std::string region;  // fragctl.torch.region's tag; empty for a graph or MemPool pool
  };
  struct capture {
    c10::DeviceIndex device;
    c10::MempoolId_t id;
    std::function<bool(cudaStream_t)> filter;
  };

  pool& pool_of(c10::DeviceIndex device, c10::MempoolId_t id);  // under mutex_
  void retire_locked(c10::MempoolId_t id);                        // under mutex_

  std::function<void(fragctl_allocator*, c10::DeviceIndex, c10::MempoolId_t, bool)> on_allocator_;
  std::mutex mutex_;
  std::unordered_map<c10::MempoolId_t, pool, id_hash> pools_;
  std::vector<capture> captures_;
  std::string options_;  // configure
  std::string backend_;
  std::atomic<bool> capturing_{false};
  std::atomic<bool> any_{false};  // a pool exists: frees look here first
};

/// The live blocks of a fragctl allocator, from its memory map: address ->
/// request size.
[[nodiscard]] std::unordered_map<void*, std::size_t> live_blocks(fragctl_allocator* allocator);

}  // namespace fragctl_torch
