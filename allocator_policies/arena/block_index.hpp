// The arena's blocks: a tiling of one address range into free and live
// blocks, with O(1) good-fit search, split and coalesce.
//
// Every block is a node in a vector; nodes of neighbouring addresses are
// doubly linked (boundary tags), so a freed block finds its neighbours
// without a search. Free blocks sit in segregated lists, two-level as in
// TLSF: sizes are counted in 512-byte units u; units below 64 get one exact
// class each, and from 64 on every doubling [2^k, 2^(k+1)) is cut into 64
// classes of equal width, so a class spans at most 1/64 (1.6%) of its sizes.
// One bit per non-empty class (and one per group of 64 classes) finds the
// next non-empty class above a size with two count-trailing-zeros.
//
// Search (near best fit): first the request's own class, whose blocks may be
// smaller or larger than the request, keeping the smallest that fits among
// its first few entries; then the first non-empty class above it, where every
// block fits. Live blocks are found by address in a hash table
// (address_table: one probe reads one slot, where a general hash map reads
// its metadata first; the free path's first memory access).
//
// Stream order. A free block carries the stamp of its latest frees and the
// *dirty* interval those frees cover; the rest of the block is clean (no work
// pending). Coalescing keeps the hull of the dirty parts, so a small block
// freed next to a large clean one does not taint it: a stream that may not
// use the dirty part yet takes a clean prefix or suffix instead. Blocks with
// pending frees on two different streams are not coalesced (until one of
// them is complete), nor two blocks of one stream whose hull would taint more
// clean memory than they have dirty.
//
// Not thread-safe. allocate() and release() never allocate memory once
// prepare() succeeded, so the hot path makes no heap allocation.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "core/stream_clock.hpp"

namespace fragctl::arena_detail {

inline constexpr std::uint32_t nil = UINT32_MAX;

/// Block ids by address: open addressing with linear probing over one array
/// of (address, id, tag) slots, at most half full, erased by shifting the
/// probe run back (no tombstones), so a lookup reads the slots of one short
/// run. The tag is 32 bits the owner keeps with the entry, in what would be
/// the slot's padding (block_index: the block's size in units, so that a
/// free learns it without reading the block first). insert() never
/// allocates: reserve() first. Not thread-safe.
class address_table {
 public:
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// How many entries fit without growing.
  [[nodiscard]] std::size_t room() const noexcept { return slots_.size() / 2; }
  /// Makes room for `n` entries (keeps the entries). Throws std::bad_alloc.
  void reserve(std::size_t n);
  void clear() noexcept {
    std::fill(slots_.begin(), slots_.end(), slot{});
    size_ = 0;
  }
  /// Adds `addr` (not present) with `id` and `tag`; size() < room() must hold.
  void insert(std::uintptr_t addr, std::uint32_t id, std::uint32_t tag = 0) noexcept {
    std::size_t i = home(addr);
    while (slots_[i].id != nil) i = (i + 1) & mask_;
    slots_[i] = {addr, id, tag};
    ++size_;
  }
  /// An entry taken: its id (nil when the address was absent) and tag.
  struct entry {
    std::uint32_t id = nil;
    std::uint32_t tag = 0;
  };
  /// Removes `addr` and returns its entry; id nil when absent.
  [[nodiscard]] entry take_entry(std::uintptr_t addr) noexcept {
    if (slots_.empty()) return {};
    for (std::size_t i = home(addr);; i = (i + 1) & mask_) {
      if (slots_[i].id == nil) return {};
      if (slots_[i].addr == addr) {
        const entry e{slots_[i].id, slots_[i].tag};
        erase_at(i);
        return e;
      }
    }
  }
  /// Removes `addr` and returns its id; nil when absent.
  [[nodiscard]] std::uint32_t take(std::uintptr_t addr) noexcept { return take_entry(addr).id; }
  /// The id of `addr`, left in place; nil when absent.
  [[nodiscard]] std::uint32_t find(std::uintptr_t addr) const noexcept {
    if (slots_.empty()) return nil;
    for (std::size_t i = home(addr);; i = (i + 1) & mask_) {
      if (slots_[i].id == nil || slots_[i].addr == addr) return slots_[i].id;
    }
  }

