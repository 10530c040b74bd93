// The `arena` policy: one contiguous address range per device, physical
// pages mapped on demand and stitched to wherever live memory is, so the
// memory held follows the live bytes (docs/policies/arena.md; the theory is
// at the top of arena_policy.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "fragctl/backend.hpp"
#include "fragctl/config.hpp"
#include "fragctl/device_allocator.hpp"
#include "fragctl/policy.hpp"

namespace fragctl {

/// Best-fit (segregated, near exact) allocation with coalescing inside one
/// reserved virtual range; physical memory is mapped, in spans of up to
/// `map_chunk` bytes, where a block first touches unmapped granules, and a
/// span is unmapped, its handle pooled and re-mapped elsewhere, once no live
/// block touches it.
///
/// Options (config): `arena_size` caps the physical memory the arena holds
/// (0 = the device's total memory, rounded up to the granularity); twice that
/// much address space is reserved, so that address-space fragmentation can
/// never be what runs out. `map_chunk` is the largest span (0 or the
/// granularity: one handle per granule). `release_threshold` is how many
/// bytes of wholly free spans stay mapped indefinitely; free spans beyond it
/// are unmapped into the pool, oldest first, once they stayed free for
/// `release_delay` allocator calls (allocations plus frees; 0 = as soon as
/// their frees are complete). The hysteresis keeps memory a training loop
/// frees and takes again mapped across steps. Free spans are taken
/// (re-stitched) or given back wherever memory is needed before any new
/// physical memory is created, so neither setting raises the peak memory
/// held. Without virtual memory the arena is one raw block of
/// `fallback_size` bytes (0 = 90% of the device's free memory at
/// construction) managed the same way, without mapping; reserved is then the
/// block's size. `wait_before_growing` (default true): before creating
/// physical memory above the most it has held while a cached span waits on
/// frees still in flight, wait for them and re-stitch the span (a host wait
/// instead of growth); below that mark it creates. `lifetime_placement`
/// (default true): a block whose size's last block lived at least 8,000
/// calls goes next to a long-lived block where that is mapped, rather than
/// into a hole short-lived blocks left (arena_policy.cpp, "Blocks that
/// outlive a step").
///
/// Stream order: as device_allocator says. Same-stream reuse is immediate;
/// another stream gets a freed block once an event recorded on the freeing
/// stream (lazily, one per stream covering all its frees so far) completed.
/// A granule is unmapped only once the frees that touched it are complete.
///
/// Pointers are aligned to 512 bytes and sizes rounded up to 512. A size
/// given to deallocate must equal the size given to allocate (else
/// size_mismatch; the block is still freed). Not thread-safe (wrap it in
/// thread_safe_adaptor).
///
/// pause() and resume() (device_allocator) work over virtual memory: the
/// spans under live blocks are unmapped and released, their addresses kept,
/// and mapped anew by resume() (granule_map.hpp, "Pause and resume"); host
/// copies, when kept, go through the device's default stream. The fallback
/// block cannot pause.
class arena_policy final : public device_allocator {
 public:
  static constexpr std::string_view policy_name = "arena";

  /// Reserves the address range (or allocates the fallback block) on
  /// `backend`, which must outlive the policy. Throws backend_error when the
  /// reservation fails, out_of_memory when the fallback block cannot be
  /// allocated, invalid_argument for an unusable size.
  arena_policy(const config& cfg, device_backend& backend);
  /// Waits for pending frees, then unmaps and releases every granule and
  /// handle and the range (or frees the fallback block), live blocks or not.
  ~arena_policy() override;

  /// Whether the arena maps granules on demand (false: the fallback block).
  [[nodiscard]] bool uses_virtual_memory() const noexcept;
  /// Bytes of address space reserved (virtual memory) or of the fallback block.
  [[nodiscard]] std::size_t range_bytes() const noexcept;
  /// Bytes of physical handles held but mapped nowhere (virtual memory only).
  [[nodiscard]] std::size_t pooled_bytes() const noexcept;
  /// Bytes of address space whose memory pause() gave back (0 when not paused).
  [[nodiscard]] std::size_t paused_bytes() const noexcept;

 private:
  void* do_allocate(std::size_t bytes, stream_t stream) override;
  free_result do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override;
  std::size_t do_allocation_size(std::size_t bytes) const noexcept override;
  pool_state do_state() const override;
  memory_snapshot do_memory_map() const override;
  void do_release_cached() override;
  bool do_pause(pause_keep keep) override;
  bool do_resume() override;
  bool do_paused() const override;
  void do_enable_peer_access(int peer) override;
  /// The spans under the range, each exported; the fallback block as a raw allocation.
  shared_memory do_share(void* ptr, std::size_t bytes) const override;
  std::optional<free_result> do_check_free(void* ptr, std::size_t bytes) const override;
  /// The clock takes its frees as complete: blocks and granules freed on it
  /// are free on every stream. No handle is kept elsewhere.
  void do_stream_ending(stream_t stream) override;
  device_backend& do_backend() const noexcept override;
  std::string_view do_name() const noexcept override;

  struct impl;
  std::unique_ptr<impl> impl_;
};

static_assert(allocator_policy<arena_policy>);

}  // namespace fragctl
