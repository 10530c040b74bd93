// fragctl::device_allocator: the one interface every policy and adaptor
// implements (DESIGN.md, "The allocator interface and stream order").
//
// Stream-ordered semantics, as with cudaMallocAsync (docs/stream-order.md):
//  * allocate(bytes, s) returns memory the caller may use in work queued on
//    stream s from now on.
//  * deallocate(p, bytes, s) says: all work that uses p is queued on s before
//    this call. The block may be handed out again at once on s (later work on
//    s runs after the earlier work); to any other stream only after an event
//    recorded on s at free time has completed.
//  * stream == nullptr is the device's default stream.
//  * allocate(0, s) returns nullptr; deallocate(nullptr, 0, s) does nothing.
//  * Every non-null pointer is aligned to at least min_alignment (512) bytes.
//
// Shape (non-virtual interface): the public functions check arguments and
// report misuse, then call the private virtual do_* that a policy or adaptor
// implements. Statistics, tracing, limits and locking are adaptors
// (fragctl/adaptors.hpp) wrapping an upstream allocator, never inside a policy.
//
// Threads: policies are not thread-safe; wrap them in thread_safe_adaptor
// (make_allocator does) to share one between threads.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "fragctl/memory_map.hpp"
#include "fragctl/types.hpp"

namespace fragctl {

class device_backend;

/// What a policy knows about its cache at a moment. Bytes throughout.
/// The arena's steady-state plan (docs/policies/arena.md, "The steady-state
/// plan"); all zero for other policies and while no repeating step was found.
struct step_plan_state {
  std::uint64_t steps_detected = 0;      ///< plans made: repeating steps found without a marker
  std::uint64_t planned_steps = 0;       ///< steps served wholly from a plan
  std::uint64_t dropped = 0;             ///< plans left because the job no longer followed them
  std::uint64_t planned_bytes = 0;       ///< bytes allocated from a plan (cumulative)
  std::uint64_t unplanned_bytes = 0;     ///< bytes allocated by the policy's own placement (cumulative)
  std::uint64_t step_allocations = 0;    ///< allocations per step of the current plan (0: none)
  std::uint64_t step_planned_bytes = 0;  ///< bytes per step the current plan serves
  std::uint64_t region_bytes = 0;        ///< memory the current plan holds for its blocks
  std::uint64_t last_step_driver_calls = 0;     ///< driver memory calls in the latest planned step
  std::uint64_t planned_step_driver_calls = 0;  ///< driver memory calls over all planned steps
  /// Judgments at step starts that refused to start the plan (a waiting
  /// plan is judged again at each, or, backed off, at fewer), by the reason
  /// the refusing check found: mapping the plan's range would cost more
  /// driver calls than best fit made in the step before and over the steps
  /// in a row at its shape; it would raise the memory held past its
  /// high-water mark (and the growth allowed). The first checks bound the
  /// range from below, so a refusal for one reason may not show the other;
  /// a larger step's layout on a guess (no growth allowed) counts too.
  std::uint64_t starts_refused_calls = 0;
  std::uint64_t starts_refused_memory = 0;
};

struct pool_state {
  std::size_t reserved = 0;            ///< held from the backend (segments, mapped granules)
  std::size_t allocated = 0;           ///< handed out to callers, after rounding
  std::size_t cached_free = 0;         ///< reserved and not handed out
  std::size_t largest_free_block = 0;  ///< largest block one request could get without a backend call
  std::size_t segments = 0;            ///< segments or mapped regions held
  std::uint64_t retries = 0;           ///< allocations that succeeded only after releasing cache (cumulative)
  step_plan_state plan;                ///< the arena's steady-state plan
  /// Exported handles (share(); docs/interop.md, CUDA IPC) whose memory
  /// pause() released, and their bytes (cumulative): their exports were
  /// closed, and a process that imported them keeps the old memory.
  std::uint64_t pause_detached_exports = 0;
  std::uint64_t pause_detached_export_bytes = 0;
};

/// How a policy judged a deallocation it was given.
enum class free_status : std::uint8_t {
  ok,             ///< freed
  not_owned,      ///< pointer is not a live block of this allocator (also: double free); nothing changed
  size_mismatch,  ///< pointer is live but `bytes` differs from its size; freed with the recorded size
};

/// The outcome of a deallocation: its status and, unless not_owned, the size
/// the block was allocated with (the caller's request where the policy keeps
/// it, else the rounded size), so adaptors account the true size on misuse.
struct free_result {
  free_status status = free_status::ok;
  std::size_t bytes = 0;
  /// The size the free took: `bytes`, or `given` (the caller's) where the
  /// allocator left it 0. A policy may take another size than the request
  /// as right (caching takes the rounded one): counting `given` then would
  /// leave the statistics short.
  [[nodiscard]] std::size_t size_or(std::size_t given) const noexcept { return bytes != 0 ? bytes : given; }
};

/// What pause() keeps of the contents of live blocks.
enum class pause_keep : std::uint8_t {
  none,  ///< nothing: after resume() the blocks' contents are undefined
  host,  ///< a copy in pinned host memory, written back by resume()
};

/// What an allocator that keeps a live-block table (block_table_adaptor, the
/// graph_pool policy) knows of a live block: the caller's request and the
/// stream it was allocated on.
struct block_record {
  std::size_t bytes = 0;
  stream_t stream = nullptr;
};

/// The memory under a range of live blocks, described so that another
/// process can map it (device_allocator::share; docs/interop.md, "Sharing
/// tensors between processes"). Either a raw allocation (`handles` empty:
/// the runtime's IPC handle of `base` reaches it, device_backend::
/// export_allocation) or the physical handles mapped one after the other
/// from `base` on, each exported (device_backend::export_physical).
struct shared_memory {
  struct handle {
    int fd = -1;              ///< the exporter's descriptor (or sim token), valid while the handle lives
    std::uint64_t serial = 0; ///< unique in the exporting process (exported_handle::serial)
    std::size_t bytes = 0;    ///< the handle's size
  };
  void* base = nullptr;     ///< the raw allocation, or where the first handle is mapped
  std::size_t bytes = 0;    ///< the raw allocation's size, or the handles' total
  std::size_t offset = 0;   ///< the range's start minus base
  std::vector<handle> handles;
};

/// The largest request any allocator accepts (2^62); larger throws invalid_argument.
inline constexpr std::size_t max_request_bytes = std::size_t{1} << 62;

class device_allocator {
 public:
  virtual ~device_allocator() = default;
  device_allocator(const device_allocator&) = delete;
  device_allocator& operator=(const device_allocator&) = delete;

