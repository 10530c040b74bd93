// Memory pools of other libraries: torch.cuda.MemPool(allocator=X), where X
// is another CUDAAllocator (a CUDAPluggableAllocator: the NCCL backend's
// mem_allocator over ncclMemAlloc for zero-copy collectives, vLLM's
// CuMemAllocator). Allocations inside such a pool are forwarded to X; its
// blocks stay X's memory: fragctl reports their bytes (forwarded_bytes) but
// does not count them as its own reserved memory.
//
// As PyTorch's allocator does, a pool keeps the blocks its tensors freed and
// serves later requests of the pool from them (X's allocations are slow, and
// NCCL registers each one); a block is never split. A kept block serves its
// allocation stream at once and another stream once the work queued on the
// streams that used it (record_stream) is done (CUDA events recorded at the
// free). The blocks go back to X (X->raw_delete) as PyTorch's do: when the
// pool has no user left (the MemPool was destroyed, releasePool) and
// empty_cache is called for it or for all pools (MemPool's destructor does
// that), or when a tensor of such a pool is freed afterwards. Each block
// from X is a segment of the snapshot and of the trace trackers
// (SEGMENT_ALLOC after X allocated it, SEGMENT_FREE before it goes back), so
// ProcessGroupNCCL's register_mem_pool registers it.
//
// During CUDA graph capture (torch.cuda.graph(pool=MemPool(allocator=X).id)),
// as PyTorch's allocator does for its private pools: no event is recorded on
// a capturing stream (it would become a node of the graph, and querying it
// is illegal). A block freed while its allocation stream or a stream of its
// record_stream captures is kept *deferred*: later allocations of the pool on
// its allocation stream (the capture's stream order) take it at once, no
// other stream does; its events are recorded once none of its streams
// captures any more (the capture ended: at endAllocateToPool, or at the
// pool's next allocation, free or empty_cache), and from then on it is an
// ordinary kept block. A deferred block never goes back to X. Kept blocks'
// events (recorded before the capture) are queried in relaxed capture mode,
// and X allocates in relaxed mode (as PyTorch's cudaMallocMaybeCapturing);
// during a capture a refusal of X does not make the pool give its kept
// blocks back (that waits on events).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <c10/cuda/CUDACachingAllocator.h>

namespace fragctl_torch {

/// What forwarding_pools reports of a block of X: its segment appeared or is about to go.
using segment_event = std::function<void(bool allocated, c10::DeviceIndex device, void* ptr, std::size_t bytes,
                                         cudaStream_t stream, c10::MempoolId_t pool)>;

/// The bytes in the forwarding pools of one device.
struct forwarded_usage {
  std::size_t pools = 0;
  std::size_t live_bytes = 0;    ///< requested bytes of live tensors
  std::size_t held_bytes = 0;    ///< bytes of X's blocks held (live and kept)
  std::size_t cached_bytes = 0;  ///< bytes of blocks kept for reuse
  std::size_t blocks = 0;
};

class forwarding_pools {
 public:
  explicit forwarding_pools(segment_event on_segment) : on_segment_(std::move(on_segment)) {}

  /// createOrIncrefPool with an allocator of its own: one user more of pool `id`.
  void add_user(c10::DeviceIndex device, c10::MempoolId_t id,
                std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> allocator);
  /// Whether `id` is a forwarding pool.
  [[nodiscard]] bool has(c10::MempoolId_t id);
  /// One user fewer; false when `id` is not a forwarding pool.
  bool release(c10::DeviceIndex device, c10::MempoolId_t id);
  /// The pool's use count, or nullopt when `id` is not a forwarding pool.
  [[nodiscard]] std::optional<int> use_count(c10::MempoolId_t id);

  /// use_mem_pool / beginAllocateToPool: allocations on `device` whose
  /// stream passes `filter` go to pool `id`. False when `id` is not ours.
  bool begin(c10::DeviceIndex device, c10::MempoolId_t id, std::function<bool(cudaStream_t)> filter);
  bool end(c10::DeviceIndex device, c10::MempoolId_t id);
  [[nodiscard]] bool active() const noexcept { return active_.load(std::memory_order_acquire); }
  /// The pool an allocation on (device, stream) goes to, if any.
  [[nodiscard]] std::optional<c10::MempoolId_t> target(c10::DeviceIndex device, cudaStream_t stream);

