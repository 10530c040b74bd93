// The ZeRO-3 parameter-block manager (DeepSpeed ZeRO stage 3, FSDP2-style
// stream-ordered buffers) on fragctl's allocators.
//
// Memory. Long-lived memory comes from the `persistent` allocator, allocated
// once at construction: the model shard buffer (this rank's slice of every
// block), the persistent parameters and their gradients, and two reduce
// buckets. Each block's gradient slice also comes from it, but lives from
// the block's first reduce_gradients to release_gradients (as FSDP2's
// gradients live from backward to zero_grad(set_to_none=True)), so no
// gradient slice is held during a forward that follows a release. Short-lived memory, the gathered blocks,
// comes from the `transient` allocator. Keeping the two apart is the cheapest
// defragmentation there is: gathered blocks of a few sizes come and go in a
// pool of their own, never splitting the long-lived region. Padding (the
// alignment gaps and tails of docs/zero3.md's layout) is zero: the
// long-lived buffers are zeroed once at construction, and the padding of a
// reduce bucket each time begin_gradients hands it out, so no stale byte is
// summed into a gradient shard, gathered, or counted by a norm over shards.
// A freshly allocated gradient slice is written whole (padding included) by
// its reduce-scatter of zero-padded buckets before anyone can read it.
//
// Block lifecycle (per block, the same on every rank):
//
//   not_available --fetch/prefetch--> in_flight --gather done--> available
//        ^                                                            |
//        +------------- release by the last consumer -----------------+
//
// fetch(b, s) gathers b if needed (all-gather of the shards into one buffer on
// the manager's communication stream), makes stream s wait for the gather on
// the device, adds a consumer and returns views (pointer, bytes) of every
// parameter into that one buffer: no second copy. release(b, s) drops a
// consumer; the last one frees the buffer stream-ordered: an event recorded on
// s, the communication stream waits for it on the device, and the buffer goes
// back to the transient allocator on the communication stream, where the next
// gather may reuse it at once. No record_stream, no host wait.
//
// Prefetch. The first step (up to the first end_step) records the order of
// fetches. Later steps walk that order ahead of each fetch and gather the
// next blocks while the gathered-ahead bytes stay within prefetch_bytes and
// the live gathered bytes within max_live_bytes. The budget is host-side
// bookkeeping identical on every rank (never the timing of events), so every
// rank issues the same collectives in the same order. A fetch that does not
// match the recorded order stops prefetching and re-records the order. A
// block released by its last consumer that is itself the next fetch of the
// order (a head used last in forward and first in backward) keeps its buffer
// as gathered ahead rather than being freed and gathered again.
//
// Budget. Live gathered bytes (each buffer at the transient allocator's
// allocation_size) never exceed max_live_bytes. A prefetch that would exceed
// it waits (it is issued at a later call, after a release); a fetch that
// would exceed it first drops gathered-ahead blocks nobody uses yet, and
// throws budget_error if the blocks in use alone leave no room. The host
// thread never blocks for the budget: memory freed by a release is reused on
// the communication stream after a device-side wait.
//
// Gradients (contiguous, double-buffered). begin_gradients(b, s) hands out a
// reduce bucket (one of two) with a view per trainable parameter of b;
// reduce_gradients(b, s) reduce-scatters it into b's gradient slice
// (allocated there if not held) on the communication stream (sum; in fp32 when gradient_type
// is fp32) while the other bucket fills. finish_gradients(s) sums the
// persistent parameters' gradients across ranks and makes s wait for every
// reduction. A reduce-scatter writes the shard: accumulating several
// micro-batches into it would need an addition kernel, which this library
// (built without a device compiler) does not have; accumulate in the bucket,
// or in the optimizer.
//
// A framework binding's gradient path (gradient_step; gradient_flow.hpp)
// is decided here too: which application's gradient is summed aside, which
// arrival reduces a block, what a second reduce in one backward keeps, how
// a backward is settled, abandoned or accumulated into, when slices are
// freed. The binding does the tensor arithmetic the manager asks for.
//
// Threads: not thread-safe; one thread drives a manager (as one rank). Errors:
// invalid_argument for misuse (indices, releasing a block not held, ending a
// step with blocks in use), budget_error, out_of_memory from the allocators,
// collective_error from the communicator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fragctl/device_allocator.hpp"
#include "fragctl/error.hpp"
#include "fragctl/stats.hpp"
#include "fragctl/zero3/communicator.hpp"
#include "fragctl/zero3/gradient_flow.hpp"
#include "fragctl/zero3/layout.hpp"
#include "fragctl/zero3/options.hpp"

