// The `graph_pool` policy: the private pool of a CUDA graph (PyTorch's
// torch.cuda.graph and graph trees; docs/policies/graph_pool.md).
//
// A captured graph replays into the addresses its allocations had at capture
// time, whoever owns them by then. So while graphs may replay into a pool,
// none of the pool's memory may go back to the device or to anyone outside
// the pool: a block the program frees stays in the pool, reusable by later
// allocations (later captures) into the same pool. This wrapper does that
// over an upstream built only for it (graph_pool_upstream_config keeps it
// from giving memory back on its own):
//
//  * A block freed on the stream it was allocated on is kept in the pool,
//    still allocated upstream, and handed out again to a request of the same
//    size on the same stream (the exact-size reuse PyTorch's captures see:
//    same sizes on the same stream each step), oldest freed first.
//  * A block freed on another stream goes to the upstream, which keeps it
//    until that stream's work is done (the stream-order rule) and may carve
//    it for any later request of the pool.
//  * When the upstream has no memory left, the kept blocks go to the
//    upstream (still the pool's) and the request is tried once more.
//  * release_cached keeps everything: the pool's memory goes back to the
//    device when the pool is destroyed.
//  * claim(ptr) makes the next request of that block's size on its stream
//    return that very block: restoring a pool to a checkpoint (PyTorch's
//    setCheckpointPoolState) gives graphs back the addresses they were
//    captured with.
//
// Statistics: blocks kept in the pool count as cached, not allocated
// (pool_state), and as free in the memory map. The pool keeps its live
// blocks' request sizes and streams (block_info).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "fragctl/config.hpp"
#include "fragctl/device_allocator.hpp"
#include "fragctl/policy.hpp"

namespace fragctl {

/// `cfg` as the upstream of a graph pool is built with: release_on_oom off
/// (caching keeps its segments on out-of-memory) and release_threshold at
/// its largest (arena keeps its granules mapped).
[[nodiscard]] config graph_pool_upstream_config(const config& cfg);

/// A CUDA graph's private pool over an owned upstream (see above). Not
/// thread-safe (wrap it in thread_safe_adaptor).
class graph_pool_policy final : public device_allocator {
 public:
  static constexpr std::string_view policy_name = "graph_pool";

  graph_pool_policy(const config& cfg, std::unique_ptr<device_allocator> upstream);
  /// Gives the kept blocks to the upstream, which the policy then destroys.
  ~graph_pool_policy() override;

  /// The wrapped policy.
  [[nodiscard]] device_allocator& upstream() const noexcept { return *upstream_; }
  /// Marks `ptr`, a block kept in the pool, as the one the next request of
  /// its size on its stream gets; returns that size and stream, or
  /// std::nullopt when `ptr` is not kept in the pool (live, handed to the
  /// upstream, or foreign).
  [[nodiscard]] std::optional<block_record> claim(void* ptr);
  /// Blocks kept in the pool now, and their bytes after the upstream's rounding.
  [[nodiscard]] std::size_t kept_blocks() const noexcept { return kept_.size(); }
  [[nodiscard]] std::size_t kept_bytes() const noexcept { return kept_bytes_; }

 private:
  struct kept_block {
    void* ptr;
    stream_t stream;
  };
  using kept_index = std::multimap<std::size_t, kept_block>;  // request size -> block, oldest first

  void* do_allocate(std::size_t bytes, stream_t stream) override;
  free_result do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override;
  std::size_t do_allocation_size(std::size_t bytes) const noexcept override {
    return upstream_->allocation_size(bytes);
  }
  pool_state do_state() const override;
  void do_release_cached() override {}
  device_backend& do_backend() const noexcept override { return upstream_->backend(); }
  std::string_view do_name() const noexcept override { return name_; }
  memory_snapshot do_memory_map() const override;
  std::optional<block_record> do_block_info(void* ptr) const override;
  void do_enable_peer_access(int peer) override { upstream_->enable_peer_access(peer); }
  shared_memory do_share(void* ptr, std::size_t bytes) const override;
  std::optional<free_result> do_check_free(void* ptr, std::size_t bytes) const override;
  /// Live and kept blocks of the stream become the default stream's.
  void do_stream_ending(stream_t stream) override;

  void* reuse(std::size_t bytes, stream_t stream);
  void take(kept_index::iterator it);
  void return_kept() noexcept;

  std::unique_ptr<device_allocator> upstream_;
  std::string name_;
  absl::flat_hash_map<void*, block_record> live_;
  kept_index kept_;
  absl::flat_hash_map<void*, kept_index::iterator> kept_by_ptr_;
  std::size_t kept_bytes_ = 0;
  void* claimed_ = nullptr;
  std::uint64_t retries_ = 0;
};

static_assert(allocator_policy<graph_pool_policy>);

}  // namespace fragctl
