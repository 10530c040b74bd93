// Physical spans for libraries that register memory by range (issue 30,
// item 3: NCCL buffer registration through PyTorch's trace trackers):
// device_backend::watch_spans / for_each_span and the C API's
// fragctl_watch_spans / fragctl_spans, on the sim backend. One event per
// handle or raw allocation, never a range across two handles; a span's
// "unmapping" comes before the driver call that takes it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

#include "fragctl/backend.hpp"
#include "fragctl/fragctl.h"
#include "fragctl/sim_backend.hpp"

namespace fragctl {
namespace {

constexpr std::size_t G = 2 * MiB;

struct seen {
  device_backend::span_event event;
  std::uintptr_t address;
  std::size_t bytes;
  bool usable;  // the device could read and write the span when the event came
};

struct watcher {
  explicit watcher(sim_backend* b) : backend(b) {}
  sim_backend* backend;
  std::vector<seen> events;
  static void observe(device_backend::span_event event, void* address, std::size_t bytes, void* context) noexcept {
    auto& w = *static_cast<watcher*>(context);
    w.events.push_back({event, reinterpret_cast<std::uintptr_t>(address), bytes, w.backend->accessible(address, bytes)});
  }
};

sim_options two_gib() {
  sim_options o;
  o.capacity = 1024 * G;
  o.granularity = G;
  return o;
}

TEST(BackendSpans, OneEventPerHandleOnceAccessIsGrantedAndBeforeTheUnmap) {
  sim_backend sim(two_gib());
  watcher w(&sim);
  sim.watch_spans(&watcher::observe, &w);
  auto* base = static_cast<char*>(sim.reserve_address(8 * G));
  const auto h1 = sim.create_physical(2 * G);
  const auto h2 = sim.create_physical(G);
  ASSERT_TRUE(h1 && h2);
  ASSERT_TRUE(sim.map(base, 2 * G, *h1));
  ASSERT_TRUE(sim.map(base + 2 * G, G, *h2));
  EXPECT_TRUE(w.events.empty()) << "mapped but not accessible: nothing to register yet";
  ASSERT_TRUE(sim.set_access(base, 3 * G));  // one grant over both handles
  ASSERT_EQ(w.events.size(), 2U);
  EXPECT_TRUE(w.events[0].usable && w.events[1].usable) << "reported once access is granted";
  EXPECT_EQ(w.events[0].event, device_backend::span_event::mapped);
  EXPECT_EQ(w.events[0].address, reinterpret_cast<std::uintptr_t>(base));
  EXPECT_EQ(w.events[0].bytes, 2 * G);
  EXPECT_EQ(w.events[1].address, reinterpret_cast<std::uintptr_t>(base + 2 * G));
  EXPECT_EQ(w.events[1].bytes, G);
  // A second grant (a peer added later) announces nothing new.
  ASSERT_TRUE(sim.set_access(base, 3 * G));
  EXPECT_EQ(w.events.size(), 2U);

  std::vector<std::pair<std::uintptr_t, std::size_t>> listed;
  sim.for_each_span([&](void* a, std::size_t b) { listed.emplace_back(reinterpret_cast<std::uintptr_t>(a), b); });
  ASSERT_EQ(listed.size(), 2U);
  EXPECT_EQ(listed[1].second, G);

  w.events.clear();
  sim.unmap(base, 3 * G);  // one unmap over both
  ASSERT_EQ(w.events.size(), 2U);
  for (const seen& e : w.events) {
    EXPECT_EQ(e.event, device_backend::span_event::unmapping);
    EXPECT_TRUE(e.usable) << "announced before the unmap";
  }
  EXPECT_EQ(w.events[0].bytes, 2 * G);
  EXPECT_EQ(w.events[1].bytes, G);
  listed.clear();
  sim.for_each_span([&](void* a, std::size_t b) { listed.emplace_back(reinterpret_cast<std::uintptr_t>(a), b); });
  EXPECT_TRUE(listed.empty());
  sim.release_physical(*h1, 2 * G);
  sim.release_physical(*h2, G);
  sim.release_address(base, 8 * G);
}

TEST(BackendSpans, RawAllocationsAreSpansAndAnUnwatchedBackendStillListsThem) {
  sim_backend sim(two_gib());
  void* p = sim.allocate(3 * MiB);
  ASSERT_NE(p, nullptr);
  std::size_t count = 0;
  sim.for_each_span([&](void* a, std::size_t b) {
    EXPECT_EQ(a, p);
    EXPECT_EQ(b, 3 * MiB);
    ++count;
  });
  EXPECT_EQ(count, 1U);
  watcher w(&sim);
  sim.watch_spans(&watcher::observe, &w);
  sim.free(p, 3 * MiB);
  ASSERT_EQ(w.events.size(), 1U);
  EXPECT_EQ(w.events[0].event, device_backend::span_event::unmapping);
  EXPECT_TRUE(w.events[0].usable) << "announced before the free";
  EXPECT_FALSE(sim.accessible(p, 3 * MiB));
  sim.watch_spans(nullptr, nullptr);
}

// Through the C API: an arena whose handles are one granule each
// (map_chunk:2MiB) serves a 7 MiB block over four handles; each is
// reported on its own, and the spans listed match the events.
struct c_events {
  std::vector<int> kinds;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;
};

void on_span(int event, std::uint64_t address, std::uint64_t size, void* context) {
  auto& e = *static_cast<c_events*>(context);
  e.kinds.push_back(event);
  e.spans.emplace_back(address, size);
}

TEST(CApiSpans, ArenaReportsEachHandleOfABlockAndTakesThemBackBeforeReleasing) {
  fragctl_allocator* a = nullptr;
  ASSERT_EQ(fragctl_create("arena", "sim_capacity:1GiB,map_chunk:2MiB,release_threshold:0,release_delay:0", "sim", 0,
                           &a),
            FRAGCTL_OK)
      << fragctl_last_error();
  c_events e;
  ASSERT_EQ(fragctl_watch_spans(a, &on_span, &e), FRAGCTL_OK);
  void* p = nullptr;
  ASSERT_EQ(fragctl_malloc(a, &p, 7 * MiB, nullptr), FRAGCTL_OK) << fragctl_last_error();
  ASSERT_EQ(e.kinds.size(), 4U);
  std::uint64_t next = reinterpret_cast<std::uint64_t>(p);
  for (std::size_t i = 0; i < e.spans.size(); ++i) {
    EXPECT_EQ(e.kinds[i], FRAGCTL_SPAN_MAPPED);
    EXPECT_EQ(e.spans[i].second, G) << "one handle per event";
    EXPECT_EQ(e.spans[i].first, next);
    next += G;
  }
  c_events listed;
  ASSERT_EQ(fragctl_spans(
                a, [](std::uint64_t address, std::uint64_t size, void* c) { on_span(0, address, size, c); }, &listed),
            FRAGCTL_OK);
  EXPECT_EQ(listed.spans, e.spans);

  e = {};
  ASSERT_EQ(fragctl_free(a, p, 7 * MiB, nullptr), FRAGCTL_OK);
  ASSERT_EQ(fragctl_release_cached(a), FRAGCTL_OK) << fragctl_last_error();
  ASSERT_EQ(e.kinds.size(), 4U);
  for (int k : e.kinds) EXPECT_EQ(k, FRAGCTL_SPAN_UNMAPPING);
  for (const auto& s : e.spans) EXPECT_EQ(s.second, G);
  ASSERT_EQ(fragctl_watch_spans(a, nullptr, nullptr), FRAGCTL_OK);
  EXPECT_EQ(fragctl_destroy(a), FRAGCTL_OK);
}

// Regression (red team, 2026-11-28): a span callback calling a read-only
// function of its allocator (fragctl_paused, fragctl_stats_json, ...) waited
// for the lock the call that mapped holds: the program hung. Those calls
// return STATE there now; fragctl_spans works; another allocator's calls
// are served. (alarm: a hang fails the test instead of stalling the suite.)
struct reentry {
  fragctl_allocator* self = nullptr;
  fragctl_allocator* other = nullptr;
  std::vector<fragctl_status> got;
  std::size_t spans = 0;
};

TEST(CApiSpans, ACallbackCallingItsAllocatorGetsStateNotAHang) {
  fragctl_allocator* a = nullptr;
  fragctl_allocator* b = nullptr;
  ASSERT_EQ(fragctl_create("arena", "sim_capacity:1GiB,map_chunk:2MiB", "sim", 0, &a), FRAGCTL_OK);
  ASSERT_EQ(fragctl_create("caching", "sim_capacity:1GiB", "sim", 0, &b), FRAGCTL_OK);
  reentry r{a, b, {}, 0};
  const auto callback = [](int, std::uint64_t, std::uint64_t, void* context) {
    auto& in = *static_cast<reentry*>(context);
    if (!in.got.empty()) return;  // once
    int paused = 0;
    in.got.push_back(fragctl_paused(in.self, &paused));
    char* json = nullptr;
    in.got.push_back(fragctl_stats_json(in.self, &json));
    fragctl_string_free(json);
    fragctl_counters counters{};
    counters.struct_size = sizeof counters;
    in.got.push_back(fragctl_get_counters(in.self, &counters));
    void* p = &in;  // a failed call clears its output
    in.got.push_back(fragctl_malloc(in.self, &p, MiB, nullptr));
    if (p != nullptr) in.got.push_back(FRAGCTL_ERROR_INTERNAL);
    in.got.push_back(fragctl_destroy(in.self));
    in.got.push_back(fragctl_spans(
        in.self, [](std::uint64_t, std::uint64_t, void* c) { ++static_cast<reentry*>(c)->spans; }, &in));
    in.got.push_back(fragctl_malloc(in.other, &p, MiB, nullptr));  // control: another allocator
    if (p != nullptr) in.got.push_back(fragctl_free(in.other, p, MiB, nullptr));
  };
  ASSERT_EQ(fragctl_watch_spans(a, callback, &r), FRAGCTL_OK);
  ::alarm(60);
  void* p = nullptr;
  ASSERT_EQ(fragctl_malloc(a, &p, 4 * MiB, nullptr), FRAGCTL_OK) << fragctl_last_error();
  ::alarm(0);
  const std::vector<fragctl_status> expected{FRAGCTL_ERROR_STATE, FRAGCTL_ERROR_STATE, FRAGCTL_ERROR_STATE,
                                             FRAGCTL_ERROR_STATE, FRAGCTL_ERROR_STATE, FRAGCTL_OK,
                                             FRAGCTL_OK,          FRAGCTL_OK};
  EXPECT_EQ(r.got, expected);
  EXPECT_GT(r.spans, 0U);
  int paused = 1;
  EXPECT_EQ(fragctl_paused(a, &paused), FRAGCTL_OK) << "outside the callback, served";
  ASSERT_EQ(fragctl_watch_spans(a, nullptr, nullptr), FRAGCTL_OK);
  EXPECT_EQ(fragctl_free(a, p, 4 * MiB, nullptr), FRAGCTL_OK);
  EXPECT_EQ(fragctl_destroy(a), FRAGCTL_OK);
  EXPECT_EQ(fragctl_destroy(b), FRAGCTL_OK);
}

// A callback of A allocating from B runs B's callback inside it; that one
// calling A is refused too (a review found the guard held the innermost
// allocator only: the call waited for A's lock).
struct nested {
  fragctl_allocator* a = nullptr;
  fragctl_allocator* b = nullptr;
  int depth = 0;
  fragctl_status inner = FRAGCTL_OK;
};

TEST(CApiSpans, NestedCallbacksOfTwoAllocatorsAreRefusedForBoth) {
  nested n;
  ASSERT_EQ(fragctl_create("arena", "sim_capacity:1GiB,map_chunk:2MiB", "sim", 0, &n.a), FRAGCTL_OK);
  ASSERT_EQ(fragctl_create("arena", "sim_capacity:1GiB,map_chunk:2MiB", "sim", 0, &n.b), FRAGCTL_OK);
  const auto on_a = [](int, std::uint64_t, std::uint64_t, void* context) {
    auto& in = *static_cast<nested*>(context);
    if (in.depth++ != 0) return;
    void* q = nullptr;
    if (fragctl_malloc(in.b, &q, MiB, nullptr) == FRAGCTL_OK) (void)fragctl_free(in.b, q, MiB, nullptr);
  };
  const auto on_b = [](int, std::uint64_t, std::uint64_t, void* context) {
    auto& in = *static_cast<nested*>(context);
    int paused = 0;
    if (in.depth == 1) in.inner = fragctl_paused(in.a, &paused);  // inside A's callback, inside B's
  };
  ASSERT_EQ(fragctl_watch_spans(n.a, on_a, &n), FRAGCTL_OK);
  ASSERT_EQ(fragctl_watch_spans(n.b, on_b, &n), FRAGCTL_OK);
  ::alarm(60);
  void* p = nullptr;
  ASSERT_EQ(fragctl_malloc(n.a, &p, 4 * MiB, nullptr), FRAGCTL_OK) << fragctl_last_error();
  ::alarm(0);
  EXPECT_EQ(n.inner, FRAGCTL_ERROR_STATE);
  ASSERT_EQ(fragctl_watch_spans(n.a, nullptr, nullptr), FRAGCTL_OK);
  ASSERT_EQ(fragctl_watch_spans(n.b, nullptr, nullptr), FRAGCTL_OK);
  EXPECT_EQ(fragctl_free(n.a, p, 4 * MiB, nullptr), FRAGCTL_OK);
  EXPECT_EQ(fragctl_destroy(n.a), FRAGCTL_OK);
  EXPECT_EQ(fragctl_destroy(n.b), FRAGCTL_OK);
}

TEST(CApiSpans, NullArgumentsAreRefused) {
  EXPECT_EQ(fragctl_watch_spans(nullptr, &on_span, nullptr), FRAGCTL_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(fragctl_spans(nullptr, nullptr, nullptr), FRAGCTL_ERROR_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace fragctl
