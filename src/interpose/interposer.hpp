// The tested layer behind libfragctl_preload.so: what cudaMalloc, cudaFree,
// cudaMallocAsync, cudaFreeAsync, cudaMemGetInfo (and their _ptsz and HIP
// forms) do when fragctl replaces them. The preload library itself is
// nothing but one-line forwarders into an interposer (preload.cpp).
//
// Theory.
//  * Ownership. Every block the layer hands out is recorded, pointer ->
//    (size, device, stream), because the runtime's free functions carry no
//    size and fragctl's deallocate needs it. A free of a pointer not in the
//    map (nullptr included: cudaFree(0) is the idiom that initializes the
//    runtime) goes to the real function unchanged.
//  * Devices. Allocations come from the allocator of the runtime's current
//    device (cudaGetDevice), one allocator per device; frees go to the
//    allocator that made the block, whatever device is current then.
//  * Streams. cudaMallocAsync/cudaFreeAsync map straight onto fragctl's
//    stream-ordered allocate/deallocate. cudaStreamLegacy is the default
//    stream (nullptr); in the _ptsz forms stream 0 means the calling thread's
//    per-thread default stream (cudaStreamPerThread, value 2).
//  * cudaFree's guarantee. The real cudaFree synchronizes the device, so the
//    memory is unused when it returns, and cudaMalloc'ed memory may be used
//    on any stream. The layer keeps that guarantee the same way: cudaFree
//    synchronizes the block's device (cudaDeviceSynchronize, switching the
//    current device for the call if needed), then frees on the block's
//    stream, where nothing is pending any more. Freeing on the legacy
//    default stream instead would not do: the legacy stream does not wait
//    for non-blocking streams, on which the block may still be in use.
//    cudaMalloc allocates on the default stream; with nothing pending on
//    any block after cudaFree, what it gets back is safe on every stream.
//  * cudaMemGetInfo reports the real free memory plus what fragctl holds
//    in its cache for that device (reserved, not handed out): memory the
//    program could get without the device giving anything.
//  * The default memory pool. Programs that allocate with cudaMallocAsync
//    (PyTorch's cudaMallocAsync backend) read their statistics from the
//    device's default pool, which fragctl never fills. The layer remembers
//    the handle cudaDeviceGetDefaultMemPool gives for each device and
//    answers for it from fragctl's allocator of that device: reserved and
//    used memory (current; high = the resettable window peak), setting a
//    high attribute to 0 starts a new peak window (both highs), and
//    cudaMemPoolTrimTo releases fragctl's cache before the real trim. Other
//    pools and attributes go to the real functions unchanged.
//  * CUDA IPC. cudaIpcGetMemHandle reaches only what the runtime allocated
//    whole: the layer lets it through for a fragctl block at the start of a
//    plain device allocation and refuses it, with a log line, for arena
//    memory and blocks inside a segment (fragctl_export_block shares those).
//  * Peer access. cudaDeviceEnablePeerAccess(peer) lets kernels of the
//    current device reach `peer`'s memory; for cudaMalloc memory the
//    runtime's call is all it takes, but arena memory (cuMemMap) is reached
//    only by the devices its mappings grant. So after the real call
//    succeeds (or says the access was enabled already), the layer has
//    `peer`'s allocator grant the current device every span it maps now
//    and later (device_allocator::enable_peer_access), building that
//    allocator if needed. cudaDeviceDisablePeerAccess is not intercepted:
//    the allocator cannot take a grant back, and a kept grant only lets
//    the peer reach memory it was allowed to before. PyTorch's
//    cudaMallocAsync backend enables a peer with cudaMemPoolSetAccess on
//    the device's default pool instead (that pool's memory is unaffected
//    by cudaDeviceEnablePeerAccess): the layer grants the same there.
// Errors come back as the runtime's codes (interpose/runtime.hpp), with one
// log line; nothing throws.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "fragctl/allocator_stack.hpp"
#include "fragctl/device_allocator.hpp"
#include "fragctl/policy.hpp"
#include "interpose/runtime.hpp"

namespace fragctl::interpose {

/// Gives the allocator of a device. With create, builds it if needed and
/// throws (invalid_argument, backend_error) when it cannot; without, returns
/// nullptr when it does not exist.
using allocator_source = std::function<device_allocator*(int device, bool create)>;

/// Gives the allocator stack of a device if it was built (never builds,
/// never throws), for the default pool's statistics; nullptr if none.
using stack_source = std::function<allocator_stack*(int device)>;

/// Which meaning stream 0 has: the legacy default stream, or the per-thread
/// default stream (the _ptsz entry points).
enum class stream_mode : std::uint8_t { legacy, per_thread };

/// A block the layer handed out.
struct owned_block {
  std::size_t size = 0;
  int device = 0;
  void* stream = nullptr;  ///< canonical stream it was allocated on
};

/// Thread-safe: every function may be called from any thread at once.
class interposer {
 public:
  /// Without `stacks`, the memory pool functions all go to the real ones.
  interposer(const runtime_api& api, symbol_resolver resolve, bool scan_loaded_libraries,
             allocator_source allocators, stack_source stacks = {});

