// The activation-checkpoint store on the sim backend in backed mode: data
// written at put comes back at get under every budget, the budget is never
// exceeded, offloads and prefetches happen in the documented order, and the
// stream order holds with manual completion.
#include "fragctl/checkpoint/store.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "fragctl/config.hpp"
#include "fragctl/error.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/sim_backend.hpp"
#include "nlohmann/json.hpp"

namespace fragctl::checkpoint {
namespace {

/// A device allocator (caching policy) on a backed sim.
struct device {
  explicit device(bool manual = false)
      : sim(sim_options{.capacity = 1 * GiB, .backed = true, .manual_completion = manual}),
        allocator(make_policy("caching", config{}, sim)) {}
  sim_backend sim;
  std::unique_ptr<device_allocator> allocator;
};

store_options opts(std::size_t budget, std::size_t depth = 2) {
  store_options o;
  o.device_budget = budget;
  o.prefetch_depth = depth;
  return o;
}

std::uint32_t word(int layer, int iteration, std::size_t i) {
  // Unsigned arithmetic: layer ids span every int, and signed overflow is undefined.
  return (static_cast<std::uint32_t>(layer) * 1000003u + static_cast<std::uint32_t>(iteration) * 7919u) ^
         static_cast<std::uint32_t>(i * 2654435761u);
}
void fill(void* p, std::size_t bytes, int layer, int iteration) {
  auto* w = static_cast<std::uint32_t*>(p);
  for (std::size_t i = 0; i < bytes / 4; ++i) w[i] = word(layer, iteration, i);
}
bool holds(const void* p, std::size_t bytes, int layer, int iteration) {
  const auto* w = static_cast<const std::uint32_t*>(p);
  for (std::size_t i = 0; i < bytes / 4; ++i) {
    if (w[i] != word(layer, iteration, i)) return false;
  }
  return true;
}

/// One training iteration: forward puts and fills every layer, backward gets,
/// checks and drops them in reverse order. Asserts the budget after each call.
void iterate(store& s, const std::vector<std::size_t>& sizes, int iteration, stream_t stream) {
  const std::size_t budget = s.stats().device_budget;
  for (std::size_t l = 0; l < sizes.size(); ++l) {
    void* p = s.put(static_cast<int>(l), sizes[l], stream);
    fill(p, sizes[l], static_cast<int>(l), iteration);
    ASSERT_LE(s.stats().device.current, budget);
  }
  for (std::size_t l = sizes.size(); l-- > 0;) {
    const void* p = s.get(static_cast<int>(l), stream);
    ASSERT_TRUE(holds(p, sizes[l], static_cast<int>(l), iteration)) << "layer " << l << " iteration " << iteration;
    ASSERT_LE(s.stats().device.current, budget);
    s.drop(static_cast<int>(l));
  }
  s.reset();
}

std::vector<std::size_t> varied_sizes() {
  // 12 layers of different sizes, some not multiples of 512.
  return {192 * KiB, 64 * KiB, 100 * KiB + 4, 256 * KiB, 64 * KiB, 80 * KiB,
          128 * KiB, 300 * KiB + 12, 64 * KiB, 96 * KiB, 128 * KiB, 200 * KiB};
}

std::size_t span_sum(const std::vector<std::size_t>& sizes) {
  return std::accumulate(sizes.begin(), sizes.end(), std::size_t{0},
                         [](std::size_t a, std::size_t b) { return a + round_up(b, min_alignment); });
}

TEST(checkpoint_store, data_survives_every_budget_from_all_on_device_to_all_offloaded) {
  const std::vector<std::size_t> sizes = varied_sizes();
  const std::size_t total = span_sum(sizes);
  const std::size_t largest = round_up(*std::max_element(sizes.begin(), sizes.end()), min_alignment);
  for (std::size_t depth : {std::size_t{0}, std::size_t{2}}) {
    for (std::size_t step = 0; step <= 8; ++step) {  // total (all on device) .. largest (all offloaded)
      const std::size_t budget = round_up(largest + (total - largest) * (8 - step) / 8, min_alignment);
      SCOPED_TRACE(::testing::Message() << "budget " << budget << " depth " << depth);
      device d;
      store s(*d.allocator, opts(budget, depth));
      for (int it = 0; it < 3; ++it) iterate(s, sizes, it, nullptr);
      const store_stats st = s.stats();
      EXPECT_LE(st.device.peak, budget);
      EXPECT_EQ(st.gets, 3 * sizes.size());
      EXPECT_EQ(st.gets_resident + st.gets_prefetched + st.gets_on_demand, st.gets);
      if (budget == total) {
        EXPECT_EQ(st.bytes_to_host, 0u);
        EXPECT_EQ(st.gets_resident, st.gets);
      } else {
        EXPECT_GT(st.bytes_to_host, 0u);
      }
      if (depth == 0) {
        EXPECT_EQ(st.prefetches, 0u);
      }
      EXPECT_EQ(st.device.current, 0u);
      EXPECT_EQ(st.host.current, 0u);
    }
  }
}

TEST(checkpoint_store, the_region_is_one_allocation_of_the_budget) {
  device d;
  const pool_state before = d.allocator->state();
  {
    store s(*d.allocator, opts(1 * MiB + 1));
    EXPECT_EQ(s.stats().device_budget, 1 * MiB + 512);
    EXPECT_EQ(d.allocator->state().allocated - before.allocated, 1 * MiB + 512);
    for (int it = 0; it < 2; ++it) iterate(s, std::vector<std::size_t>(10, 256 * KiB), it, nullptr);
    EXPECT_EQ(d.allocator->state().allocated - before.allocated, 1 * MiB + 512);  // nothing more
  }
  EXPECT_EQ(d.allocator->state().allocated, before.allocated);
}

struct recorded {
  int layer;
  copy_reason reason;
  bool operator==(const recorded&) const = default;
};
std::ostream& operator<<(std::ostream& os, const recorded& r) {
  return os << to_string(r.reason) << "(" << r.layer << ")";
}

TEST(checkpoint_store, offloads_the_lowest_layers_and_prefetches_in_backward_order) {
  device d;
  std::vector<recorded> copies;
  const std::size_t size = 128 * KiB;
  store_options o = opts(3 * size, 1);
  o.on_copy = [&](const copy_event& e) { copies.push_back({e.layer, e.reason}); };
  store s(*d.allocator, o);
  const std::vector<std::size_t> sizes(8, size);

  // First iteration: evictions on demand, lowest layer first.
  for (int l = 0; l < 8; ++l) fill(s.put(l, size, nullptr), size, l, 0);
  using R = copy_reason;
  EXPECT_EQ(copies, (std::vector<recorded>{{0, R::evict}, {1, R::evict}, {2, R::evict}, {3, R::evict}, {4, R::evict}}));
  for (int l = 0; l < 5; ++l) EXPECT_EQ(s.where(l), residence::host) << l;
  for (int l = 5; l < 8; ++l) EXPECT_EQ(s.where(l), residence::device) << l;

  // Backward: each get prefetches the layer below it once there is room.
  copies.clear();
  for (int l = 7; l >= 0; --l) {
    ASSERT_TRUE(holds(s.get(l, nullptr), size, l, 0));
    s.drop(l);
  }
  EXPECT_EQ(copies, (std::vector<recorded>{{4, R::prefetch}, {3, R::prefetch}, {2, R::prefetch}, {1, R::prefetch},
                                           {0, R::prefetch}}));
  s.reset();
  store_stats st = s.stats();
  EXPECT_EQ(st.gets_resident, 3u);
  EXPECT_EQ(st.gets_prefetched, 5u);
  EXPECT_EQ(st.gets_on_demand, 0u);

  // Second iteration: the store knows the sequence and evicts one put early.
  copies.clear();
  for (int l = 0; l < 8; ++l) fill(s.put(l, size, nullptr), size, l, 1);
  EXPECT_EQ(copies, (std::vector<recorded>{{0, R::evict_ahead}, {1, R::evict_ahead}, {2, R::evict_ahead},
                                           {3, R::evict_ahead}, {4, R::evict_ahead}}));
  for (int l = 7; l >= 0; --l) {
    ASSERT_TRUE(holds(s.get(l, nullptr), size, l, 1));
    s.drop(l);
  }
  s.reset();
  st = s.stats();
  EXPECT_EQ(st.evictions, 5u);
  EXPECT_EQ(st.evictions_ahead, 5u);
  EXPECT_EQ(st.bytes_to_host, 10 * size);
  EXPECT_EQ(st.bytes_to_device, 10 * size);
  EXPECT_EQ(st.iterations, 2u);
  EXPECT_LE(st.device.peak, 3 * size);
  EXPECT_EQ(st.host.peak, 5 * size);
}

TEST(checkpoint_store, without_prefetch_get_fetches_on_demand) {
  device d;
  const std::size_t size = 64 * KiB;
  store s(*d.allocator, opts(2 * size, 0));
  for (int it = 0; it < 2; ++it) iterate(s, std::vector<std::size_t>(6, size), it, nullptr);
  const store_stats st = s.stats();
  EXPECT_EQ(st.prefetches, 0u);
  EXPECT_EQ(st.gets_on_demand, 2 * 4u);
  EXPECT_EQ(st.fetches_on_demand, 2 * 4u);
}

TEST(checkpoint_store, a_prefetched_checkpoint_evicted_again_needs_no_copy) {
  device d;
  const std::size_t size = 64 * KiB;
  store s(*d.allocator, opts(3 * size, 2));
  for (int l = 0; l < 4; ++l) fill(s.put(l, size, nullptr), size, l, 0);  // 0 goes to the host
  ASSERT_TRUE(holds(s.get(3, nullptr), size, 3, 0));
  s.drop(3);  // room: prefetch 0 (below 2 and 1, which are on the device)
  ASSERT_TRUE(holds(s.get(2, nullptr), size, 2, 0));
  EXPECT_EQ(s.where(0), residence::device);
  // A new put needs room: 0 (needed last) goes again, and its host copy is still valid.
  fill(s.put(10, size, nullptr), size, 10, 0);
  EXPECT_EQ(s.where(0), residence::host);
  EXPECT_EQ(s.stats().evictions_without_copy, 1u);
  EXPECT_EQ(s.stats().evictions, 1u);
  s.drop(10);
  s.drop(2);
  ASSERT_TRUE(holds(s.get(1, nullptr), size, 1, 0));
  ASSERT_TRUE(holds(s.get(0, nullptr), size, 0, 0));
  s.reset();
}

TEST(checkpoint_store, misuse_is_reported) {
  device d;
  store s(*d.allocator, opts(256 * KiB));
  EXPECT_THROW((void)s.put(0, 0, nullptr), invalid_argument);
  (void)s.put(0, 64 * KiB, nullptr);
  EXPECT_THROW((void)s.put(0, 64 * KiB, nullptr), invalid_argument);
  EXPECT_THROW((void)s.get(1, nullptr), invalid_argument);
  EXPECT_THROW((void)s.put(1, 256 * KiB + 1, nullptr), out_of_memory);
  s.drop(42);  // ignored with a warning
  EXPECT_EQ(s.stats().drops, 0u);
  EXPECT_THROW(store(*d.allocator, opts(0)), invalid_argument);
  s.reset();
}

// Sizes whose rounding to the store's alignment would wrap past SIZE_MAX: a
// put near SIZE_MAX once rounded to 0 bytes and was given the address the
// next put got too; a budget near SIZE_MAX read as "must be positive".
TEST(checkpoint_store, sizes_near_size_max_are_refused_not_wrapped) {
  device d;
  store s(*d.allocator, opts(256 * KiB));
  constexpr std::size_t huge = std::numeric_limits<std::size_t>::max() - 100;
  EXPECT_THROW((void)s.put(1, huge, nullptr), out_of_memory);
  void* p = s.put(2, 4 * KiB, nullptr);
  void* q = s.put(3, 4 * KiB, nullptr);
  EXPECT_NE(p, q);
  EXPECT_THROW((void)s.get(1, nullptr), invalid_argument) << "the refused put stored nothing";
  EXPECT_EQ(s.stats().puts, 2u);
  try {
    store big(*d.allocator, opts(std::numeric_limits<std::size_t>::max()));
    ADD_FAILURE() << "a budget of SIZE_MAX bytes was accepted";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("larger than any device"), std::string::npos) << e.what();
  }
  s.reset();
}

TEST(checkpoint_store, checkpoints_in_use_are_never_evicted) {
  device d;
  const std::size_t size = 64 * KiB;
  store s(*d.allocator, opts(2 * size));
  void* a = s.put(0, size, nullptr);
  void* b = s.put(1, size, nullptr);
  EXPECT_EQ(s.get(0, nullptr), a);
  EXPECT_EQ(s.get(1, nullptr), b);
  try {
    (void)s.put(2, size, nullptr);
    FAIL() << "put should not fit";
  } catch (const out_of_memory& e) {
    EXPECT_EQ(e.details().requested, size);
  }
  EXPECT_EQ(s.where(0), residence::device);
  s.drop(1);
  EXPECT_EQ(s.put(2, size, nullptr), b);
  s.reset();
}

TEST(checkpoint_store, any_int_is_a_layer_id_and_lower_ids_leave_first) {
  device d;
  const std::size_t size = 64 * KiB;
  store s(*d.allocator, opts(2 * size));
  const int ids[] = {std::numeric_limits<int>::min(), -5, std::numeric_limits<int>::max()};
  for (int id : ids) fill(s.put(id, size, nullptr), size, 1, id);
  EXPECT_EQ(s.where(ids[0]), residence::host);
  fill(s.put(7, size, nullptr), size, 1, 7);  // evicts -5
  EXPECT_EQ(s.where(-5), residence::host);
  fill(s.put(8, size, nullptr), size, 1, 8);  // evicts 7: INT_MAX is needed first
  EXPECT_EQ(s.where(std::numeric_limits<int>::max()), residence::device);
  for (int id : {std::numeric_limits<int>::max(), 8, 7, -5, std::numeric_limits<int>::min()}) {
    ASSERT_TRUE(holds(s.get(id, nullptr), size, 1, id)) << id;
    s.drop(id);
  }
  s.reset();
}

// Stream order with manual completion: nothing a copy or a reused range
// depends on completes before what it waits for.
TEST(checkpoint_store, copies_and_reused_ranges_wait_for_their_streams) {
  device d(/*manual=*/true);
  const std::size_t size = 64 * KiB;
  stream_t producer = d.sim.create_stream();
  store s(*d.allocator, opts(size));  // one checkpoint on the device at a time
  event_t copy_done = d.sim.create_event();
  event_t reused = d.sim.create_event();

  fill(s.put(0, size, producer), size, 0, 0);
  d.sim.submit(producer);  // the kernel writing layer 0
  fill(s.put(1, size, producer), size, 1, 0);  // evicts 0 and reuses its range
  d.sim.record_event(copy_done, s.copy_stream());
  d.sim.submit(producer);  // the kernel writing layer 1
  d.sim.record_event(reused, producer);

  d.sim.complete(s.copy_stream());
  EXPECT_FALSE(d.sim.query_event(copy_done)) << "the copy out ran before layer 0 was written";
  d.sim.complete(producer);
  EXPECT_FALSE(d.sim.query_event(reused)) << "layer 1 was written before layer 0 was copied out";
  d.sim.complete(s.copy_stream());
  EXPECT_TRUE(d.sim.query_event(copy_done));
  d.sim.complete(producer);
  EXPECT_TRUE(d.sim.query_event(reused));

  // Backward on another stream: get(1) waits for the producer, and the
  // fetch of 0 into 1's range waits for the drop.
  stream_t backward = d.sim.create_stream();
  event_t used = d.sim.create_event();
  ASSERT_TRUE(holds(s.get(1, backward), size, 1, 0));
  d.sim.submit(backward);  // reads layer 1
  s.drop(1);               // prefetches 0 into the same range
  d.sim.record_event(copy_done, s.copy_stream());
  d.sim.complete(s.copy_stream());
  EXPECT_FALSE(d.sim.query_event(copy_done)) << "0 was fetched over 1 while backward read it";
  d.sim.complete(backward);
  d.sim.complete(s.copy_stream());
  EXPECT_TRUE(d.sim.query_event(copy_done));
  ASSERT_TRUE(holds(s.get(0, backward), size, 0, 0));
  d.sim.record_event(used, backward);
  s.drop(0);
  s.reset();
  EXPECT_GT(s.stats().stream_waits, 0u);

  d.sim.complete_all();
  for (event_t e : {copy_done, reused, used}) d.sim.destroy_event(e);
  d.sim.destroy_stream(producer);
  d.sim.destroy_stream(backward);
}

// A stream checkpoints were put or taken on, ended and destroyed by its
// owner: the store records on a checkpoint's last stream when it seals,
// hands out and drops it, so it must be told (stream_ending), as the
// allocator is; after that nothing names the destroyed stream. The control
// runs the same program without the store's call.
void end_a_store_stream(bool announce) {
  SCOPED_TRACE(announce ? "stream_ending" : "control: the allocator told, the store not");
  device d;
  const stream_t producer = d.sim.create_stream();
  const stream_t backward = d.sim.create_stream();
  {
    store s(*d.allocator, opts(1 * MiB));
    fill(s.put(0, 64 * KiB, producer), 64 * KiB, 0, 0);  // sealed at the next call
    fill(s.put(1, 64 * KiB, nullptr), 64 * KiB, 1, 0);
    (void)s.get(1, backward);  // in use on backward until dropped
    for (const stream_t ending : {producer, backward}) {
      if (announce) s.stream_ending(ending);
      d.allocator->stream_ending(ending);
      d.sim.destroy_stream(ending);
    }
    try {
      EXPECT_TRUE(holds(s.get(0, nullptr), 64 * KiB, 0, 0));
      s.drop(1);
      s.drop(0);
      s.reset();
    } catch (const backend_error& e) {
      EXPECT_FALSE(announce) << e.what();
    }
  }
  if (announce) {
    EXPECT_EQ(d.sim.destroyed_stream_calls(), 0u) << "the store named a stream after stream_ending";
  } else {
    EXPECT_GT(d.sim.destroyed_stream_calls(), 0u) << "the control names the destroyed streams";
  }
}

TEST(checkpoint_store, a_stream_that_ends_is_never_named_again) {
  end_a_store_stream(/*announce=*/true);
  end_a_store_stream(/*announce=*/false);
}

TEST(checkpoint_store, statistics_as_json) {
  device d;
  const std::size_t size = 64 * KiB;
  store s(*d.allocator, opts(2 * size));
  iterate(s, std::vector<std::size_t>(4, size), 0, nullptr);
  s.synchronize();
  const store_stats st = s.stats();
  const nlohmann::json j = nlohmann::json::parse(to_json(st));
  EXPECT_EQ(j["device_budget"], 2 * size);
  EXPECT_EQ(j["device_bytes"]["peak"], 2 * size);
  EXPECT_EQ(j["copies"]["bytes_to_host"], 2 * size);
  EXPECT_EQ(j["copies"]["bytes_to_device"], 2 * size);
  const nlohmann::json& by = j["gets_by_source"];
  EXPECT_EQ(by["resident"].get<int>() + by["prefetched"].get<int>() + by["on_demand"].get<int>(), 4);
  EXPECT_EQ(j["host_arena"]["provider"], st.host_provider);
  EXPECT_GT(j["host_arena"]["pinned_bytes"].get<std::size_t>(), 0u);
  EXPECT_GE(j["copies"]["to_host_seconds"].get<double>(), 0.0);
}

}  // namespace
}  // namespace fragctl::checkpoint
