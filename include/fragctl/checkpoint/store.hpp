// The activation-checkpoint store (docs/checkpoint.md).
//
// Forward puts one checkpoint per layer; backward gets them back in reverse
// order and drops each once used. The store keeps them in one device region
// of `device_budget` bytes, allocated once from a device_allocator at
// construction and sub-allocated inside (checkpoints stay apart from
// short-lived memory), and in pinned host memory (pinned_host_arena) when
// the region is full: it offloads the checkpoints backward needs last and
// prefetches them back ahead of need.
//
// Theory. Backward visits layers from the highest index down, so the
// checkpoint needed last is the one with the lowest layer index: that is the
// one evicted (Belady's rule under that order). Eviction queues a
// device-to-host copy on the store's own copy stream, ordered after the
// checkpoint's producer with an event, and releases the range at once,
// fenced by an event after the copy: whoever takes the range next orders its
// stream after the fence (wait_event), so nothing waits on the host. From the
// second iteration the store knows the sequence of puts and makes room for
// the next put one put early, so the copy overlaps a layer of compute.
// In backward, get(L) queues host-to-device copies for the next
// `prefetch_depth` checkpoints below L that are on the host, into free space
// or space of checkpoints needed after them; get orders the caller's stream
// after the copy of its checkpoint. Every copy goes through the one copy
// stream, so host buffers are reused in stream order without fences.
//
// Stream contract:
//  * put(L, bytes, s): the buffer may be written by work queued on `s` after
//    put returns. Queue every write before the next call into the store; from
//    then on the store may copy the checkpoint out (after that work).
//  * get(L, s): the data is in place for work queued on `s` after get returns.
//    Until drop(L), the buffer is not moved; queue every use before drop.
//  * drop(L): the range is reused after the work queued on the stream of the
//    last get (or of the put) so far.
//  * reset(): ends an iteration: drops every checkpoint left.
// The host thread blocks only in the destructor, synchronize(), and get()
// when `measure_waits` is set.
//
// Threads: a store is not thread-safe; use it from one thread at a time.
// Errors: put/get throw out_of_memory when the region cannot hold the
// checkpoint even after evicting everything evictable (or its host copy
// cannot be pinned), invalid_argument on misuse (zero bytes, a layer put
// twice, get of an unknown layer), backend_error on a runtime failure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "fragctl/checkpoint/pinned_host_arena.hpp"
#include "fragctl/device_allocator.hpp"
#include "fragctl/stats.hpp"
#include "fragctl/types.hpp"

namespace fragctl::checkpoint {

/// Why a copy was queued.
enum class copy_reason : std::uint8_t {
  evict,            ///< device to host: a put or fetch needed the space now
  evict_ahead,      ///< device to host: room for the next put, one put early
  prefetch,         ///< host to device: ahead of get
  fetch_on_demand,  ///< host to device: get found the checkpoint on the host
};
[[nodiscard]] std::string_view to_string(copy_reason reason) noexcept;

/// One copy the store queued (for observers: tests, traces).
struct copy_event {
  int layer = 0;
  std::size_t bytes = 0;
  copy_reason reason = copy_reason::evict;
  [[nodiscard]] bool to_host() const noexcept {
    return reason == copy_reason::evict || reason == copy_reason::evict_ahead;
  }
};

/// What the store rounds its region and every checkpoint up to, and the
/// alignment of every checkpoint's buffer: the allocators' min_alignment.
/// fragctl.torch.offload_activations reads it through the C API
/// (fragctl_checkpoint_alignment).
inline constexpr std::size_t store_alignment = min_alignment;

struct store_options {
  /// Device bytes for checkpoints: the size of the store's region (> 0,
  /// rounded up to store_alignment). Never exceeded. At least the largest checkpoint.
  std::size_t device_budget = 0;
  /// Checkpoints below the one backward is at that are fetched ahead.
  /// 0 fetches on demand only.
  std::size_t prefetch_depth = 2;
  /// From the second iteration, make room for the next put one put early.
  bool evict_ahead = true;
  host_provider host = host_provider::automatic;
  /// get() blocks until the caller's stream reaches it, then times the wait
  /// for the checkpoint's copy (store_stats::wait_seconds). For benchmarks:
  /// it serializes the host with the device.
  bool measure_waits = false;
  /// Called for every copy queued, on the calling thread; must not call into
  /// the store.
  std::function<void(const copy_event&)> on_copy;
};

/// What a store did. Device bytes count ranges of the region (sizes rounded
/// up to store_alignment); host bytes count checkpoint bytes with a host copy.
struct store_stats {
  std::size_t device_budget = 0;
  byte_gauge device;  ///< region bytes held by checkpoints, being fetched included
  byte_gauge host;    ///< checkpoint bytes with a copy on the host
  host_arena_stats host_arena;
  std::string host_provider;  ///< "jemalloc (libfragctl_jemalloc)", "size_classes", ...

