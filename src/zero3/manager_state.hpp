// The block manager's state, shared by its source files (gather and release,
// gradients, statistics). Internal to src/zero3.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fragctl/backend.hpp"
#include "fragctl/zero3/block_manager.hpp"
#include "zero3/gradient_state.hpp"

namespace fragctl::zero3 {

struct block_manager::impl {
  impl(std::span<const block_spec> specs, const options& o, communicator& c, device_allocator& p,
       device_allocator& t);
  ~impl();
  impl(const impl&) = delete;
  impl& operator=(const impl&) = delete;
  /// Waits for the comm stream and frees every buffer, event and stream made
  /// so far (the destructor, and a constructor that failed half-way).
  void teardown() noexcept;

  struct block_runtime {
    void* buffer = nullptr;     // gathered buffer, nullptr when not gathered
    std::size_t charged = 0;    // its allocation_size, counted against the budget
    int consumers = 0;
    bool prefetched = false;    // gathered ahead and not fetched yet
    event_t gathered = nullptr; // recorded on the comm stream after the all-gather
    std::vector<view> views;
    std::vector<view> gradient_views;
    int bucket = -1;            // the reduce bucket this block holds
    void* gradient = nullptr;   // its gradient slice (long-lived allocator), nullptr when not held
  };

  struct bucket {
    void* data = nullptr;
    int holder = -1;            // block index, -1 when free
    event_t reduced = nullptr;  // recorded after its last reduce-scatter
  };

  // Long-lived allocation helpers.
  /// Allocates `zeros` and zeroes every long-lived buffer (construction);
  /// fills bucket_padding.
  void zero_long_lived();
  void* allocate_long_lived(std::size_t bytes);
  void free_long_lived(void*& ptr, std::size_t bytes) noexcept;
  /// Queues zeroing bytes [offset, offset + bytes) of `buffer` on `stream`
  /// (copies from `zeros`).
  void zero(void* buffer, byte_range range, stream_t stream);

  void check_block(std::size_t block, const char* call) const;
  [[nodiscard]] std::string tag(std::size_t block) const;

  // Gradient slices (gradients.cpp): allocated at a block's first reduce on
  // the reducing stream, freed by release_gradients on the releasing stream
  // (and by teardown).
  void* gradient_slice(std::size_t block, stream_t stream);
  /// Frees every held slice on `stream`, which must be ordered after the
  /// comm stream's reduces (or nullptr once the comm stream is idle).
  void free_gradient_slices(stream_t stream) noexcept;
  /// Throws invalid_argument naming `call` while a block holds a reduce bucket.
  void check_no_bucket_held(const char* call) const;

  // Gather and free (block_manager.cpp). The manager allocates on the
  // stream that uses the memory (the fetching stream, the reducing stream),
  // not on its comm stream, and makes the comm stream wait for that stream
  // before writing: an allocator shared with that stream's other users
  // (PyTorch under fragctl.torch.enable) then reuses the manager's frees and
  // the manager reuses theirs in stream order, with no cross-stream handover.
  void gather(std::size_t block, bool prefetch, stream_t home);
  /// Frees the gathered buffer on `stream`: the last consumer's, which waited
  /// for the all-gather at fetch; or the comm stream, for a buffer gathered
  /// ahead and never fetched.
  void free_buffer(std::size_t block, stream_t stream) noexcept;
  void make_room(std::size_t block, std::size_t charge);
  /// Whether `block`, whose last consumer is releasing it, is the next fetch
  /// of the recorded order (a model's head, last in forward and first in
  /// backward), with prefetching on.
  [[nodiscard]] bool used_next(std::size_t block) const;
  /// Keeps `block`'s buffer as gathered ahead instead of freeing and
  /// gathering it again: the comm stream waits for `stream` (the releasing
  /// consumer's work) and the block's event is recorded again after it, so
  /// every later user and the buffer's free are ordered after that work.
  void keep_ahead(std::size_t block, stream_t stream);
  void prefetch_ahead(stream_t home);
  void follow_trace(std::size_t block);
  void refresh_views(std::size_t block);
  /// Makes the comm stream wait for the work queued on `stream` so far.
  void comm_waits_for(stream_t stream);
  /// Makes `stream` wait for the work queued on the comm stream so far.
  void waits_for_comm(stream_t stream);

  options opts;
  communicator& comm;
  device_allocator& persistent;
  device_allocator& transient;
  device_backend& backend;
  model_layout layout;
  stream_t comm_stream = nullptr;
  event_t scratch_event = nullptr;  // recorded and waited on at once; reusable immediately

  void* shards = nullptr;
  void* persistent_parameters = nullptr;
  void* persistent_gradients = nullptr;
  std::array<bucket, 2> buckets{};
  std::vector<std::vector<byte_range>> bucket_padding;  // per block: bucket bytes holding no gradient
  void* zeros = nullptr;  // pinned host memory, all zero, never written after construction
  std::size_t zeros_bytes = 0;
  static constexpr std::size_t zero_chunk_bytes = std::size_t{1} << 20;  // bytes zeroed per copy, at most
  int next_bucket = 0;
  std::vector<block_runtime> blocks;

  std::size_t gradient_live = 0;  // bytes of the gradient slices held
  std::size_t gradient_peak = 0;
  std::size_t live = 0;   // gathered bytes live (charged)
  std::size_t peak = 0;
  std::size_t ahead = 0;  // prefetched bytes not fetched yet

  bool recording = true;  // recording the fetch order (first step, or after a miss)
  std::vector<std::size_t> trace;
  std::size_t cursor = 0;  // position of the next expected fetch in `trace`

  zero3_stats counters;  // the counts; sizes are filled by stats()
  std::uint64_t wait_ns = 0;
  std::uint64_t step_all_gather_bytes = 0;
  std::uint64_t step_reduce_scatter_bytes = 0;
  std::uint64_t step_gathers = 0;
  std::uint64_t step_prefetch_hits = 0;

  // The gradient path of a framework binding (gradient_flow.cpp), made once
  // the manager is built; end_step tells it the step ended.
  std::unique_ptr<gradient_state> gradients;
};

}  // namespace fragctl::zero3
