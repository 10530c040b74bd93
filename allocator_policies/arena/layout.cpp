#include "allocator_policies/arena/layout.hpp"

#include <algorithm>
#include <numeric>

namespace fragctl::arena_detail {

namespace {

// Allocations of the step per birth bucket.
constexpr std::uint64_t bucket_allocations = 64;
// A life of more allocations than this is long: kept in (bin, offset) order
// instead of in a birth bucket, so that a block reads the short lives born
// within this many allocations before its birth or during its life (the
// kvgen step's layout: 33 ms at 16 buckets, 52 at 4, 69 at 64).
constexpr std::uint64_t long_life = 16 * bucket_allocations;
// A block whose short candidates and the long lives together are more than
// 1/scan_share of the blocks placed walks every placed block in order
// instead (the scan's cost, where most lives are long; 8 was slower on a
// step with a ninth of its lives step-long).
constexpr std::size_t scan_share = 4;
// What sorting one short life that meets a block costs, in placed blocks
// walked.
constexpr std::size_t sort_weight = 8;

struct taken {
  std::uint32_t bin;
  std::uint32_t t, due;  // its life
  std::uint64_t lo, hi;
};

// The first-fit sweep's order: by bin, then offset.
struct sweep_order {
  bool operator()(const taken& a, const taken& b) const noexcept {
    return a.bin != b.bin ? a.bin < b.bin : a.lo < b.lo;
  }
  bool operator()(const taken* a, const taken* b) const noexcept { return (*this)(*a, *b); }
};

std::uint64_t life_of(const layout_item& it) noexcept { return it.due > it.t ? it.due - it.t : 0; }

// Placed blocks kept in (bin, offset) order, by value so that a walk reads
// them in sequence; those added since the last walk are put in place when
// the next one begins (one by one when few, else sorted and merged).
class ordered_blocks {
 public:
  void add(const taken& o) { blocks_.push_back(o); }
  [[nodiscard]] std::size_t size() const noexcept { return blocks_.size(); }
  const std::vector<taken>& read() {
    const std::size_t fresh = blocks_.size() - in_order_;
    if (fresh > 0 && fresh <= 8) {
      for (std::size_t j = in_order_; j < blocks_.size(); ++j) {
        const taken o = blocks_[j];
        const auto end = blocks_.begin() + static_cast<std::ptrdiff_t>(j);
        const auto at = std::upper_bound(blocks_.begin(), end, o, sweep_order{});
        std::move_backward(at, end, end + 1);
        *at = o;
      }
    } else if (fresh > 8) {
      const auto mid = blocks_.begin() + static_cast<std::ptrdiff_t>(in_order_);
      std::sort(mid, blocks_.end(), sweep_order{});
      std::inplace_merge(blocks_.begin(), mid, blocks_.end(), sweep_order{});
    }
    in_order_ = blocks_.size();
    return blocks_;
  }

 private:
  std::vector<taken> blocks_;
  std::size_t in_order_ = 0;
};

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
  std::uint32_t latest = 0;
  for (const layout_item& it : items) latest = std::max(latest, it.t);
  // The placed blocks: the short lives by birth bucket; the long ones, and
  // all of them, in order.
  std::vector<std::vector<taken>> by_birth(latest / bucket_allocations + 1);
  ordered_blocks long_lives, all;
  std::vector<const taken*> busy, shorts, longs;
  std::vector<taken> short_lives;  // by value: sorted without following pointers
  std::uint64_t extent = 0;
  for (const std::uint32_t i : order) {
    const layout_item& it = items[i];
    // The placed blocks whose lives meet this one's, in the order the
    // first-fit sweep below walks them: by bin, then offset. (Blocks at one
    // (bin, offset) may come in any order: once the first of them does not
    // leave room below it, the sweep takes the largest end of them.) A short
    // life that meets this one was born after its birth less long_life and
    // before its end.
    const auto meets = [&](const taken& o) { return o.t < it.due && it.t < o.due; };
    const std::uint64_t window_lo = it.t >= long_life ? it.t - long_life + 1 : 0;
    const std::uint64_t first = window_lo / bucket_allocations;
    const std::uint64_t last =
        std::min<std::uint64_t>(it.due > 0 ? (it.due - 1) / bucket_allocations : 0, by_birth.size() - 1);
    std::size_t candidates = 0;
    for (std::uint64_t b = first; b <= last; ++b) candidates += by_birth[b].size();
    busy.clear();
    bool walk = (candidates + long_lives.size()) * scan_share > all.size();
    if (!walk) {
      short_lives.clear();
      for (std::uint64_t b = first; b <= last; ++b) {
        for (const taken& o : by_birth[b]) {
          if (meets(o)) short_lives.push_back(o);
        }
      }
      // Sorting the short lives that meet this one costs about as much as
      // walking sort_weight placed blocks each (a step of lives just under
      // long_life: 2,000 of them for every block).
      walk = (short_lives.size() * sort_weight + long_lives.size()) * scan_share > all.size();
    }
    if (walk) {
      for (const taken& o : all.read()) {
        if (meets(o)) busy.push_back(&o);
      }
    } else {
      std::sort(short_lives.begin(), short_lives.end(), sweep_order{});
      longs.clear();
      for (const taken& o : long_lives.read()) {
        if (meets(o)) longs.push_back(&o);
      }
      shorts.clear();
      for (const taken& o : short_lives) shorts.push_back(&o);
      if (shorts.empty()) {
        busy.swap(longs);
      } else if (longs.empty()) {
        busy.swap(shorts);
      } else {
        std::merge(longs.begin(), longs.end(), shorts.begin(), shorts.end(), std::back_inserter(busy), sweep_order{});
      }
    }
    std::uint32_t where = nbins;
    std::uint64_t offset = 0;
    std::size_t k = 0;
    for (std::uint32_t b = 0; b <= nbins; ++b) {
      offset = 0;
      for (; k < busy.size() && busy[k]->bin == b; ++k) {
        if (offset + it.bytes <= busy[k]->lo) break;
        offset = std::max(offset, busy[k]->hi);
      }
      while (k < busy.size() && busy[k]->bin == b) ++k;
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
    const taken now{where, it.t, it.due, offset, offset + it.bytes};
    all.add(now);
    if (life_of(it) > long_life) {
      long_lives.add(now);
    } else {
      by_birth[it.t / bucket_allocations].push_back(now);
    }
  }
  return extent;
}

}  // namespace fragctl::arena_detail
