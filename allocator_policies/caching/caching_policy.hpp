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
// until an event recorded on that stream at free time has completed. Before
// segments go back to the backend, the streams they belong to are
// synchronized.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
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
  [[nodiscard]] std::size_t live_blocks() const noexcept { return live_.size(); }

 private:
  enum class block_state : std::uint8_t { free, allocated, pending };

  struct block {
    char* ptr = nullptr;
    std::size_t size = 0;
    std::size_t requested = 0;  ///< caller's request while allocated
    stream_t stream = nullptr;  ///< stream of the segment
    block* prev = nullptr;      ///< neighbours inside the segment
    block* next = nullptr;
    block_state state = block_state::free;
    bool small = false;  ///< in the small pool
  };

  // Entry of a free set: the key by value (no pointer chase while searching)
  // plus the block it stands for.
  struct free_entry {
    std::uintptr_t stream;
    std::size_t size;
    std::uintptr_t addr;
    block* node;
  };
  struct free_order {
    bool operator()(const free_entry& a, const free_entry& b) const noexcept {
      if (a.stream != b.stream) return a.stream < b.stream;
      if (a.size != b.size) return a.size < b.size;
      return a.addr < b.addr;
    }
  };
  using free_set = absl::btree_set<free_entry, free_order>;

  struct segment_info {
    std::size_t size;
    stream_t stream;
  };

  struct pending_free {
    block* node;
    event_t event;
  };

  void* do_allocate(std::size_t bytes, stream_t stream) override;
  free_result do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override;
  std::size_t do_allocation_size(std::size_t bytes) const noexcept override;
  pool_state do_state() const override;
  void do_release_cached() override;
  device_backend& do_backend() const noexcept override { return backend_; }
  std::string_view do_name() const noexcept override { return policy_name; }
  memory_snapshot do_memory_map() const override;

  [[nodiscard]] std::size_t segment_size_for(std::size_t rounded) const noexcept;
  [[nodiscard]] bool should_split(const block& b, std::size_t rounded) const noexcept;
  [[nodiscard]] block* take_free_block(free_set& pool, stream_t stream, std::size_t rounded);
  [[nodiscard]] block* new_segment(std::size_t bytes, stream_t stream, bool small);
  void* hand_out(block* b, std::size_t rounded, std::size_t requested);
  void free_block(block* b);
  void defer_free(block* b, stream_t stream) noexcept;
  void process_pending(bool wait);
  bool release_oversize_blocks(free_set& pool, stream_t stream, std::size_t rounded);
  void release_segments(const std::vector<block*>& heads);
  void release_all_free_segments();
  [[nodiscard]] std::size_t largest_free() const noexcept;
  [[noreturn]] void throw_oom(std::size_t requested);

  static free_entry entry_of(const block* b) noexcept {
    return {reinterpret_cast<std::uintptr_t>(b->stream), b->size,
            reinterpret_cast<std::uintptr_t>(b->ptr), const_cast<block*>(b)};
  }
  free_set& pool_of(const block* b) noexcept { return b->small ? small_free_ : large_free_; }

  void grow_nodes();
  block* new_node() noexcept;  // precondition: a spare node exists
  void recycle(block* b) noexcept;

  device_backend& backend_;
  std::size_t small_size_;
  std::size_t small_segment_;
  std::size_t large_segment_;
  std::size_t large_segment_limit_;
  std::size_t segment_round_;
  std::size_t max_split_size_;
  bool release_on_oom_;

  free_set small_free_;
  free_set large_free_;
  absl::flat_hash_map<void*, block*> live_;
  absl::flat_hash_map<void*, segment_info> segments_;
  std::vector<pending_free> pending_;
  std::vector<event_t> idle_events_;

  std::vector<std::unique_ptr<block[]>> node_chunks_;
  block* spare_nodes_ = nullptr;  // linked through `next`

  std::size_t reserved_ = 0;
  std::size_t allocated_ = 0;
  std::uint64_t retries_ = 0;
};

static_assert(allocator_policy<caching_policy>);

}  // namespace fragctl