  /// Returns a block of at least `bytes` usable on `stream`; nullptr for 0
  /// bytes. Throws out_of_memory when it cannot (after the policy's own
  /// retry), backend_error on a runtime failure, invalid_argument for a size
  /// no device can hold (over 2^62 bytes). Strong guarantee: on throw, nothing
  /// changed that a caller can observe except statistics.
  [[nodiscard]] void* allocate(std::size_t bytes, stream_t stream = nullptr) {
    if (bytes == 0) return nullptr;
    if (bytes > max_request_bytes) [[unlikely]] throw_too_large(bytes);
    return do_allocate(bytes, stream);
  }

  /// Returns `ptr` (from allocate(bytes, ...)) stream-ordered on `stream`.
  /// Never throws. A pointer this allocator does not own, a double free, or a
  /// wrong `bytes` is reported (one warning log line and misuse counter; abort
  /// when built with FRAGCTL_CHECKED) and never corrupts the allocator.
  void deallocate(void* ptr, std::size_t bytes, stream_t stream = nullptr) noexcept {
    if (ptr == nullptr) return;
    const free_status status = do_deallocate(ptr, bytes, stream).status;
    if (status != free_status::ok) [[unlikely]] report_misuse(status, ptr, bytes);
  }

  /// deallocate without the report: returns what happened and changes no
  /// misuse counter. Adaptors forward through this so that only the outermost
  /// allocator reports. deallocate(nullptr, ...) gives {ok, 0}.
  [[nodiscard]] free_result try_deallocate(void* ptr, std::size_t bytes,
                                           stream_t stream = nullptr) noexcept {
    if (ptr == nullptr) return {free_status::ok, 0};
    return do_deallocate(ptr, bytes, stream);
  }

  /// Declares that work queued on `stream` uses `ptr` (a live block allocated
  /// on another stream), as Tensor.record_stream does: when the block is
  /// freed later, it is not handed out again, nor given back to the device,
  /// until `stream` has passed the point of the free, whatever stream the
  /// free names. Served by stream_use_adaptor (fragctl/adaptors.hpp), which
  /// every allocator_stack holds; a bare policy throws invalid_argument.
  /// Throws backend_error if the runtime fails.
  void record_stream(void* ptr, stream_t stream) { do_record_stream(ptr, stream); }

  /// The request size and allocation stream of `ptr`, a live block, where
  /// the allocator keeps a live-block table (block_table_adaptor, which
  /// allocator_stack adds with cfg.block_table; the graph_pool policy);
  /// std::nullopt for a pointer that is not live, or when no table is kept.
  /// Never counts misuse.
  [[nodiscard]] std::optional<block_record> block_info(void* ptr) const { return do_block_info(ptr); }

