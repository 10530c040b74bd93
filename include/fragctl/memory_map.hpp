// A snapshot of an allocator's memory layout: what `fragctl report` draws as
// the memory map and ranks as "top wasted regions" (docs/reports.md).
//
// A snapshot lists the regions the allocator holds from the backend
// (segments of the caching policy, mapped ranges of an arena) in address
// order, each cut into the blocks that tile it: live (handed out), free
// (reusable on the segment's stream), or pending (freed on another stream,
// reusable once that stream's work is done). Blocks of a segment are in
// address order and cover it exactly, so the free bytes of a segment are the
// waste a reader sees between its live blocks.
//
// A policy provides one through device_allocator::memory_map(); one that does
// not answers with `available == false` and no segments. Adaptors and
// pass-through wrappers answer with their upstream's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "fragctl/types.hpp"

namespace fragctl {

/// What a block of a snapshot is used for.
enum class block_use : std::uint8_t {
  live,     ///< handed out to a caller
  free,     ///< cached, reusable on its segment's stream
  pending,  ///< freed on another stream; reusable once an event completes
};

/// "live", "free" or "pending".
[[nodiscard]] std::string_view to_string(block_use use) noexcept;

/// One block of a segment.
struct memory_block {
  std::uintptr_t address = 0;
  std::size_t size = 0;       ///< bytes the block covers (after rounding)
  std::size_t requested = 0;  ///< the caller's request while live; 0 otherwise
  block_use use = block_use::free;
  stream_t stream = nullptr;  ///< stream the block was allocated or freed on

  friend bool operator==(const memory_block&, const memory_block&) = default;
};

/// One region held from the backend, tiled by its blocks.
struct memory_segment {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  stream_t stream = nullptr;  ///< stream the segment belongs to (nullptr: default or none)
  std::string pool;           ///< the policy's name for where it lives ("small", "large", ...)
  std::vector<memory_block> blocks;

  friend bool operator==(const memory_segment&, const memory_segment&) = default;
};

/// The layout of one allocator at one moment.
struct memory_snapshot {
  bool available = false;      ///< false: the policy does not describe its layout
  std::string allocator;       ///< name() of the allocator that described it
  std::vector<memory_segment> segments;  ///< in address order

  /// Sums over the segments.
  [[nodiscard]] std::size_t reserved_bytes() const noexcept;
  [[nodiscard]] std::size_t bytes(block_use use) const noexcept;
  [[nodiscard]] std::size_t block_count() const noexcept;
  /// Largest free block (pending blocks excluded).
  [[nodiscard]] std::size_t largest_free_block() const noexcept;

  friend bool operator==(const memory_snapshot&, const memory_snapshot&) = default;
};

/// The snapshot as JSON: {"available", "allocator", "segments": [{"address",
/// "size", "stream", "pool", "blocks": [{"address", "size", "requested",
/// "use", "stream"}]}]}. Addresses and streams are hex strings ("0x7f..."),
/// sizes integers. With more than `max_blocks` blocks in all, every segment
/// is written without its blocks and "blocks_omitted" is true.
[[nodiscard]] std::string to_json(const memory_snapshot& m, std::size_t max_blocks = SIZE_MAX);

/// Reads to_json's output back. Errors name the field that is wrong.
[[nodiscard]] absl::StatusOr<memory_snapshot> memory_snapshot_from_json(std::string_view json);

}  // namespace fragctl