 private:
  struct slot {
    std::uintptr_t addr = 0;
    std::uint32_t id = nil;  // nil: empty
    std::uint32_t tag = 0;
  };
  /// Fibonacci hashing of the 512-byte unit number.
  [[nodiscard]] std::size_t home(std::uintptr_t addr) const noexcept {
    return static_cast<std::size_t>(((addr >> 9) * UINT64_C(0x9E3779B97F4A7C15)) >> shift_);
  }
  void erase_at(std::size_t i) noexcept {
    for (std::size_t j = (i + 1) & mask_; slots_[j].id != nil; j = (j + 1) & mask_) {
      // Slot j may move to the hole at i unless its home lies cyclically in (i, j].
      const std::size_t k = home(slots_[j].addr);
      if (((j - k) & mask_) >= ((j - i) & mask_)) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = slot{};
    --size_;
  }

  std::vector<slot> slots_;  // a power of two long, or empty
  std::size_t mask_ = 0;
  unsigned shift_ = 63;
  std::size_t size_ = 0;
};

/// What a live block's node keeps for its owner: the arena's lifetime
/// placement (arena_policy.cpp) writes when the block was allocated (its
/// count of calls, modulo 2^32) and whether it was expected to live long.
/// Both sit in what was the node's padding.
struct block_birth {
  std::uint32_t born = 0;
  bool long_lived = false;
};

class block_index {
 public:
  /// Granularity of every block's address and size.
  static constexpr std::size_t unit = 512;

  struct block {
    std::uintptr_t addr = 0;
    std::size_t size = 0;
    std::size_t requested = 0;  // caller's size, while live
    free_stamp stamp;           // latest frees, while free; none when clean
    std::uintptr_t dirty_lo = 0, dirty_hi = 0;       // part the stamp covers
    std::uint32_t prev = nil, next = nil;            // address neighbours
    std::uint32_t prev_free = nil, next_free = nil;  // class list, while free
    bool is_free = false;
    // The owner's, while live (block_index only writes them): what
    // allocate() and allocate_at() were given (birth).
    bool long_lived = false;
    std::uint32_t born = 0;
  };
  using birth = block_birth;

  /// Where a found block is cut: its first or its last bytes.
  enum class side : std::uint8_t { front, back };
  struct fit {
    std::uint32_t id = nil;
    side at = side::front;
    std::uint32_t blocked = free_stamp::none;  // stream whose pending frees were passed over
    [[nodiscard]] explicit operator bool() const noexcept { return id != nil; }
  };

  /// Starts over with one clean free block [base, base + bytes) (bytes a multiple of unit).
  void reset(std::uintptr_t base, std::size_t bytes);

  /// Makes sure the next allocate() or allocate_at() needs no memory.
  /// Throws std::bad_alloc.
  void prepare() {
    if (spare_ == nil || nodes_[spare_].next_free == nil) grow();
    if (live_.size() >= live_.room()) live_.reserve(2 * live_.size() + 64);
  }
  /// prepare() for `count` allocations in a row: room for their nodes and
  /// live entries, so that none of them allocates host memory.
  void prepare_for(std::size_t count) {
    std::size_t spare = 0;
    for (std::uint32_t id = spare_; id != nil && spare < 2 * count + 2; id = nodes_[id].next_free) ++spare;
    while (spare < 2 * count + 2) {
      const std::size_t before = nodes_.size();
      grow();
      spare += nodes_.size() - before;
    }
    if (live_.size() + count >= live_.room()) live_.reserve(2 * (live_.size() + count) + 64);
  }

  /// A free block with at least `bytes` usable on stream `stream`, or none.
  /// The result names the stream whose pending frees kept a better-fitting
  /// block from being chosen, if any, so the caller may refresh it and retry.
  [[nodiscard]] fit find_fit(std::size_t bytes, std::uint32_t stream, const stream_clock& clock) const noexcept;

  /// Makes [at, at + bytes) of free block `id` live, leaving what is below
  /// and above it free. `at` is a multiple of unit inside the block, and the
  /// whole block must be usable on the caller's stream. Call prepare() first.
  std::uintptr_t allocate_at(std::uint32_t id, std::uintptr_t at, std::size_t bytes, std::size_t requested,
                             birth b = {});

  /// Makes `bytes` of the found block live (at its front or back), leaving
  /// the rest free. Call prepare() first. Returns the address.
  std::uintptr_t allocate(fit where, std::size_t bytes, std::size_t requested, birth b = {}) noexcept;

  /// Where allocate(where, bytes, ...) will place the block.
  [[nodiscard]] std::uintptr_t address_of(fit where, std::size_t bytes) const noexcept {
    const block& b = nodes_[where.id];
    return where.at == side::front ? b.addr : b.addr + b.size - bytes;
  }