  /// What deallocate(ptr, bytes) would find now, without freeing anything or
  /// counting misuse: not_owned where `ptr` is not the start of a live block
  /// of this allocator (another allocator's, an interior pointer, one freed
  /// already), size_mismatch where `bytes` is not a size the block's free
  /// accepts, else ok; with the size deallocate would give. Every policy
  /// and adaptor of the library answers (O(1)); std::nullopt where an
  /// allocator cannot tell (the default, for allocators written outside it).
  [[nodiscard]] std::optional<free_result> check_free(void* ptr, std::size_t bytes) const {
    return do_check_free(ptr, bytes);
  }

  /// Says that `stream`, on which blocks of this allocator were allocated,
  /// freed or used (record_stream), is about to be destroyed by its owner
  /// (cudaStreamDestroy): a runtime call on a destroyed stream may end the
  /// process, and the allocator remembers streams to make such calls later
  /// (a lazily recorded event, a segment synchronized before it goes). It
  /// waits for the work queued on `stream`, outside any lock of the
  /// allocator, then every part of it forgets the handle: frees on it are
  /// complete, uses recorded on it are dropped, and blocks, slabs and
  /// segments that belonged to it belong to the default stream (nullptr)
  /// from now on. A stream later created with the same handle is a new
  /// stream. Call it before destroying a stream the allocator met; the
  /// preload library does it in cudaStreamDestroy and hipStreamDestroy, the
  /// C API is fragctl_stream_ending. Nothing for the default stream, which
  /// is never destroyed. Throws backend_error when the wait fails,
  /// std::bad_alloc when host memory runs out; nothing is forgotten then
  /// (each part passes it on before it forgets, and only the parts that
  /// need memory, first, may fail). docs/stream-order.md, "A stream that
  /// ends".
  void stream_ending(stream_t stream);

  /// The size a request of `bytes` occupies after the policy's rounding.
  [[nodiscard]] std::size_t allocation_size(std::size_t bytes) const noexcept {
    return do_allocation_size(bytes);
  }

  /// Current state of the cache (not thread-safe against allocate/deallocate
  /// unless the allocator is wrapped in a thread_safe_adaptor).
  [[nodiscard]] pool_state state() const { return do_state(); }

  /// Returns every cached block that is wholly free to the backend (segments,
  /// granules), waiting for pending stream-ordered frees first. Live blocks
  /// are untouched.
  void release_cached() { do_release_cached(); }

  /// Gives the physical memory under every block back to the device while
  /// keeping each block's address (reserved address space): another
  /// process, or another allocator, can use the memory until resume() maps
  /// fresh memory at the same addresses (docs/interop.md, "Pause and
  /// resume"). The caller must have synchronized the work that uses the
  /// blocks; pause waits only for pending frees, then gives back cached
  /// memory too. Until resume(), allocate throws state_error; frees are
  /// taken as always. Returns false, nothing released but the cache, when
  /// pinned host memory for `keep == host` runs out. Throws invalid_argument
  /// when the policy cannot pause (only `arena` over virtual memory can),
  /// state_error (an invalid_argument) when it is paused already (checked in
  /// the same call, so of two threads pausing at once the second gets it);
  /// backend_error when a runtime call fails: with `keep == host` every
  /// block is then mapped again, with its contents, where possible; with `none` what was released stays paused (paused()
  /// says whether resume() is needed).
  [[nodiscard]] bool pause(pause_keep keep) { return do_pause(keep); }

  /// Maps fresh physical memory under every block paused by pause(), at the
  /// same addresses, and writes back what pause kept. Returns false when the
  /// device (or the allocator's limit) refuses the memory: then nothing is
  /// mapped, the allocator stays paused, and resume() may be called again.
  /// Throws state_error (an invalid_argument) when the arena is not paused,
  /// invalid_argument when the policy cannot pause, backend_error as pause().
  [[nodiscard]] bool resume() { return do_resume(); }

  /// Whether pause() holds the allocator (until resume() succeeds).
  [[nodiscard]] bool paused() const { return do_paused(); }

  /// Lets kernels on device `peer` read and write this allocator's blocks
  /// directly, as the program's cudaDeviceEnablePeerAccess does for
  /// cudaMalloc memory: memory mapped now and later is granted to `peer`
  /// (docs/interop.md, "Peer access"). Memory from a plain device allocation
  /// (caching, the arena's fallback block) needs nothing here: the runtime's
  /// own peer access covers it. Idempotent; a call that failed midway can be
  /// made again. Throws invalid_argument for this device or a negative
  /// ordinal, or from an allocator that does not say how its memory is
  /// reached; backend_error when the devices cannot access each other or
  /// the runtime fails.
  void enable_peer_access(int peer) { do_enable_peer_access(peer); }

