// The step plan's layout (allocator_policies/arena/layout.hpp): greedy by
// size, each block at the lowest offset of the first bin free of the placed
// blocks whose lives meet its own. The time-indexed layout against a scan of
// every placed block (the layout before the index, kept here as the
// reference), block for block, on hand-made and random steps.
#include "allocator_policies/arena/layout.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

namespace fragctl::arena_detail {
namespace {

struct laid_out {
  std::vector<layout_place> places;
  std::vector<std::uint64_t> bin_used;
  std::uint64_t extent = 0;
};

laid_out indexed(const std::vector<layout_item>& items, const std::vector<std::uint64_t>& bins) {
  laid_out r;
  r.extent = greedy_layout(items, bins, r.places, r.bin_used);
  return r;
}

// Every placed block scanned per block, in (bin, offset) order.
laid_out scanned(const std::vector<layout_item>& items, const std::vector<std::uint64_t>& bins) {
  std::vector<std::uint32_t> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::uint32_t x, std::uint32_t y) {
    const layout_item &a = items[x], &b = items[y];
    if (a.bytes != b.bytes) return a.bytes > b.bytes;
    if (a.due - a.t != b.due - b.t) return a.due - a.t > b.due - b.t;
    return a.t < b.t;
  });
  struct taken {
    std::uint32_t bin, t, due;
    std::uint64_t lo, hi;
  };
  const auto before = [](const taken& a, const taken& b) { return a.bin != b.bin ? a.bin < b.bin : a.lo < b.lo; };
  const auto nbins = static_cast<std::uint32_t>(bins.size());
  laid_out r;
  r.places.assign(items.size(), {});
  r.bin_used.assign(nbins, 0);
  std::vector<taken> placed;
  for (const std::uint32_t i : order) {
    const layout_item& it = items[i];
    std::vector<const taken*> busy;
    for (const taken& o : placed) {
      if (o.t < it.due && it.t < o.due) busy.push_back(&o);
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
      if (b == nbins || offset + it.bytes <= bins[b]) {
        where = b;
        break;
      }
    }
    r.places[i] = {where, offset};
    if (where < nbins) {
      r.bin_used[where] = std::max(r.bin_used[where], offset + it.bytes);
    } else {
      r.extent = std::max(r.extent, offset + it.bytes);
    }
    const taken now{where, it.t, it.due, offset, offset + it.bytes};
    placed.insert(std::upper_bound(placed.begin(), placed.end(), now, before), now);
  }
  return r;
}

void expect_same(const laid_out& a, const laid_out& b) {
  ASSERT_EQ(a.places.size(), b.places.size());
  for (std::size_t i = 0; i < a.places.size(); ++i) {
    ASSERT_EQ(a.places[i].bin, b.places[i].bin) << "block " << i;
    ASSERT_EQ(a.places[i].offset, b.places[i].offset) << "block " << i;
  }
  EXPECT_EQ(a.bin_used, b.bin_used);
  EXPECT_EQ(a.extent, b.extent);
}

// No two blocks whose lives meet overlap in one bin, and each fits its bin.
void expect_valid(const std::vector<layout_item>& items, const std::vector<std::uint64_t>& bins, const laid_out& r) {
  for (std::size_t i = 0; i < items.size(); ++i) {
    const layout_place& p = r.places[i];
    if (p.bin < bins.size()) {
      ASSERT_LE(p.offset + items[i].bytes, bins[p.bin]) << "block " << i;
    }
    for (std::size_t j = 0; j < i; ++j) {
      const layout_place& q = r.places[j];
      const bool lives_meet = items[i].t < items[j].due && items[j].t < items[i].due;
      const bool bytes_meet = p.offset < q.offset + items[j].bytes && q.offset < p.offset + items[i].bytes;
      ASSERT_FALSE(p.bin == q.bin && lives_meet && bytes_meet) << "blocks " << j << " and " << i;
    }
  }
}