  /// cudaMalloc: `bytes` on the current device, usable on every stream.
  /// bytes == 0 gives *ptr = nullptr and success.
  int malloc(void** ptr, std::size_t bytes) noexcept;
  /// cudaMallocAsync: `bytes` on the current device, stream-ordered on `stream`.
  /// While `stream` captures a CUDA graph the real cudaMallocAsync serves it,
  /// so that the graph gets its allocation node (the runtime keeps that
  /// memory for the graph's replays); its frees reach the real functions as
  /// every pointer fragctl did not hand out.
  int malloc_async(void** ptr, std::size_t bytes, void* stream, stream_mode mode) noexcept;
  /// cudaFree: synchronizes the block's device, then frees it. Foreign
  /// pointers and nullptr go to the real cudaFree; a pointer into memory
  /// fragctl holds that is no live block the layer handed out (a second
  /// free of a block) never does: cudaErrorInvalidValue, one log line, as
  /// the runtime answers a double free of its own memory.
  int free(void* ptr) noexcept;
  /// cudaFreeAsync: frees stream-ordered on `stream`. Foreign pointers and
  /// nullptr go to the real function (the _ptsz one in per_thread mode);
  /// fragctl's memory that is no live block as free().
  int free_async(void* ptr, void* stream, stream_mode mode) noexcept;
  /// cudaStreamDestroy: for a stream the layer named to fragctl (an
  /// allocation or a free on it), before the real function destroys it, the
  /// allocator of each device the layer allocated on waits for its work and
  /// forgets it (device_allocator::stream_ending), and the layer's records
  /// of blocks allocated on it name the default stream: a later free, trim
  /// or wait would otherwise hand the runtime the destroyed handle, which
  /// may end the process. The wait comes first, with no lock held; the
  /// forgetting waits for frees in flight (a cudaFree between its record
  /// and its free). Unlike the real function, it returns once such a
  /// stream's work is done; any other stream goes to the real function at
  /// once (a library's stream may hold work that never ends: a collective
  /// ncclCommAbort gives up on). The real function's
  /// code is returned; a failed wait is logged (the runtime reports it
  /// too). Out of host memory while an allocator forgets (it then forgot
  /// nothing), the stream is not destroyed: cudaErrorMemoryAllocation and
  /// a log line. The default streams go to the real function unchanged.
  int stream_destroy(void* stream) noexcept;
  /// cudaMemGetInfo: the real figures, fragctl's cache of the current device
  /// counted as free (never above total).
  int mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes) noexcept;

  /// cudaDeviceGetDefaultMemPool: the real function's handle, remembered
  /// as `device`'s default pool.
  int device_get_default_mem_pool(void** pool, int device) noexcept;
  /// cudaMemPoolGetAttribute: for a default pool, the four statistics
  /// (uint64_t) from fragctl's allocator of its device (0 while it has none).
  int mem_pool_get_attribute(void* pool, int attribute, void* value) noexcept;
  /// cudaMemPoolSetAttribute: for a default pool, a high attribute set to 0
  /// starts a new peak window; other values are cudaErrorInvalidValue.
  int mem_pool_set_attribute(void* pool, int attribute, void* value) noexcept;
  /// cudaMemPoolTrimTo: for a default pool, releases fragctl's whole cache
  /// of its device (min_bytes_to_keep is the real pool's only), then trims
  /// the real pool.
  int mem_pool_trim_to(void* pool, std::size_t min_bytes_to_keep) noexcept;