  /// Forgets the live block at `addr` and returns it (nil if there is none);
  /// release() must follow.
  [[nodiscard]] std::uint32_t take_live(std::uintptr_t addr) noexcept { return live_.take(addr); }
  /// The live block at `addr`, left live; nil if there is none.
  [[nodiscard]] std::uint32_t find_live(std::uintptr_t addr) const noexcept { return live_.find(addr); }
  /// A live block taken by take_sized(): its id (nil if there was none) and
  /// its size, read from the live-block table rather than the block's node,
  /// so that a free can go on with the size while the node is still loading.
  struct taken {
    std::uint32_t id = nil;
    std::size_t size = 0;
  };
  /// take_live(), with the block's size.
  [[nodiscard]] taken take_sized(std::uintptr_t addr) noexcept {
    const address_table::entry e = live_.take_entry(addr);
    if (e.id == nil) return {};
    // Tag 0: a size of 2^32 units or more, kept in the node only.
    return {e.id, e.tag != 0 ? std::size_t{e.tag} * unit : nodes_[e.id].size};
  }

  /// Frees block `id` (from take_live) with `stamp`, coalescing with free neighbours.
  void release(std::uint32_t id, free_stamp stamp, const stream_clock& clock) noexcept;

  [[nodiscard]] const block& at(std::uint32_t id) const noexcept { return nodes_[id]; }
  [[nodiscard]] std::size_t live_count() const noexcept { return live_.size(); }

  /// Calls f(block) for every block, live or free, in address order (node 0
  /// always starts the range: a split keeps the lower part in the node it
  /// cuts, a merge keeps the lower node).
  template <class F>
  void for_each_in_order(F&& f) const {
    if (nodes_.empty()) return;
    for (std::uint32_t id = 0; id != nil; id = nodes_[id].next) f(nodes_[id]);
  }
  /// Calls f(block) for every free block, in no particular order.
  template <class F>
  void for_each_free(F&& f) const {
    for (const block& b : nodes_) {
      if (b.is_free) f(b);
    }
  }
  /// Calls f(id, block) for free blocks of at least `bytes`, about smallest
  /// first: the request's own size class (whose blocks may be smaller; those
  /// are skipped), then each non-empty class above it; at most `limit` blocks
  /// looked at in all.
  template <class F>
  void for_each_fitting(std::size_t bytes, int limit, F&& f) const {
    const size_class own = class_of(bytes);
    for (std::uint32_t id = heads_[own.group][own.sl]; id != nil && limit > 0; id = nodes_[id].next_free, --limit) {
      if (nodes_[id].size >= bytes) f(id, nodes_[id]);
    }
    for (std::optional<size_class> c = next_class(own); c && limit > 0; c = next_class(*c)) {
      for (std::uint32_t id = heads_[c->group][c->sl]; id != nil && limit > 0; id = nodes_[id].next_free, --limit) {
        f(id, nodes_[id]);
      }
    }
  }
  /// Calls f(id, block) for every free block, in no particular order.
  template <class F>
  void for_each_free_id(F&& f) const {
    for (std::uint32_t id = 0; id < nodes_.size(); ++id) {
      if (nodes_[id].is_free) f(id, nodes_[id]);
    }
  }

 private:
  static constexpr unsigned sl_bits = 6;
  static constexpr std::size_t sl_count = std::size_t{1} << sl_bits;
  static constexpr std::size_t group_count = 64;
  // Entries of a class list looked at before moving on.
  static constexpr int scan_limit = 8;

  struct size_class {
    unsigned group;
    unsigned sl;
  };
  [[nodiscard]] static size_class class_of(std::size_t bytes) noexcept {
    const std::size_t u = bytes / unit;
    if (u < sl_count) return {0, static_cast<unsigned>(u)};
    const unsigned fl = static_cast<unsigned>(std::bit_width(u)) - 1;
    return {fl - sl_bits + 1, static_cast<unsigned>((u >> (fl - sl_bits)) & (sl_count - 1))};
  }
  /// The first non-empty class strictly above c, if any.
  [[nodiscard]] std::optional<size_class> next_class(size_class c) const noexcept {
    const std::uint64_t above = c.sl + 1 < sl_count ? sl_map_[c.group] & (~std::uint64_t{0} << (c.sl + 1)) : 0;
    if (above != 0) return size_class{c.group, static_cast<unsigned>(std::countr_zero(above))};
    const std::uint64_t groups =
        c.group + 1 < group_count ? group_map_ & (~std::uint64_t{0} << (c.group + 1)) : 0;
    if (groups == 0) return std::nullopt;
    const auto g = static_cast<unsigned>(std::countr_zero(groups));
    return size_class{g, static_cast<unsigned>(std::countr_zero(sl_map_[g]))};
  }