namespace fragctl::zero3 {

/// A fetch needs more gathered memory than max_live_bytes leaves beside the
/// blocks in use.
class budget_error : public error {
 public:
  using error::error;
};

/// Device memory: a pointer and a size in bytes.
struct view {
  void* data = nullptr;
  std::size_t bytes = 0;
};

enum class block_state : std::uint8_t { not_available, in_flight, available };
[[nodiscard]] std::string_view to_string(block_state s) noexcept;

/// What the manager counted (docs/zero3.md, "Statistics").
struct zero3_stats {
  int rank = 0;
  int world_size = 1;
  std::string communicator;
  std::size_t blocks = 0;
  std::size_t parameters = 0;
  std::size_t parameter_elements = 0;
  std::size_t persistent_parameters = 0;
  std::size_t frozen_parameters = 0;
  // Long-lived bytes on this rank.
  std::size_t shard_bytes = 0;
  std::size_t gradient_shard_bytes = 0;
  std::size_t persistent_bytes = 0;
  std::size_t persistent_gradient_bytes = 0;
  std::size_t bucket_bytes = 0;  ///< both reduce buckets
  /// Gradient slices held now and at most (at most gradient_shard_bytes):
  /// allocated at reduce_gradients, freed by release_gradients.
  byte_gauge gradients;
  // Gathered (transient) bytes, at allocation_size.
  byte_gauge gathered;
  std::size_t max_live_bytes = 0;
  std::size_t prefetch_bytes = 0;
  // Counts since construction.
  std::uint64_t steps = 0;
  std::uint64_t fetches = 0;
  std::uint64_t gathers = 0;             ///< all-gathers issued (demanded + prefetched)
  std::uint64_t prefetches = 0;          ///< gathers issued ahead of use
  std::uint64_t prefetch_hits = 0;       ///< fetches that found their block gathered or in flight from a prefetch
  std::uint64_t prefetch_dropped = 0;    ///< prefetched blocks freed unused (budget or end of step)
  std::uint64_t prefetch_deferred = 0;   ///< prefetches postponed by the budget
  std::uint64_t prefetch_kept = 0;       ///< releases that kept the buffer for the block's next fetch, the next in order
  std::uint64_t pending_at_fetch = 0;    ///< fetches whose gather had not finished yet (the stream waits)
  std::uint64_t trace_misses = 0;        ///< fetches out of the recorded order
  std::uint64_t reduce_scatters = 0;
  std::uint64_t all_gather_bytes = 0;    ///< gathered buffer bytes produced
  std::uint64_t reduce_scatter_bytes = 0;  ///< bucket bytes reduced
  std::uint64_t stall_ns = 0;            ///< host time blocked in collectives (peers, enqueue, synchronize)
  // The last completed step.
  std::uint64_t last_step_all_gather_bytes = 0;
  std::uint64_t last_step_reduce_scatter_bytes = 0;
  std::uint64_t last_step_gathers = 0;
  std::uint64_t last_step_prefetch_hits = 0;
  std::size_t trace_length = 0;          ///< fetches in the recorded order
  // The two allocators under the manager, now: their reserved bytes are the
  // device memory the manager holds, its own bytes above plus cache.
  pool_state long_lived_pool;
  pool_state gathered_pool;
};

/// The JSON object of a zero3_stats (docs/zero3.md shows it), pretty-printed.
[[nodiscard]] std::string to_json(const zero3_stats& s);

class block_manager {
 public:
  /// Lays out `blocks` (execution order) for comm.size() ranks and allocates
  /// the long-lived buffers from `persistent`. `persistent`, `transient` and
  /// `comm` must outlive the manager and be on one backend and device (the
  /// allocators may have two backend objects of it: the manager's streams
  /// and events are `persistent`'s).
  /// Creates the communication stream. Throws invalid_argument for a bad
  /// layout or options, out_of_memory.
  block_manager(std::span<const block_spec> blocks, const options& opts, communicator& comm,
                device_allocator& persistent, device_allocator& transient);
  /// Waits for the communication stream (bounded by the communicator's
  /// timeout), frees everything, and calls transient.release_cached() and
  /// persistent.release_cached() (gradient slices were freed on the
  /// communication stream) so no allocator state refers to that stream once
  /// it is destroyed; this also returns the long-lived allocator's other
  /// cached bytes to the device. Callers must have finished using the
  /// manager's memory on their own streams. Never throws.
  ~block_manager();
  block_manager(const block_manager&) = delete;
  block_manager& operator=(const block_manager&) = delete;

