// The model the reliability checks hold an allocator against: which blocks
// are live, where, how big, on which stream, and what pattern they hold.
//
// A block is the range a caller asked for, [p, p + n); two live blocks must
// never overlap, whatever each was rounded to. Requested and rounded bytes
// are summed so that the allocator's counters can be compared with them. In
// backed mode each block carries a one-byte pattern over its first and last
// 4 KiB, checked before it is freed: a block another one overwrote, or whose
// pages were unmapped under it, shows up there.
//
// A failed check throws invariant_violation: a fuzz target lets it escape
// (libFuzzer reports the crash and the message), a test catches it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>

#include "fmt/format.h"
#include "fragctl/types.hpp"

namespace fragctl::fuzz {

/// An invariant of the allocator did not hold.
class invariant_violation : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

template <class... Args>
void check(bool ok, fmt::format_string<Args...> what, Args&&... args) {
  if (!ok) throw invariant_violation(fmt::format(what, std::forward<Args>(args)...));
}

/// Writes `id` over the first and last 4 KiB of [p, p + n).
inline void stamp(void* p, std::size_t n, std::uint8_t id) noexcept {
  const std::size_t edge = std::min<std::size_t>(n, 4096);
  std::memset(p, id, edge);
  std::memset(static_cast<char*>(p) + n - edge, id, edge);
}

/// True when stamp(p, n, id) is intact.
[[nodiscard]] inline bool stamped(const void* p, std::size_t n, std::uint8_t id) noexcept {
  const std::size_t edge = std::min<std::size_t>(n, 4096);
  const auto* b = static_cast<const std::uint8_t*>(p);
  for (std::size_t i = 0; i < edge; ++i) {
    if (b[i] != id || b[n - edge + i] != id) return false;
  }
  return true;
}

class block_model {
 public:
  struct block {
    std::size_t bytes = 0;    ///< requested
    std::size_t rounded = 0;  ///< allocation_size(bytes)
    stream_t stream = nullptr;
    std::uint8_t id = 0;      ///< pattern byte (backed mode)
  };

  /// Records a block the allocator returned; throws on null, misalignment or
  /// overlap with a live block.
  void insert(void* p, std::size_t bytes, std::size_t rounded, stream_t stream, std::uint8_t id = 0) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    check(p != nullptr, "allocate({}) returned nullptr", bytes);
    check(a % min_alignment == 0, "allocate({}) returned {:#x}, not aligned to {}", bytes, a, min_alignment);
    check(rounded >= bytes && rounded % min_alignment == 0, "allocation_size({}) = {} is not a rounding of it",
          bytes, rounded);
    check(a <= UINTPTR_MAX - bytes, "block [{:#x}, +{}) wraps the address space", a, bytes);
    if (const block* other = overlapping(a, bytes)) {
      throw invariant_violation(fmt::format("allocate({}) returned [{:#x}, +{}), which overlaps a live block of {} bytes",
                                            bytes, a, bytes, other->bytes));
    }
    blocks_.emplace(a, block{bytes, rounded, stream, id});
    requested_ += bytes;
    rounded_ += rounded;
  }

  /// Forgets a live block.
  void erase(void* p) {
    const auto it = blocks_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == blocks_.end()) return;
    requested_ -= it->second.bytes;
    rounded_ -= it->second.rounded;
    blocks_.erase(it);
  }

  /// The live block starting at p, or nullptr.
  [[nodiscard]] const block* find(const void* p) const {
    const auto it = blocks_.find(reinterpret_cast<std::uintptr_t>(p));
    return it == blocks_.end() ? nullptr : &it->second;
  }

  /// A live block overlapping [a, a + n), or nullptr.
  [[nodiscard]] const block* overlapping(std::uintptr_t a, std::size_t n) const {
    auto next = blocks_.lower_bound(a);
    if (next != blocks_.end() && next->first - a < n) return &next->second;
    if (next == blocks_.begin()) return nullptr;
    const auto prev = std::prev(next);
    return prev->first + prev->second.bytes > a ? &prev->second : nullptr;
  }

  /// The i-th live block in address order (i < size()).
  [[nodiscard]] std::pair<void*, block> at(std::size_t i) const {
    auto it = blocks_.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(i));
    return {reinterpret_cast<void*>(it->first), it->second};
  }

  /// Calls f(pointer, block) for every live block in address order.
  template <class F>
  void for_each(F f) const {
    for (const auto& [a, b] : blocks_) f(reinterpret_cast<void*>(a), b);
  }

  /// Every live block allocated on `from` is on `to` from now on (a stream
  /// that ended: its blocks belong to the default stream).
  void move_stream(stream_t from, stream_t to) {
    for (auto& [a, b] : blocks_) {
      if (b.stream == from) b.stream = to;
    }
  }

  /// Checks every live block's pattern (backed mode).
  void check_patterns() const {
    for (const auto& [a, b] : blocks_) {
      check(stamped(reinterpret_cast<const void*>(a), b.bytes, b.id),
            "the data of the live block [{:#x}, +{}) changed: another block or an unmap overwrote it", a, b.bytes);
    }
  }

  [[nodiscard]] std::size_t size() const noexcept { return blocks_.size(); }
  [[nodiscard]] bool empty() const noexcept { return blocks_.empty(); }
  [[nodiscard]] std::size_t requested() const noexcept { return requested_; }
  [[nodiscard]] std::size_t rounded() const noexcept { return rounded_; }

 private:
  std::map<std::uintptr_t, block> blocks_;
  std::size_t requested_ = 0;
  std::size_t rounded_ = 0;
};

}  // namespace fragctl::fuzz