  /// Describes the memory under [ptr, ptr + bytes), which lies in live
  /// blocks of this allocator, for another process to map: the physical
  /// handles mapped there (exported; the backend keeps their descriptors
  /// until the handles are released) or the raw allocation holding it. The
  /// blocks must stay live while another process maps them (PyTorch's
  /// reference counting of shared tensors sees to it). Throws
  /// invalid_argument for a range that is not live memory of this allocator
  /// (or is paused), or from an allocator that does not say what lies under
  /// its blocks; backend_error when exporting fails (not_supported where the
  /// backend cannot share).
  [[nodiscard]] shared_memory share(void* ptr, std::size_t bytes) const { return do_share(ptr, bytes); }

  /// The backend this allocator obtains memory from.
  [[nodiscard]] device_backend& backend() const noexcept { return do_backend(); }

  /// Policy expression this allocator implements, e.g. "caching" or "stats(caching)".
  [[nodiscard]] std::string_view name() const noexcept { return do_name(); }

  /// The allocator's memory layout now (fragctl/memory_map.hpp): the
  /// segments it holds and the blocks that tile them. A policy that does not
  /// describe its layout answers `available == false`; adaptors and wrappers
  /// answer with their upstream's. `allocator` is filled with name() when the
  /// policy leaves it empty. Not thread-safe against allocate/deallocate
  /// unless the allocator is wrapped in a thread_safe_adaptor. O(blocks): for
  /// reports, not for hot paths.
  [[nodiscard]] memory_snapshot memory_map() const;

  /// Misuse seen by deallocate (pointers not owned / double frees, wrong sizes).
  struct misuse_counters {
    std::uint64_t not_owned = 0;
    std::uint64_t size_mismatch = 0;
  };
  [[nodiscard]] misuse_counters misuse() const noexcept;

 protected:
  device_allocator() = default;
  /// The forgetting half of stream_ending, for an allocator to pass on to
  /// its upstream once the stream's work is done.
  static void forget_stream(device_allocator& upstream, stream_t stream) { upstream.do_stream_ending(stream); }

 private:
  virtual void* do_allocate(std::size_t bytes, stream_t stream) = 0;
  virtual free_result do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept = 0;
  virtual std::size_t do_allocation_size(std::size_t bytes) const noexcept = 0;
  virtual pool_state do_state() const = 0;
  virtual void do_release_cached() = 0;
  virtual device_backend& do_backend() const noexcept = 0;
  virtual std::string_view do_name() const noexcept = 0;
  // Optional: the default refuses (only stream_use_adaptor tracks stream uses).
  virtual void do_record_stream(void* ptr, stream_t stream);
  // Optional: the default describes nothing (available == false).
  virtual memory_snapshot do_memory_map() const { return {}; }
  // Optional: the defaults refuse pause and resume and are never paused.
  virtual bool do_pause(pause_keep keep);
  virtual bool do_resume();
  virtual bool do_paused() const { return false; }
  // Optional: the default keeps no live-block table.
  virtual std::optional<block_record> do_block_info(void* /*ptr*/) const { return std::nullopt; }
  // Optional: the default refuses (a policy says how its memory is reached).
  virtual void do_enable_peer_access(int peer);
  // Optional: the default refuses (a policy says what lies under its blocks).
  virtual shared_memory do_share(void* ptr, std::size_t bytes) const;
  // Optional: the default cannot tell (std::nullopt).
  virtual std::optional<free_result> do_check_free(void* /*ptr*/, std::size_t /*bytes*/) const {
    return std::nullopt;
  }

  // Optional: the default remembers no stream (nothing to forget). Called
  // once the stream's work is done; forwards to any upstream through
  // forget_stream, never through stream_ending (which would wait again),
  // before it forgets anything itself, and may throw only before it
  // changed anything: a failure leaves every part as it was.
  virtual void do_stream_ending(stream_t /*stream*/) {}

  // The cold halves of allocate and deallocate (inline above, as every
  // adaptor calls them on its upstream on each malloc and free).
  [[noreturn]] void throw_too_large(std::size_t bytes) const;
  void report_misuse(free_status status, void* ptr, std::size_t bytes) noexcept;

  std::atomic<std::uint64_t> misuse_not_owned_{0};
  std::atomic<std::uint64_t> misuse_size_mismatch_{0};
};

}  // namespace fragctl