  /// Which side of free block b can hold `bytes` for `stream`, if any.
  [[nodiscard]] static std::optional<side> usable(const block& b, std::size_t bytes, std::uint32_t stream,
                                                  const stream_clock& clock) noexcept {
    if (clock.usable_on(b.stamp, stream)) return side::front;
    if (b.dirty_lo - b.addr >= bytes) return side::front;
    if (b.addr + b.size - b.dirty_hi >= bytes) return side::back;
    return std::nullopt;
  }
  /// Whether free neighbours a (lower) and b may coalesce. Not when both
  /// have pending frees on different streams; not when both have pending
  /// frees on one stream and the clean memory between their dirty parts,
  /// which the merged block's dirty interval would cover, is larger than the
  /// dirty parts themselves (other streams could use it now).
  [[nodiscard]] static bool joinable(const block& a, const block& b, const stream_clock& clock) noexcept {
    if (clock.complete(a.stamp) || clock.complete(b.stamp)) return true;
    if (a.stamp.stream != b.stamp.stream) return false;
    const std::size_t gap = (a.addr + a.size - a.dirty_hi) + (b.dirty_lo - b.addr);
    return gap <= (a.dirty_hi - a.dirty_lo) + (b.dirty_hi - b.dirty_lo);
  }
  /// Coalesces free block `hi` (in no class list) into its lower neighbour
  /// `lo` (in no class list); they must be joinable.
  void absorb(std::uint32_t lo, std::uint32_t hi, const stream_clock& clock) noexcept;
  /// Clips b's dirty interval to b after b shrank; clean when nothing is left.
  static void clip(block& b) noexcept {
    b.dirty_lo = std::max(b.dirty_lo, b.addr);
    b.dirty_hi = std::min(b.dirty_hi, b.addr + b.size);
    if (b.dirty_lo >= b.dirty_hi) b.stamp = free_stamp{};
    if (b.stamp.stream == free_stamp::none) b.dirty_lo = b.dirty_hi = b.addr;
  }

  /// A live block's size as its table tag: in units, 0 when it does not fit.
  [[nodiscard]] static std::uint32_t units_tag(std::size_t bytes) noexcept {
    return bytes / unit <= UINT32_MAX ? static_cast<std::uint32_t>(bytes / unit) : 0;
  }
  void grow();
  [[nodiscard]] std::uint32_t take_spare() noexcept {
    const std::uint32_t id = spare_;
    spare_ = nodes_[id].next_free;
    return id;
  }
  void link_free(std::uint32_t id) noexcept;
  void unlink_free(std::uint32_t id) noexcept;
  /// Removes `id` (merged into its predecessor) from the address list and recycles it.
  void drop(std::uint32_t id) noexcept;