  [[nodiscard]] const model_layout& layout() const noexcept;
  [[nodiscard]] const options& configuration() const noexcept;
  [[nodiscard]] std::size_t block_count() const noexcept;
  [[nodiscard]] std::optional<std::size_t> find_block(std::string_view name) const;
  /// The stream the manager's collectives run on.
  [[nodiscard]] stream_t comm_stream() const noexcept;

  // --- long-lived buffers -----------------------------------------------------

  /// This rank's slice of every block, one buffer (model_layout::shard_bytes).
  [[nodiscard]] view shard_buffer() const noexcept;
  /// Where parameter `param` of `block` has bytes in this rank's shard (for
  /// loading a checkpoint); data is nullptr when the rank holds none of it.
  /// Persistent parameters: the whole parameter. Throws invalid_argument.
  struct parameter_part {
    std::size_t parameter_offset = 0;  ///< first byte of the parameter held here
    view data;
  };
  [[nodiscard]] parameter_part shard_of(std::size_t block, std::size_t param) const;
  /// The whole persistent parameter (valid at any time). Throws invalid_argument
  /// for a partitioned one.
  [[nodiscard]] view persistent_parameter(std::size_t block, std::size_t param) const;
  /// This rank's gradient slice of `block` (after finish_gradients it holds the
  /// sum over ranks of the T region). data is nullptr while the slice is not
  /// held (before the block's first reduce_gradients, after
  /// release_gradients); bytes is the slice's size either way. The pointer
  /// may change after a release: read it again after each backward.
  [[nodiscard]] view gradient_shard(std::size_t block) const;
  /// The replicated gradient of persistent trainable parameter `param` of
  /// `block`, in gradient_type elements (after finish_gradients: the sum over
  /// ranks). Valid at any time. Throws invalid_argument for any other parameter.
  [[nodiscard]] view persistent_gradient(std::size_t block, std::size_t param) const;

  // --- gather / release -------------------------------------------------------

  /// Gathers `block` if it is not gathered or in flight, makes `stream` wait
  /// for it on the device and adds a consumer. Returns one view per parameter
  /// of the block, in registration order (persistent ones point at their whole
  /// copy); valid until the consumer's release. Issues prefetches (later
  /// steps). Throws budget_error, out_of_memory, collective_error.
  [[nodiscard]] std::span<const view> fetch(std::size_t block, stream_t stream);
  /// Drops one consumer of `block`; its work using the views is queued on
  /// `stream`. The last consumer frees the buffer stream-ordered. Throws
  /// invalid_argument when the block has no consumer.
  void release(std::size_t block, stream_t stream);
  /// State of `block` now (queries the gather's event; never blocks).
  [[nodiscard]] block_state state(std::size_t block);
  [[nodiscard]] int consumers(std::size_t block) const;
  /// The whole gathered buffer of `block` (model_layout offsets: T then F),
  /// valid while the block is gathered; {nullptr, 0} when it is not.
  [[nodiscard]] view gathered(std::size_t block) const;
  /// Blocks the host until `block`'s gather has completed (for tests and host
  /// reads); counts as stall time. Throws invalid_argument when not gathered.
  void wait(std::size_t block);

