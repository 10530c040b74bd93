// The `buckets` policy: jemalloc-style size classes over an upstream policy
// (DESIGN.md, "The four policies"; docs/policies/buckets.md).
//
// ---------------------------------------------------------------------------
// Size classes
// ---------------------------------------------------------------------------
// Every pointer fragctl hands out is aligned to 512 bytes (min_alignment), so
// the quantum is q = 512 and every class is a multiple of q: slots of one
// class sit back to back in a slab, and a class that is not a multiple of q
// would misalign every other slot. 512 is the smallest class.
//
// Four classes per doubling. A request s with 2^k < s <= 2^(k+1) gets the
// first of the classes 2^k + j * 2^(k-2), j = 1..4, that holds it; the
// spacing inside the doubling is 2^(k-2). Below 4 KiB that spacing would be
// finer than q (2^(k-2) < 512 for k < 11, i.e. 640, 768, 896 are not
// multiples of 512), so there the classes are every multiple of q, which is
// what 512-byte alignment costs any allocator anyway:
//
//   index  class     spacing   slots per   slab tail      (slab = 2 MiB)
//                              slab        unused
//     0      512       512      4096          0
//     1     1024       512      2048          0
//     2     1536       512      1365        512
//     3     2048       512      1024          0
//     4     2560       512       819        512
//     5     3072       512       682       2048
//     6     3584       512       585        512
//     7     4096       512       512          0   <- q-spaced up to here
//     8     5120      1024       409       3072   <- 4 per doubling from here
//     9     6144      1024       341       2048
//    10     7168      1024       292       4096
//    11     8192      1024       256          0
//    12    10240      2048       204       8192
//    ...   (pattern: 5,6,7,8 x 2^(k-2) for 2^k = 8 KiB, 16 KiB, ...)
//    32   327680     65536         6     131072   (320 KiB)
//    33   393216     65536         5     131072   (384 KiB)
//    34   458752     65536         4     262144   (448 KiB)
//    35   524288     65536         4          0   (512 KiB)
//    36   655360    131072         3     131072   (640 KiB)
//    37   786432    131072         2     524288   (768 KiB: a quarter of the slab unused)
//    38   917504    131072         2     262144   (896 KiB)
//    39  1048576    131072         2          0   (1 MiB, the default limit)
//
// With the default buckets_limit of 1 MiB there are 40 classes. The classes
// are those no larger than buckets_limit; larger requests go upstream.
//
// Internal waste. For s <= 4 KiB the slot is round_up(s, 512): no waste
// beyond what alignment forces. For 2^k < s <= 2^(k+1), k >= 12, the slot
// exceeds s by less than the spacing 2^(k-2) < s/4, so the waste is under
// 25% of the request; and since every class there is at least 5 * 2^(k-2),
// under 20% of the slot. The worst case is s one byte above a class
// boundary, e.g. 4097 -> 5120 (24.98%). Slab tails (the right column) are
// extra: at most one slot minus 512 per slab, 25% only for the 768 KiB class.
//
// Size to class in O(1), no search. For s <= 4096: index = ceil(s/512) - 1.
// Otherwise let x = s - 1 and k = bit_width(x) - 1 (so 2^k <= x < 2^(k+1),
// i.e. 2^k < s <= 2^(k+1)); the two bits of x below its top bit pick the
// class inside the doubling: j = (x >> (k-2)) & 3, index = 8 + 4(k-12) + j,
// class = (5 + j) * 2^(k-2). Taking x = s - 1 makes each class boundary
// belong to the class below it (s = 5120 maps to 5120, 5121 to 6144).
//
// ---------------------------------------------------------------------------
// Slabs, slots, pointers
// ---------------------------------------------------------------------------
// A slab is slab_size bytes (default 2 MiB, one granule on H100/H200) taken
// from the upstream with one allocate(slab_size, stream); a class carves it
// into slab_size / class slots. Slab metadata lives on the host: the device
// memory is never touched. Per slab: a free stack of slot indices (an array
// of uint32, the intrusive index stack), a bump counter of slots never handed
// out (so a new slab costs no O(slots) set-up), and one "live" bit per slot
// that catches double frees.
//
// Pointer to slab in O(1) on free. The upstream only promises 512-byte
// alignment, so slabs are not slab_size-aligned in general, and
// over-allocating to align them would waste up to a slab per slab. Instead
// the address space is cut into cells of slab_size (cell = ptr >> log2 of
// slab_size), and a flat hash map from cell to the at most two slabs that
// intersect it (one ending in it, one starting in it; a slab is exactly one
// cell long, so no third one fits) finds the slab in one probe and one
// compare. Slot index = offset / class, by multiplying with a precomputed
// reciprocal ceil(2^32 / class), exact for every multiple of the class below
// 2^32; a pointer that is not a slot start fails the check
// index * class == offset.
//
// Streams. Slabs belong to a stream (the stream of the allocate that needed
// them). A slot freed on its slab's stream goes back on the slab's free
// stack and is reused at once on that stream. A slot freed on another stream
// T is held back; when some stream runs out of slots of a class, one event
// is recorded on each such T (covering all its held-back frees) and slots
// whose event has completed return to their slabs (the stamps and events
// are core's stream clock, whose theory block states the rule once). Slabs
// move between streams only through the upstream: an empty slab beyond
// slab_reserve (per class) is freed upstream on its stream, and the upstream
// applies the stream-order rule. Each allocate and free on the fast path is
// a few array operations: no heap allocation, no backend or upstream call, no
// hashing on allocate (the last stream's pool is cached) and one hash probe
// on free.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fragctl/backend.hpp"
#include "fragctl/config.hpp"
#include "fragctl/device_allocator.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/types.hpp"

