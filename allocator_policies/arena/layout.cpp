#include "allocator_policies/arena/layout.hpp"

#include <algorithm>
#include <numeric>

namespace fragctl::arena_detail {

namespace {

// Allocations of the step per time bucket: a bucket holds the blocks live in
// it (about the step's live count) and those born in it (at most kBucket).
constexpr std::uint32_t kBucket = 64;
// A block whose candidates (the blocks filed in its buckets) are more than
// 1/kScanShare of those placed walks every placed block in order instead of
// sorting its candidates.
constexpr std::size_t kScanShare = 8;

struct taken {
  std::uint32_t bin;
  std::uint32_t t, due;  // its life
  std::uint64_t lo, hi;
};

// The buckets a life is filed in: from its birth's to its last allocation's
// (a life of no allocation, due == t, in its birth's alone).
std::uint32_t first_bucket(std::uint32_t t) { return t / kBucket; }
std::uint32_t last_bucket(std::uint32_t t, std::uint32_t due) { return (due > t ? due - 1 : t) / kBucket; }

}  // namespace

std::uint64_t greedy_layout(std::span<const layout_item> items, std::span<const std::uint64_t> bin_bytes,
                            std::vector<layout_place>& places, std::vector<std::uint64_t>& bin_used) {
  std::vector<std::uint32_t> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::uint32_t x, std::uint32_t y) {
    const layout_item &a = items[x], &b = items[y];
    if (a.bytes != b.bytes) return a.bytes > b.bytes;
    if (a.due - a.t != b.due - b.t) return a.due - a.t > b.due - b.t;
    return a.t < b.t;
  });
  const auto nbins = static_cast<std::uint32_t>(bin_bytes.size());
  places.assign(items.size(), {});
  bin_used.assign(nbins, 0);
  std::uint32_t horizon = 0;
  for (const layout_item& it : items) horizon = std::max(horizon, last_bucket(it.t, it.due));
  // Indices into placed: by_life[b], the placed blocks whose lives touch
  // bucket b; by_birth[b], those born in it.
  std::vector<std::vector<std::uint32_t>> by_life(std::size_t{horizon} + 1), by_birth(std::size_t{horizon} + 1);
  std::vector<taken> placed;
  placed.reserve(items.size());
  struct span_in_bin {
    std::uint32_t bin;
    std::uint64_t lo, hi;
  };
  std::vector<span_in_bin> busy;  // by value: sorted without reading placed again
  // Indices into placed by (bin, offset), for blocks with many candidates;
  // the blocks placed since the last such block are merged in when the next comes.
  std::vector<std::uint32_t> in_order;
  in_order.reserve(items.size());
  const auto by_place = [&](std::uint32_t a, std::uint32_t b) {
    const taken &x = placed[a], &y = placed[b];
    return x.bin != y.bin ? x.bin < y.bin : x.lo < y.lo;
  };
  std::uint64_t extent = 0;
  for (const std::uint32_t i : order) {
    const layout_item& it = items[i];
    // The placed blocks whose lives meet this one's, in the order the
    // first-fit scan below walks them: by bin, then offset (blocks at one
    // (bin, offset) may come in any order: the scan's result does not depend
    // on it).
    busy.clear();
    const std::uint32_t from = first_bucket(it.t), to = last_bucket(it.t, it.due);
    const auto meets = [&](const taken& o) { return o.t < it.due && it.t < o.due; };
    std::size_t candidates = by_life[from].size();
    for (std::uint32_t b = from; b <= to; ++b) candidates += by_birth[b].size();
    if (candidates * kScanShare > placed.size()) {
      // Most placed blocks are candidates (a life as long as the step's):
      // walk them all in order, as a scan without the index would, rather
      // than sort as many.
      const auto at = static_cast<std::ptrdiff_t>(in_order.size());
      for (auto j = static_cast<std::uint32_t>(in_order.size()); j < placed.size(); ++j) in_order.push_back(j);
      std::sort(in_order.begin() + at, in_order.end(), by_place);
      std::inplace_merge(in_order.begin(), in_order.begin() + at, in_order.end(), by_place);
      for (const std::uint32_t j : in_order) {
        const taken& o = placed[j];
        if (meets(o)) busy.push_back({o.bin, o.lo, o.hi});
      }
    } else {
      // Each read once: those born at or before its birth are live at it
      // (its birth's bucket), the others are born within its life (the
      // birth lists of its buckets).
      for (const std::uint32_t j : by_life[from]) {
        const taken& o = placed[j];
        if (o.t <= it.t && meets(o)) busy.push_back({o.bin, o.lo, o.hi});
      }
      for (std::uint32_t b = from; b <= to; ++b) {
        for (const std::uint32_t j : by_birth[b]) {
          const taken& o = placed[j];
          if (o.t > it.t && meets(o)) busy.push_back({o.bin, o.lo, o.hi});
        }
      }
      std::sort(busy.begin(), busy.end(), [](const span_in_bin& a, const span_in_bin& b) {
        return a.bin != b.bin ? a.bin < b.bin : a.lo < b.lo;
      });
    }
    std::uint32_t where = nbins;
    std::uint64_t offset = 0;
    std::size_t k = 0;
    for (std::uint32_t b = 0; b <= nbins; ++b) {
      offset = 0;
      for (; k < busy.size() && busy[k].bin == b; ++k) {
        if (offset + it.bytes <= busy[k].lo) break;
        offset = std::max(offset, busy[k].hi);
      }
      while (k < busy.size() && busy[k].bin == b) ++k;
      if (b == nbins || offset + it.bytes <= bin_bytes[b]) {
        where = b;
        break;
      }
    }
    places[i] = {where, offset};
    if (where < nbins) {
      bin_used[where] = std::max(bin_used[where], offset + it.bytes);
    } else {
      extent = std::max(extent, offset + it.bytes);
    }
    const auto j = static_cast<std::uint32_t>(placed.size());
    placed.push_back({where, it.t, it.due, offset, offset + it.bytes});
    for (std::uint32_t b = from; b <= to; ++b) by_life[b].push_back(j);
    by_birth[from].push_back(j);
  }
  return extent;
}

}  // namespace fragctl::arena_detail