  // --- gradients --------------------------------------------------------------

  /// A reduce bucket for `block`: one view per parameter in registration
  /// order, in gradient_type elements: partitioned trainable ones into the
  /// bucket, persistent trainable ones into their replicated gradient, frozen
  /// ones empty. Contents are unspecified; write every gradient on `stream`
  /// (which waits on the device until the bucket's previous reduction is
  /// done). At most two blocks hold buckets at once; throws invalid_argument
  /// beyond, or when `block` already holds one.
  [[nodiscard]] std::span<const view> begin_gradients(std::size_t block, stream_t stream);
  /// Reduce-scatters `block`'s bucket (filled on `stream`) into its gradient
  /// slice on the communication stream and frees the bucket for reuse. The
  /// first reduce of a block after construction or release_gradients
  /// allocates its slice (long-lived allocator, on the communication
  /// stream). When that allocation throws out_of_memory no reduce-scatter
  /// is issued and the block keeps its bucket and the gradients in it: call
  /// reduce_gradients again once memory is free, or abandon the step by
  /// destroying the manager (release_gradients, finish_gradients and
  /// end_step refuse while the bucket is held).
  void reduce_gradients(std::size_t block, stream_t stream);
  /// Frees every block's gradient slice (gradient_shard then returns nullptr
  /// until the block's next reduce). The caller's reads and writes of the
  /// slices are queued on `stream`: the slices go back to the long-lived
  /// allocator on the communication stream after it waits for `stream`, so
  /// a reduce-scatter already issued completes first (no host wait). Throws
  /// the communicator's error after a failed or aborted collective (checked
  /// first, as finish_gradients does), and invalid_argument while a block
  /// holds a reduce bucket (between begin_gradients and reduce_gradients: its
  /// reduce is still to come). Persistent gradients are not freed. Without
  /// slices held, does nothing.
  void release_gradients(stream_t stream);
  /// Sums persistent gradients across ranks and makes `stream` wait for every
  /// reduction so far. Call once per step, after the last reduce_gradients.
  void finish_gradients(stream_t stream);

  // --- the gradient path of a framework binding (gradient_flow.hpp) ----------

  /// Takes one event of a binding's gradient path and returns the actions
  /// the binding does now, at most `capacity`; with `more`, the binding
  /// reports gradient_event::resume once they are done (and passes
  /// `gradients_set` then if a `report` action asked for it). The manager
  /// runs its own operations (begin_gradients, reduce_gradients, ...) on
  /// `stream` between batches. `gradients_set`: one byte per shard, nonzero
  /// where the shard's gradient (`.grad`) is set; read with forward,
  /// forward_in_backward and the resume a `report` asked for. The actions
  /// stay valid until the next call. A new event while the last one has
  /// actions to come drops them. Throws invalid_argument (a bad block,
  /// parameter, shard count or event) and whatever the manager's
  /// operations throw; the event's remaining actions are then dropped.
  [[nodiscard]] gradient_batch gradient_step(gradient_event event, std::size_t block, std::size_t param,
                                             stream_t stream, std::span<const unsigned char> gradients_set,
                                             std::size_t capacity);
  /// The shards of the gradient path (gradient_flow.hpp numbers them).
  [[nodiscard]] std::size_t gradient_shards() const;

  // --- steps ------------------------------------------------------------------

  /// Ends a training step: no block may be in use or hold a bucket. Frees
  /// unused prefetched blocks, fixes the recorded fetch order after the first
  /// step, and orders later gathers after all work queued on `stream` so far
  /// (e.g. the optimizer writing the shards).
  void end_step(stream_t stream);
  /// Blocks until every collective issued so far has completed (bounded by the
  /// communicator's timeout; raises collective_error at the deadline).
  void synchronize();

  [[nodiscard]] zero3_stats stats() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace fragctl::zero3