namespace fragctl {

namespace buckets {

/// Spacing of the smallest classes, and the smallest class.
inline constexpr std::size_t quantum = min_alignment;
/// Classes up to this size are the multiples of `quantum`.
inline constexpr std::size_t linear_limit = 4096;
/// Number of quantum-spaced classes (512 .. 4096).
inline constexpr std::size_t linear_classes = linear_limit / quantum;

/// Index of the smallest class that holds `bytes` (>= 1). O(1), no search.
[[nodiscard]] constexpr std::size_t class_index(std::size_t bytes) noexcept {
  if (bytes <= linear_limit) return bytes == 0 ? 0 : (bytes - 1) / quantum;
  const std::size_t x = bytes - 1;
  const auto k = static_cast<std::size_t>(std::bit_width(x)) - 1;
  return linear_classes + 4 * (k - 12) + ((x >> (k - 2)) & 3);
}

/// Size in bytes of class `index`.
[[nodiscard]] constexpr std::size_t class_size(std::size_t index) noexcept {
  if (index < linear_classes) return (index + 1) * quantum;
  const std::size_t k = 12 + (index - linear_classes) / 4;
  const std::size_t j = (index - linear_classes) % 4;
  return (5 + j) << (k - 2);
}

/// Number of classes no larger than `limit` (0 when limit < quantum).
[[nodiscard]] constexpr std::size_t class_count(std::size_t limit) noexcept {
  if (limit < quantum) return 0;
  const std::size_t i = class_index(limit);
  return class_size(i) == limit ? i + 1 : i;
}

static_assert(class_size(0) == 512 && class_size(7) == 4096 && class_size(8) == 5120);
static_assert(class_size(11) == 8192 && class_size(39) == MiB && class_count(MiB) == 40);
static_assert(class_index(4096) == 7 && class_index(4097) == 8 && class_index(5121) == 9);

}  // namespace buckets

/// Size-class slabs for requests up to buckets_limit over an owned upstream
/// policy, which also serves every larger request. Stream order as
/// device_allocator says (slabs per stream, see the comment above). Pointers
/// are 512-aligned; allocation_size is the class size (the upstream's for
/// larger requests). Deallocate reports double frees, pointers that are not a
/// slot start, and sizes of another class. Not thread-safe (wrap it in
/// thread_safe_adaptor).
class buckets_policy final : public device_allocator {
 public:
  static constexpr std::string_view policy_name = "buckets";

  /// Serves requests up to cfg.buckets_limit from size classes carved from
  /// cfg.slab_size slabs of `upstream`, keeping up to cfg.slab_reserve empty
  /// slabs per class; larger requests pass to `upstream`, which the policy
  /// owns. Throws invalid_argument when upstream is null, or slab_size is not
  /// a power of two, is above 1 GiB, or is smaller than buckets_limit.
  buckets_policy(const config& cfg, std::unique_ptr<device_allocator> upstream);

  /// Returns every slab to the upstream (after waiting for held-back
  /// cross-stream frees). Slots still live are lost with their slab.
  ~buckets_policy() override;

  /// The wrapped policy.
  [[nodiscard]] device_allocator& upstream() const noexcept;
  /// Largest request served from a class (0 when none is).
  [[nodiscard]] std::size_t largest_class() const noexcept;
  /// Number of size classes in use.
  [[nodiscard]] std::size_t class_count() const noexcept;
  /// Slabs held from the upstream now, and how many of them are empty.
  [[nodiscard]] std::size_t slabs() const noexcept;
  [[nodiscard]] std::size_t empty_slabs() const noexcept;

 private:
  void* do_allocate(std::size_t bytes, stream_t stream) override;
  free_result do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override;
  std::size_t do_allocation_size(std::size_t bytes) const noexcept override;
  pool_state do_state() const override;
  void do_release_cached() override;
  void do_enable_peer_access(int peer) override;
  /// Slabs are live blocks of the upstream: it describes them.
  shared_memory do_share(void* ptr, std::size_t bytes) const override;
  std::optional<free_result> do_check_free(void* ptr, std::size_t bytes) const override;
  /// Its slots are reusable and its slabs join the default stream's pool.
  void do_stream_ending(stream_t stream) override;
  device_backend& do_backend() const noexcept override;
  std::string_view do_name() const noexcept override;
  // The upstream's layout: slabs appear as its live blocks.
  memory_snapshot do_memory_map() const override;

  struct impl;  // slabs, per-stream pools and fences (buckets_policy.cpp)
  std::unique_ptr<impl> impl_;
};

static_assert(allocator_policy<buckets_policy>);

}  // namespace fragctl
