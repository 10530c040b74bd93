// The `caching` policy: the PyTorch-class baseline (DESIGN.md, "The four
// policies"; docs/policies/caching.md).
//
// Theory. Memory comes from the backend in segments (raw allocations). A
// segment is cut into blocks, kept as a doubly linked list in address order.
// Free blocks sit in one ordered set per pool keyed by (stream, size,
// address); a request takes the first free block of its stream at least as
// big as the rounded request (best fit, lowest address among equals) and
// splits off the tail when the tail is worth keeping. A freed block merges
// with free neighbours of its segment. A request that no free block serves
// gets a new segment; if the backend is out of memory, every wholly free
// segment is returned and the backend asked once more.
//
// Sizes, with the defaults of `config` (which reproduce PyTorch's
// CUDACachingAllocator):
//   * requests are rounded up to a multiple of 512 bytes (at least 512);
//   * rounded sizes up to small_size (1 MiB) use the small pool, whose
//     segments are small_segment (2 MiB); anything larger uses the large pool;
//   * large requests below large_segment_limit (10 MiB) get large_segment
//     (20 MiB) segments; bigger ones get a segment of their size rounded up to
//     segment_round (2 MiB);
//   * a small-pool block is split when at least 512 bytes would remain; a
//     large-pool block when more than small_size would remain and the request
//     is below max_split_size;
//   * blocks of max_split_size or more are never split, serve no request
//     below max_split_size, and serve bigger requests only when less than
//     large_segment larger than them.
//
// Streams. Every segment belongs to the stream that first needed it, and its
// blocks are handed out only on that stream, so a block freed on its own
// stream is reusable at once. A block freed on another stream is held back
// until an event recorded on that stream at free time has completed (the
// stamp and the event are core's stream clock, whose theory block states the
// rule once). Before segments go back to the backend, the streams they
// belong to are synchronized.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "fragctl/backend.hpp"
#include "fragctl/config.hpp"
#include "fragctl/device_allocator.hpp"
#include "fragctl/policy.hpp"

namespace fragctl {

/// Best-fit caching allocator over raw backend allocations (see the theory
/// above). allocate throws out_of_memory after the release-and-retry of
/// release_on_oom, backend_error on a runtime failure; deallocate never
/// throws. Not thread-safe: wrap it in thread_safe_adaptor to share it.
class caching_policy final : public device_allocator {
 public:
  static constexpr std::string_view policy_name = "caching";

  /// Builds an empty cache over `backend`, which must outlive the policy.
  /// Reads small_size, small_segment, large_segment, large_segment_limit,
  /// segment_round, max_split_size and release_on_oom from `cfg`. Throws
  /// invalid_argument when small_size is 0, segment_round is 0, or
  /// max_split_size is below small_size.
  caching_policy(const config& cfg, device_backend& backend);

  /// Returns every segment to the backend after synchronizing the streams
  /// that use them. Blocks still live are freed too, with one warning log
  /// line giving their count.
  ~caching_policy() override;

  /// Number of blocks handed out and not yet freed.
  [[nodiscard]] std::size_t live_blocks() const noexcept;

 private:
  void* do_allocate(std::size_t bytes, stream_t stream) override;
  free_result do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override;
  std::size_t do_allocation_size(std::size_t bytes) const noexcept override;
  pool_state do_state() const override;
  void do_release_cached() override;
  /// Segments are plain device allocations: the runtime's peer access covers them.
  void do_enable_peer_access(int peer) override;
  /// The segment holding the range: a raw allocation.
  shared_memory do_share(void* ptr, std::size_t bytes) const override;
  std::optional<free_result> do_check_free(void* ptr, std::size_t bytes) const override;
  /// Its segments and blocks become the default stream's.
  void do_stream_ending(stream_t stream) override;
  device_backend& do_backend() const noexcept override;
  std::string_view do_name() const noexcept override { return policy_name; }
  memory_snapshot do_memory_map() const override;

  struct impl;  // blocks, free sets, segments, pending frees (caching_policy.cpp)
  std::unique_ptr<impl> impl_;
};

static_assert(allocator_policy<caching_policy>);

}  // namespace fragctl