  /// cudaIpcGetMemHandle: the real function for memory fragctl does not
  /// hold, and for a fragctl block that starts a plain device allocation
  /// (caching's segment); cudaErrorInvalidValue, with a log line saying
  /// why, for fragctl memory the real handle would not reach: arena memory
  /// (mapped, it has no such handle) and a block inside a larger segment
  /// (the importer would open the segment's start). fragctl_export_block
  /// shares both.
  int ipc_get_mem_handle(void* handle, void* ptr) noexcept;
  /// cudaDeviceEnablePeerAccess: the real function, then, if it succeeded
  /// or answered cudaErrorPeerAccessAlreadyEnabled, `peer`'s allocator
  /// (built if needed) grants the current device access to its memory now
  /// and later; returns the real function's code. When fragctl's grant
  /// fails: cudaErrorInvalidDevice for a peer the allocator refuses,
  /// cudaErrorMemoryAllocation when out of memory, cudaErrorUnknown else,
  /// with one log line (the runtime's access stays enabled: a later call
  /// gets cudaErrorPeerAccessAlreadyEnabled and grants again).
  /// cudaErrorInitializationError without a real function.
  int device_enable_peer_access(int peer, unsigned flags) noexcept;
  /// cudaMemPoolSetAccess: the real function, then, if it succeeded and
  /// `pool` is a device's default pool (the pool PyTorch's cudaMallocAsync
  /// backend enables peers on, instead of cudaDeviceEnablePeerAccess, and
  /// the one the layer serves instead), that device's allocator (built if
  /// needed) grants every other device the descriptors give access to,
  /// now and later. Failures as device_enable_peer_access's.
  int mem_pool_set_access(void* pool, const mem_access_desc* descs, std::size_t count) noexcept;
  /// The record of a live block, if the layer handed `ptr` out.
  [[nodiscard]] std::optional<owned_block> find(const void* ptr) const;
  /// Number of live blocks the layer handed out.
  [[nodiscard]] std::size_t owned_count() const;

  /// The stream fragctl sees for a runtime stream in `mode`.
  [[nodiscard]] static void* canonical_stream(void* stream, stream_mode mode) noexcept;

 private:
  int allocate(void** ptr, std::size_t bytes, void* stream) noexcept;
  int current_device(int& device) noexcept;
  /// `owner`'s allocator (built if needed) grants `peer` its memory, now and
  /// later: success, or the code and log line the peer-access entry points
  /// answer (`call`, the runtime function's name, heads the line).
  int grant_peer_access(int owner, int peer, std::string_view call) noexcept;
  int synchronize_device(int device) noexcept;
  int real_free(void* ptr) noexcept;
  int real_free_async(void* ptr, void* stream, stream_mode mode) noexcept;
  /// Whether `ptr` lies in memory the allocators of the devices the layer
  /// allocated on hold from their backends (a raw allocation or a mapped
  /// handle): such a pointer reaching the real free functions would free
  /// fragctl's memory under it. O(spans held); only frees of pointers the
  /// layer did not hand out ask.
  bool held_by_fragctl(const void* ptr) noexcept;
  /// Calls body(device, allocator) for each device the layer allocated on
  /// whose allocator exists (one that cannot be looked up is skipped).
  template <class Body>
  void for_each_used_allocator(Body&& body);
  /// free()'s and free_async()'s answer to a pointer into fragctl's memory
  /// that is no live block of the layer's.
  int refuse_held(const char* call, void* ptr) noexcept;
  /// Whether `stream` is capturing a graph (false when the runtime cannot say).
  bool capturing(void* stream, stream_mode mode) noexcept;
  /// Takes `ptr`'s record out of owned_ (nullopt when it has none); notes
  /// `freeing_stream`, which the free will name, as a stream met.
  std::optional<owned_block> take(void* ptr, void* freeing_stream = nullptr);
  /// free_async's half for a block the layer handed out (its record taken).
  int release_async(void* ptr, owned_block block, void* stream, stream_mode mode) noexcept;
  void release(void* ptr, const owned_block& block) noexcept;
  /// The device whose default pool `pool` is, if it is one and stacks_ is set.
  std::optional<int> default_pool_device(const void* pool) const;

  real_functions real_;
  allocator_source allocators_;
  std::atomic<bool> build_failure_logged_{false};  ///< the once-only error line of a failed build
  std::atomic<std::uint64_t> devices_used_{0};      ///< bit d: the layer allocated on device d (d < 64)
  stack_source stacks_;
  /// Frees hold it shared from taking a block's record to handing the block
  /// to its allocator (never across a device wait or a real runtime free),
  /// stream_destroy exclusively while the allocators forget a stream: a
  /// free never names a stream the allocator forgot (its record read
  /// before, its free after).
  // std::shared_mutex and std::mutex, not absl::Mutex: ThreadSanitizer
  // cannot see Debian's uninstrumented absl::Mutex (tools/sanitize.sh).
  std::shared_mutex ending_;
  mutable std::mutex mutex_;
  absl::flat_hash_map<const void*, owned_block> owned_ ABSL_GUARDED_BY(mutex_);
  /// Streams (not the default ones) the layer named to an allocator, in an
  /// allocation or a free, since they were last destroyed: the only ones
  /// stream_destroy waits for and has the allocators forget.
  absl::flat_hash_set<const void*> streams_met_ ABSL_GUARDED_BY(mutex_);
  absl::flat_hash_map<const void*, int> default_pools_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace fragctl::interpose