TEST(ArenaLayout, LargestFirstAtTheLowestFreeOffset) {
  // A: 100 bytes over [0, 10); B: 60 over [2, 5); C: 60 over [6, 9); D: 40 over [0, 3).
  const std::vector<layout_item> items{{0, 10, 100}, {2, 5, 60}, {6, 9, 60}, {0, 3, 40}};
  const laid_out r = indexed(items, {});
  EXPECT_EQ(r.places[0].offset, 0u);    // the largest first
  EXPECT_EQ(r.places[1].offset, 100u);  // above A
  EXPECT_EQ(r.places[2].offset, 100u);  // B's bytes, at another time
  EXPECT_EQ(r.places[3].offset, 160u);  // above A and B, whose lives meet its own
  EXPECT_EQ(r.extent, 200u);
  expect_same(r, scanned(items, {}));
}

TEST(ArenaLayout, BinsFirstInOrderThenTheNewRange) {
  const std::vector<layout_item> items{{0, 4, 64}, {1, 3, 32}, {2, 6, 32}, {5, 8, 16}};
  const std::vector<std::uint64_t> bins{48, 64};
  const laid_out r = indexed(items, bins);
  EXPECT_EQ(r.places[0].bin, 1u);  // 64 bytes: only the second bin holds it
  EXPECT_EQ(r.places[2].bin, 0u);  // of the two 32-byte blocks the longer life goes first
  EXPECT_EQ(r.places[1].bin, 2u);  // meets both: no room left in either, the new range
  EXPECT_EQ(r.places[3].bin, 0u);  // meets only block 2: above it in the first bin
  EXPECT_EQ(r.places[3].offset, 32u);
  EXPECT_EQ(r.extent, 32u);
  expect_same(r, scanned(items, bins));
  expect_valid(items, bins, r);
}

TEST(ArenaLayout, TheSameAsAScanOfEveryPlacedBlockOnRandomSteps) {
  std::mt19937_64 rng(20261128);
  for (int round = 0; round < 300; ++round) {
    // Steps long enough for lives above the layout's long-life mark (1,024
    // allocations) and its birth buckets (64), and blocks enough for both
    // of its paths (the ordered walk, the buckets and the long lives merged).
    const auto steps = static_cast<std::uint32_t>(1 + rng() % 8000);
    const std::size_t n = rng() % (round % 10 == 0 ? 1500 : 500);
    // 0 short lives; 1 lives up to the step's; 2 short with a ninth up to the step's;
    // 3 as 2, with lives of no allocation and lives that end before they begin.
    const int kind = round % 4;
    std::vector<layout_item> items(n);
    for (layout_item& it : items) {
      it.t = static_cast<std::uint32_t>(rng() % steps);
      std::uint64_t life = 0;
      if (kind == 0) life = 1 + rng() % 40;
      if (kind == 1) life = rng() % (steps + 1);
      if (kind >= 2) life = rng() % 9 == 0 ? rng() % (steps + 1) : rng() % 100;
      it.due = static_cast<std::uint32_t>(std::min<std::uint64_t>(it.t + life, steps + 1));
      if (kind == 3 && rng() % 10 == 0) it.due = it.t;
      if (kind == 3 && rng() % 10 == 0) it.due = static_cast<std::uint32_t>(rng() % (it.t + 1));
      // Few distinct sizes: ties in size and in life order the blocks too.
      it.bytes = 512 * (1 + rng() % 16) * (rng() % 4 == 0 ? 64 : 1);
    }
    // Mostly a few bins, some of no bytes; now and then many.
    std::vector<std::uint64_t> bins(round % 7 == 0 ? rng() % 60 : rng() % 4);
    for (std::uint64_t& b : bins) b = rng() % 5 == 0 ? 0 : 512 * (rng() % 2048);
    const laid_out r = indexed(items, bins);
    SCOPED_TRACE(::testing::Message() << "round " << round << ", " << n << " blocks, " << bins.size() << " bins");
    expect_same(r, scanned(items, bins));
    if (n <= 300) expect_valid(items, bins, r);
  }
}

TEST(ArenaLayout, NoBlocks) {
  const laid_out r = indexed({}, {4096});
  EXPECT_TRUE(r.places.empty());
  EXPECT_EQ(r.bin_used, std::vector<std::uint64_t>{0});
  EXPECT_EQ(r.extent, 0u);
}

}  // namespace
}  // namespace fragctl::arena_detail