  std::vector<block> nodes_;
  std::uint32_t spare_ = nil;  // recycled nodes, chained through next_free
  std::array<std::array<std::uint32_t, sl_count>, group_count> heads_{};
  std::array<std::uint64_t, group_count> sl_map_{};
  std::uint64_t group_map_ = 0;
  address_table live_;
};

// --- Hot paths, inline -------------------------------------------------------

inline block_index::fit block_index::find_fit(std::size_t bytes, std::uint32_t stream,
                                              const stream_clock& clock) const noexcept {
  const size_class own = class_of(bytes);
  fit best;
  std::uint32_t blocked = free_stamp::none;
  const auto consider = [&](const block& b, std::uint32_t id) {
    if (const std::optional<side> s = usable(b, bytes, stream, clock)) {
      best = {id, *s, blocked};
      return true;
    }
    if (blocked == free_stamp::none) blocked = b.stamp.stream;
    return false;
  };
  int seen = 0;
  for (std::uint32_t id = heads_[own.group][own.sl]; id != nil && seen < scan_limit;
       id = nodes_[id].next_free, ++seen) {
    const block& b = nodes_[id];
    if (b.size < bytes || (best && b.size >= nodes_[best.id].size)) continue;
    if (consider(b, id) && b.size == bytes) break;
  }
  if (best) return best;
  for (std::optional<size_class> c = next_class(own); c; c = next_class(*c)) {
    seen = 0;
    for (std::uint32_t id = heads_[c->group][c->sl]; id != nil && seen < scan_limit;
         id = nodes_[id].next_free, ++seen) {
      if (consider(nodes_[id], id)) return best;
    }
  }
  return {nil, side::front, blocked};
}

inline std::uintptr_t block_index::allocate(fit where, std::size_t bytes, std::size_t requested, birth n) noexcept {
  std::uint32_t id = where.id;
  unlink_free(id);
  if (nodes_[id].size > bytes) {
    std::uint32_t rest = take_spare();
    block& b = nodes_[id];
    block& r = nodes_[rest];
    r = b;
    r.prev_free = r.next_free = nil;
    if (where.at == side::front) {
      // b keeps [addr, addr + bytes); r is the rest above it.
      r.addr = b.addr + bytes;
      r.size = b.size - bytes;
      r.prev = id;
      if (b.next != nil) nodes_[b.next].prev = rest;
      b.next = rest;
      b.size = bytes;
    } else {
      // b keeps its lower part free; r is the live block at its end.
      r.addr = b.addr + b.size - bytes;
      r.size = bytes;
      r.prev = id;
      if (b.next != nil) nodes_[b.next].prev = rest;
      b.next = rest;
      b.size -= bytes;
      std::swap(id, rest);
    }
    block& f = nodes_[rest];
    clip(f);
    link_free(rest);
  }
  block& b = nodes_[id];
  b.is_free = false;
  b.requested = requested;
  b.stamp = free_stamp{};
  b.born = n.born;
  b.long_lived = n.long_lived;
  live_.insert(b.addr, id, units_tag(b.size));
  return b.addr;
}

inline void block_index::release(std::uint32_t id, free_stamp stamp, const stream_clock& clock) noexcept {
  block& b = nodes_[id];
  b.is_free = true;
  b.stamp = stamp;
  b.dirty_lo = b.addr;
  b.dirty_hi = b.addr + b.size;
  if (const std::uint32_t n = b.next; n != nil && nodes_[n].is_free && joinable(b, nodes_[n], clock)) {
    unlink_free(n);
    absorb(id, n, clock);
  }
  if (const std::uint32_t p = nodes_[id].prev; p != nil && nodes_[p].is_free && joinable(nodes_[p], nodes_[id], clock)) {
    unlink_free(p);
    absorb(p, id, clock);
    id = p;
  }
  link_free(id);
}

inline void block_index::absorb(std::uint32_t lo, std::uint32_t hi, const stream_clock& clock) noexcept {
  block& a = nodes_[lo];
  const block& b = nodes_[hi];
  const bool a_clean = clock.complete(a.stamp);
  const bool b_clean = clock.complete(b.stamp);
  if (!a_clean && !b_clean) {
    if (b.stamp.tick > a.stamp.tick) a.stamp = b.stamp;
    a.dirty_hi = b.dirty_hi;
  } else if (!b_clean) {
    a.stamp = b.stamp;
    a.dirty_lo = b.dirty_lo;
    a.dirty_hi = b.dirty_hi;
  } else if (a_clean) {
    a.stamp = free_stamp{};
  }
  a.size += b.size;
  drop(hi);
  clip(a);
}

inline void block_index::link_free(std::uint32_t id) noexcept {
  const size_class c = class_of(nodes_[id].size);
  std::uint32_t& head = heads_[c.group][c.sl];
  nodes_[id].prev_free = nil;
  nodes_[id].next_free = head;
  if (head != nil) nodes_[head].prev_free = id;
  head = id;
  sl_map_[c.group] |= std::uint64_t{1} << c.sl;
  group_map_ |= std::uint64_t{1} << c.group;
}

inline void block_index::unlink_free(std::uint32_t id) noexcept {
  block& b = nodes_[id];
  if (b.prev_free != nil) {
    nodes_[b.prev_free].next_free = b.next_free;
  } else {
    const size_class c = class_of(b.size);
    heads_[c.group][c.sl] = b.next_free;
    if (b.next_free == nil) {
      sl_map_[c.group] &= ~(std::uint64_t{1} << c.sl);
      if (sl_map_[c.group] == 0) group_map_ &= ~(std::uint64_t{1} << c.group);
    }
  }
  if (b.next_free != nil) nodes_[b.next_free].prev_free = b.prev_free;
  b.prev_free = b.next_free = nil;
}

inline void block_index::drop(std::uint32_t id) noexcept {
  block& b = nodes_[id];
  if (b.prev != nil) nodes_[b.prev].next = b.next;
  if (b.next != nil) nodes_[b.next].prev = b.prev;
  b = block{};
  b.next_free = spare_;
  spare_ = id;
}

}  // namespace fragctl::arena_detail