  /// A block of at least `bytes` from pool `id` for `stream`: a kept one,
  /// else a new one from X (after giving the pool's kept blocks back to X
  /// when X refuses). nullptr when X has no memory.
  void* allocate(c10::MempoolId_t id, std::size_t bytes, cudaStream_t stream);
  /// Who holds live block `ptr`: its pool, device, request size and stream.
  struct owner {
    c10::MempoolId_t pool;
    c10::DeviceIndex device;
    std::size_t bytes;
    cudaStream_t stream;
  };
  [[nodiscard]] std::optional<owner> owner_of(void* ptr);
  /// Frees live block `ptr` into its pool (or back to X when the pool has
  /// no user left). False when `ptr` is not a live block of these pools.
  bool free(void* ptr);
  /// record_stream of a live block; false when `ptr` is not one.
  bool record_stream(void* ptr, cudaStream_t stream);
  /// empty_cache: gives the kept blocks of pools without users back to X
  /// (all such pools for {0, 0}, else pool `id` only), and forgets a pool
  /// without users and blocks.
  void empty(c10::MempoolId_t id);

  [[nodiscard]] forwarded_usage usage(c10::DeviceIndex device);
  /// One segment per block of X, of pool `id` (all pools for {0, 0}).
  [[nodiscard]] std::vector<c10::CachingDeviceAllocator::SegmentInfo> segments(c10::MempoolId_t id);
  [[nodiscard]] bool live_blocks_are(c10::MempoolId_t id, const std::unordered_set<void*>& expected);

 private:
  struct block {
    void* ptr = nullptr;
    std::size_t size = 0;       // X's allocation
    std::size_t requested = 0;  // the live tensor's request
    cudaStream_t stream = nullptr;
    c10::MempoolId_t pool{0, 0};
    c10::DeviceIndex device = 0;
    bool live = false;
    std::int32_t serial = 0;            // allocation order (snapshot's registration_counter)
    std::vector<cudaStream_t> used_on;  // record_stream's streams while live (and while deferred)
    std::vector<cudaEvent_t> events;    // recorded at the free: on `stream` and on used_on
    bool other_streams = false;         // events include other streams than `stream`
    bool deferred = false;              // freed during a capture: events not recorded yet
  };
  struct pool {
    c10::DeviceIndex device = 0;
    std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> allocator;
    int use_count = 0;
  };
  struct capture {
    c10::DeviceIndex device;
    c10::MempoolId_t id;
    std::function<bool(cudaStream_t)> filter;
  };
  struct id_hash {
    std::size_t operator()(const c10::MempoolId_t& id) const noexcept {
      return std::hash<std::uint64_t>()(id.first) ^ (std::hash<std::uint64_t>()(id.second) << 1);
    }
  };

  // Pool `id` (nullptr if it is not ours), checked to be of `device` (under mutex_).
  pool* find_on(c10::MempoolId_t id, c10::DeviceIndex device, const char* what);
  static bool ready(const block& b, cudaStream_t stream);
  // Whether b's allocation stream or a stream of its used_on captures now.
  static bool captures(const block& b);
  // Records the end-of-use events of freed block `b` on its streams and forgets used_on.
  static void record_events(block& b);
  // Records the events of deferred blocks none of whose streams captures now (under mutex_).
  void record_deferred();
  // Takes the kept blocks of the pools chosen by `which` out of the table (under mutex_).
  std::vector<block> take_kept(const std::function<bool(c10::MempoolId_t, const pool&)>& which);
  // Waits for their events and gives them back to X (without mutex_).
  void give_back(std::vector<block> blocks);
  void forget_idle_pools();  // under mutex_

  segment_event on_segment_;
  std::mutex mutex_;
  std::unordered_map<c10::MempoolId_t, pool, id_hash> pools_;
  std::unordered_map<void*, block> blocks_;
  std::vector<capture> captures_;
  std::atomic<bool> active_{false};
  std::atomic<bool> any_{false};
  std::int32_t serial_ = 0;
  std::size_t deferred_ = 0;  // blocks with deferred set
};

}  // namespace fragctl_torch