  std::uint64_t iterations = 0;  ///< reset() calls
  std::uint64_t puts = 0, gets = 0, drops = 0;
  std::uint64_t evictions = 0, evictions_ahead = 0;   ///< device-to-host copies, by reason
  std::uint64_t prefetches = 0, fetches_on_demand = 0;  ///< host-to-device copies, by reason
  std::uint64_t evictions_without_copy = 0;  ///< evictions that found a host copy already there
  std::size_t bytes_to_host = 0, bytes_to_device = 0;
  std::uint64_t stream_waits = 0;  ///< wait_event calls queued

  std::uint64_t gets_resident = 0;    ///< checkpoint never left the device
  std::uint64_t gets_prefetched = 0;  ///< fetched by a prefetch before the get
  std::uint64_t gets_on_demand = 0;   ///< fetched by the get itself
  std::uint64_t gets_prefetch_pending = 0;  ///< prefetched, copy not complete when get was called

  /// Copy stream busy time per direction, from the host clock: each copy
  /// counts from when it was queued (or the previous copy was seen done) to
  /// when the store saw its event complete. An upper bound; exact after
  /// synchronize() when the host polls often.
  double to_host_seconds = 0, to_device_seconds = 0;
  /// Time get() waited for its checkpoint's copy (only with measure_waits).
  double wait_seconds = 0;

  [[nodiscard]] double to_host_bandwidth() const noexcept {
    return to_host_seconds > 0 ? static_cast<double>(bytes_to_host) / to_host_seconds : 0.0;
  }
  [[nodiscard]] double to_device_bandwidth() const noexcept {
    return to_device_seconds > 0 ? static_cast<double>(bytes_to_device) / to_device_seconds : 0.0;
  }
};

/// The statistics as a JSON object (docs/checkpoint.md lists the fields), for
/// callers to put into their own reports.
[[nodiscard]] std::string to_json(const store_stats& stats);

/// Where a checkpoint is.
enum class residence : std::uint8_t { absent, device, host };

class store {
 public:
  /// Allocates the region (device_budget bytes) from `allocator` on the
  /// default stream, creates the copy stream and the pinned host arena.
  /// `allocator` (and its backend) must outlive the store. Throws
  /// invalid_argument for a zero budget, out_of_memory when the region cannot
  /// be allocated.
  store(device_allocator& allocator, store_options options);
  /// Blocks until every stream that used the region is done with it, then
  /// frees the region, the copy stream and the host arena.
  ~store();
  store(const store&) = delete;
  store& operator=(const store&) = delete;

  /// A device buffer of `bytes` (> 0) for the checkpoint of `layer`, aligned to
  /// 512 bytes, for the producer to write on `stream`. May queue copies out
  /// of checkpoints needed later, and order `stream` after them. put and get
  /// throw state_error while the allocator is paused (its pages are given
  /// back: device_allocator::pause).
  [[nodiscard]] void* put(int layer, std::size_t bytes, stream_t stream);
  /// The device pointer of `layer`'s checkpoint with its data in place for
  /// work on `stream`; the same pointer until drop. Queues prefetches below it.
  [[nodiscard]] void* get(int layer, stream_t stream);
  /// Frees `layer`'s checkpoint (see the stream contract). Unknown layers are
  /// ignored with a warning. Never throws.
  void drop(int layer) noexcept;
  /// Ends an iteration: drops every checkpoint left and remembers this
  /// iteration's puts to plan the next one.
  void reset();
  /// Blocks until every copy queued so far has completed (exact statistics).
  void synchronize();
  /// Says that `stream`, which checkpoints were put or taken on, is about
  /// to be destroyed by its owner: the store waits for the work queued on
  /// it, seals the checkpoints written there, and never records on it
  /// again (what would mark a later point on it marks one on the default
  /// stream, after it in every case once its work is done). Until then the
  /// store records on the stream a checkpoint was last put or taken on when
  /// it seals, hands out or drops it. Nothing for the default stream.
  /// Throws backend_error when the wait fails (nothing changed then).
  void stream_ending(stream_t stream);

  [[nodiscard]] residence where(int layer) const;
  [[nodiscard]] store_stats stats() const;
  [[nodiscard]] const store_options& options() const noexcept;
  /// The store's copy stream.
  [[nodiscard]] stream_t copy_stream() const noexcept;

  class state;

 private:
  std::unique_ptr<state> state_;
};

}  // namespace fragctl::checkpoint
