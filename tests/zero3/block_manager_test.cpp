// The block manager on sim with threads as 1 to 4 ranks: gathered blocks equal
// the original parameters byte for byte, reduce-scattered gradients equal a
// reference sum, live gathered bytes never exceed the budget, frozen and
// persistent parameters behave as specified, and a rank that never joins
// makes the others fail with an error naming rank, block and operation.
#include <cstring>
#include <latch>
#include <mutex>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "zero3/collectives/host_math.hpp"
#include "zero3/zero3_harness.hpp"

namespace fragctl::zero3 {
namespace {

using namespace std::chrono_literals;
using testing::load_parameters;
using testing::original;
using testing::rank_env;
using testing::run_ranks;
using testing::small_model;
using testing::small_options;

void expect_original(const block_manager& m, std::size_t block, std::span<const view> views) {
  const block_layout& l = m.layout().blocks[block];
  ASSERT_EQ(views.size(), l.parameters.size());
  for (std::size_t p = 0; p < views.size(); ++p) {
    const std::vector<unsigned char> full = original(block, p, l.parameters[p].bytes());
    ASSERT_EQ(views[p].bytes, full.size());
    ASSERT_NE(views[p].data, nullptr);
    ASSERT_EQ(std::memcmp(views[p].data, full.data(), full.size()), 0)
        << l.name << "." << l.parameters[p].name << " differs";
  }
}

class manager_ranks : public ::testing::TestWithParam<int> {};

TEST_P(manager_ranks, gathered_blocks_equal_the_original_parameters_byte_for_byte) {
  run_ranks(GetParam(), 10s, [](rank_env& env) {
    block_manager m(small_model(3), small_options(), *env.comm, *env.persistent, *env.transient);
    load_parameters(m);
    const stream_t compute = env.backend.create_stream();
    for (int step = 0; step < 3; ++step) {
      for (std::size_t b = 0; b < m.block_count(); ++b) {
        const std::span<const view> views = m.fetch(b, compute);
        EXPECT_EQ(m.state(b), block_state::available);
        expect_original(m, b, views);
        m.release(b, compute);
      }
      m.end_step(compute);
    }
    const zero3_stats s = m.stats();
    EXPECT_EQ(s.steps, 3U);
    EXPECT_EQ(s.trace_length, m.block_count());
    EXPECT_GT(s.prefetch_hits, 0U);  // later steps found blocks gathered ahead
    env.backend.destroy_stream(compute);
  });
}

// Issue 31 (zero3 at FSDP2's speed): forward then backward order, so the
// last block is released by forward and fetched first by backward. It was
// freed and gathered again (by the prefetch of the next fetch, or on demand
// at the start of backward where blocks gathered ahead filled
// prefetch_bytes, as on the 1.26 B Llama); it is kept now, one all-gather
// fewer per step, within the budget.
TEST_P(manager_ranks, a_block_fetched_next_again_keeps_its_buffer) {
  run_ranks(GetParam(), 10s, [](rank_env& env) {
    for (const bool full_window : {false, true}) {
      options o = small_options();
      if (full_window) o.prefetch_bytes = 1;  // full once one block is gathered ahead
      block_manager m(small_model(3), o, *env.comm, *env.persistent, *env.transient);
      load_parameters(m);
      const stream_t compute = env.backend.create_stream();
      const std::size_t n = m.block_count();
      std::vector<std::size_t> order;
      for (std::size_t b = 0; b < n; ++b) order.push_back(b);
      for (std::size_t b = n; b-- > 0;) order.push_back(b);
      for (int step = 0; step < 3; ++step) {
        for (std::size_t b : order) {
          expect_original(m, b, m.fetch(b, compute));
          m.release(b, compute);
        }
        m.end_step(compute);
        const zero3_stats s = m.stats();
        EXPECT_EQ(s.last_step_gathers, step == 0 ? 2 * n : 2 * n - 1) << "step " << step << " " << full_window;
        EXPECT_EQ(s.prefetch_kept, static_cast<std::uint64_t>(step)) << "step " << step << " " << full_window;
        EXPECT_LE(s.gathered.peak, m.configuration().max_live_bytes);
        EXPECT_EQ(s.gathered.current, 0U);  // nothing left gathered after the step
      }
      env.backend.destroy_stream(compute);
    }
  });
}

float gradient_value(int rank, std::size_t block, std::size_t param, std::size_t i) {
  return static_cast<float>(((block * 7 + param * 3 + i) % 11) + static_cast<std::size_t>(rank));
}

void write_gradient(void* data, std::size_t elements, data_type type, int rank, std::size_t block, std::size_t param) {
  for (std::size_t i = 0; i < elements; ++i) {
    const float v = gradient_value(rank, block, param, i);
    if (type == data_type::float32) {
      std::memcpy(static_cast<unsigned char*>(data) + 4 * i, &v, 4);
    } else {
      const std::uint16_t h = host_math::float_to_bf16(v);
      std::memcpy(static_cast<unsigned char*>(data) + 2 * i, &h, 2);
    }
  }
}

float read_gradient(const void* data, std::size_t i, data_type type) {
  if (type == data_type::float32) {
    float v = 0;
    std::memcpy(&v, static_cast<const unsigned char*>(data) + 4 * i, 4);
    return v;
  }
  std::uint16_t h = 0;
  std::memcpy(&h, static_cast<const unsigned char*>(data) + 2 * i, 2);
  return host_math::bf16_to_float(h);
}

void check_reduced_gradients(int ranks, data_type type) {
  run_ranks(ranks, 10s, [ranks, type](rank_env& env) {
    options o = small_options();
    o.gradient_type = type;
    block_manager m(small_model(3), o, *env.comm, *env.persistent, *env.transient);
    load_parameters(m);
    const int rank = env.comm->rank();
    const stream_t compute = env.backend.create_stream();
    const std::size_t element = size_of(type);
    std::vector<std::pair<std::size_t, view>> persistent_grads;  // (param key, view)
    for (std::size_t b = m.block_count(); b-- > 0;) {
      (void)m.fetch(b, compute);
      const std::span<const view> grads = m.begin_gradients(b, compute);
      const block_layout& l = m.layout().blocks[b];
      for (std::size_t p = 0; p < grads.size(); ++p) {
        if (!l.parameters[p].trainable) {
          EXPECT_EQ(grads[p].data, nullptr);
          continue;
        }
        ASSERT_EQ(grads[p].bytes, l.parameters[p].elements * element);
        write_gradient(grads[p].data, l.parameters[p].elements, type, rank, b, p);
        if (l.parameters[p].persistent) persistent_grads.push_back({b * 100 + p, grads[p]});
      }
      m.reduce_gradients(b, compute);
      m.release(b, compute);
    }
    m.finish_gradients(compute);
    // Each rank's gradient shard holds the sum over ranks of its slice.
    const model_layout& layout = m.layout();
    for (std::size_t b = 0; b < m.block_count(); ++b) {
      const block_layout& l = layout.blocks[b];
      const view shard = m.gradient_shard(b);
      const std::size_t per_rank = l.trainable_shard_elements();
      ASSERT_EQ(shard.bytes, per_rank * element);
      for (std::size_t p = 0; p < l.parameters.size(); ++p) {
        const parameter_layout& param = l.parameters[p];
        if (!param.trainable || param.persistent) continue;
        const std::size_t first = param.gradient_offset / element;
        for (std::size_t i = 0; i < param.elements; ++i) {
          const std::size_t flat = first + i;
          if (flat / per_rank != static_cast<std::size_t>(rank)) continue;
          float expected = 0;
          for (int r = 0; r < ranks; ++r) expected += gradient_value(r, b, p, i);
          ASSERT_EQ(read_gradient(shard.data, flat - static_cast<std::size_t>(rank) * per_rank, type), expected)
              << l.name << "." << param.name << "[" << i << "] on rank " << rank;
        }
      }
    }
    // Persistent gradients are summed on every rank.
    for (const auto& [key, v] : persistent_grads) {
      const std::size_t b = key / 100;
      const std::size_t p = key % 100;
      for (std::size_t i = 0; i < layout.blocks[b].parameters[p].elements; ++i) {
        float expected = 0;
        for (int r = 0; r < ranks; ++r) expected += gradient_value(r, b, p, i);
        ASSERT_EQ(read_gradient(v.data, i, type), expected) << "persistent " << key << "[" << i << "]";
      }
    }
    m.end_step(compute);
    env.backend.destroy_stream(compute);
  });
}

TEST_P(manager_ranks, reduce_scattered_fp32_gradients_equal_the_reference_sum) {
  check_reduced_gradients(GetParam(), data_type::float32);
}

TEST_P(manager_ranks, reduce_scattered_bf16_gradients_equal_the_reference_sum) {
  check_reduced_gradients(GetParam(), data_type::bfloat16);
}

TEST_P(manager_ranks, live_gathered_bytes_never_exceed_the_budget) {
  run_ranks(GetParam(), 10s, [](rank_env& env) {
    const auto model = small_model(6);
    options o = small_options();
    const model_layout probe = make_layout(model, env.comm->size(), o.persistence_threshold, o.alignment, 4);
    const std::size_t block = env.transient->allocation_size(probe.max_gathered_bytes);
    o.max_live_bytes = block * 5 / 2;  // two blocks, never three
    o.prefetch_bytes = block * 10;     // the budget, not the window, limits prefetching
    block_manager m(model, o, *env.comm, *env.persistent, *env.transient);
    load_parameters(m);
    const stream_t compute = env.backend.create_stream();
    const auto within_budget = [&] {
      const zero3_stats s = m.stats();
      ASSERT_LE(s.gathered.current, o.max_live_bytes);
      ASSERT_LE(s.gathered.peak, o.max_live_bytes);
      ASSERT_LE(env.transient_stats->stats().allocated.current, o.max_live_bytes);
    };
    const std::size_t n = m.block_count();
    for (int step = 0; step < 3; ++step) {
      // Forward then backward, holding the previous block while the next is used.
      std::vector<std::size_t> order;
      for (std::size_t b = 0; b < n; ++b) order.push_back(b);
      for (std::size_t b = n; b-- > 0;) order.push_back(b);
      std::size_t held = n;
      for (const std::size_t b : order) {
        expect_original(m, b, m.fetch(b, compute));
        within_budget();
        if (held != n) m.release(held, compute);
        within_budget();
        held = b;
      }
      m.release(held, compute);
      m.end_step(compute);
      within_budget();
    }
    const zero3_stats s = m.stats();
    EXPECT_GT(s.prefetch_hits, 0U);
    EXPECT_GT(s.prefetch_deferred, 0U);  // the budget held prefetches back
    EXPECT_EQ(s.gathered.current, 0U);
    EXPECT_EQ(env.transient_stats->stats().allocated.peak <= o.max_live_bytes, true);
    env.backend.destroy_stream(compute);
  });
}

INSTANTIATE_TEST_SUITE_P(ranks, manager_ranks, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& p) { return std::to_string(p.param) + "_ranks"; });

TEST(block_manager, a_fetch_beyond_the_budget_drops_prefetches_then_fails) {
  run_ranks(2, 10s, [](rank_env& env) {
    const auto model = small_model(4);
    options o = small_options();
    const model_layout probe = make_layout(model, 2, o.persistence_threshold, o.alignment, 4);
    const std::size_t block = env.transient->allocation_size(probe.max_gathered_bytes);
    o.max_live_bytes = block * 5 / 2;
    block_manager m(model, o, *env.comm, *env.persistent, *env.transient);
    load_parameters(m);
    for (std::size_t b = 0; b < m.block_count(); ++b) {  // record the order
      (void)m.fetch(b, nullptr);
      m.release(b, nullptr);
    }
    m.end_step(nullptr);
    (void)m.fetch(1, nullptr);  // out of order: re-records, no prefetch
    (void)m.fetch(2, nullptr);
    EXPECT_EQ(m.stats().trace_misses, 1U);
    try {
      (void)m.fetch(3, nullptr);  // a third block in use does not fit
      ADD_FAILURE() << "fetch beyond the budget succeeded";
    } catch (const budget_error& e) {
      EXPECT_NE(std::string(e.what()).find("max_live_bytes"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("block 3 'layer.2'"), std::string::npos) << e.what();
    }
    m.release(1, nullptr);
    m.release(2, nullptr);
    m.end_step(nullptr);
    // Step 3 follows the order step 2 recorded (1, 2, 3): fetch(1) prefetches
    // 2; an out-of-order demand for 4 while 1 is held drops the prefetched 2.
    (void)m.fetch(1, nullptr);
    EXPECT_EQ(m.state(2), block_state::available);
    (void)m.fetch(4, nullptr);
    EXPECT_EQ(m.state(2), block_state::not_available);
    const zero3_stats s = m.stats();
    EXPECT_GE(s.prefetch_dropped, 1U);
    EXPECT_LE(s.gathered.peak, o.max_live_bytes);
    m.release(1, nullptr);
    m.release(4, nullptr);
  });
}

// With sim work that completes only when told: a gather is in flight until
// the communication stream runs it, and a buffer released by a consumer is
// reused by the next gather only after the consumer's work (device-side
// ordering, no host wait).
TEST(block_manager, states_follow_the_streams) {
  rank_env env(0, /*manual_completion=*/true);
  env.comm = make_thread_communicator(make_thread_group(1, 5s), 0, env.backend);
  block_manager m(small_model(2), small_options(), *env.comm, *env.persistent, *env.transient);
  const stream_t compute = env.backend.create_stream();
  const stream_t comm = m.comm_stream();
  EXPECT_EQ(m.state(1), block_state::not_available);
  (void)m.fetch(1, compute);
  EXPECT_EQ(m.state(1), block_state::in_flight);
  EXPECT_EQ(m.stats().pending_at_fetch, 1U);
  env.backend.complete(comm);
  EXPECT_EQ(m.state(1), block_state::available);
  env.backend.submit(compute);  // a kernel reading block 1
  m.release(1, compute);        // the comm stream now waits for it
  EXPECT_EQ(m.state(1), block_state::not_available);
  (void)m.fetch(2, compute);    // gathered behind that wait
  env.backend.complete(comm);
  EXPECT_EQ(m.state(2), block_state::in_flight);
  env.backend.complete(compute);
  env.backend.complete(comm);
  EXPECT_EQ(m.state(2), block_state::available);
  m.release(2, compute);
  m.end_step(compute);
  env.backend.complete_all();
  EXPECT_EQ(m.stats().gathered.current, 0U);
  env.backend.destroy_stream(compute);
}

// The allocators' state in the statistics: what a benchmark reports as the
// manager's device memory (its own bytes plus the allocators' cache).
TEST(block_manager, statistics_report_the_allocators_reserved_bytes) {
  rank_env env(0);
  env.comm = make_thread_communicator(make_thread_group(1, 5s), 0, env.backend);
  block_manager m(small_model(2), small_options(), *env.comm, *env.persistent, *env.transient);
  (void)m.fetch(1, nullptr);
  const zero3_stats s = m.stats();
  // Gradient slices are held from a block's reduce on (none yet).
  EXPECT_EQ(s.gradients.current, 0U);
  const std::size_t long_lived = s.shard_bytes + s.persistent_bytes + s.persistent_gradient_bytes + s.bucket_bytes;
  EXPECT_GT(long_lived, 0U);
  EXPECT_GE(s.long_lived_pool.allocated, long_lived);
  EXPECT_GE(s.long_lived_pool.reserved, s.long_lived_pool.allocated);
  EXPECT_GT(s.gathered.current, 0U);
  EXPECT_GE(s.gathered_pool.allocated, s.gathered.current);
  EXPECT_GE(s.gathered_pool.reserved, s.gathered_pool.allocated);
  const nlohmann::json j = nlohmann::json::parse(to_json(s));
  EXPECT_EQ(j["allocators"]["long_lived"]["reserved"].get<std::size_t>(), s.long_lived_pool.reserved);
  EXPECT_EQ(j["allocators"]["gathered"]["allocated"].get<std::size_t>(), s.gathered_pool.allocated);
  m.release(1, nullptr);
  m.end_step(nullptr);
  env.backend.complete_all();
  EXPECT_EQ(m.stats().gathered_pool.allocated, 0U);
}

TEST(block_manager, persistent_and_frozen_parameters) {
  run_ranks(2, 10s, [](rank_env& env) {
    std::vector<block_spec> model = small_model(1);
    model.push_back({"norm_only", {{"g", 10, 2, true}}});
    model.push_back({"frozen_only", {{"w", 3000, 2, false}}});
    block_manager m(model, small_options(), *env.comm, *env.persistent, *env.transient);
    load_parameters(m);
    const std::size_t layer = *m.find_block("layer.0");
    const std::size_t norm = *m.find_block("norm_only");
    const std::size_t frozen = *m.find_block("frozen_only");

    // Persistent: whole on every rank, readable without a fetch, not gathered.
    const view norm1 = m.persistent_parameter(layer, 0);
    EXPECT_EQ(std::memcmp(norm1.data, original(layer, 0, 60).data(), 60), 0);
    EXPECT_THROW((void)m.persistent_parameter(layer, 1), invalid_argument);
    EXPECT_EQ(m.shard_of(layer, 0).data.data, norm1.data);
    EXPECT_EQ(m.state(norm), block_state::available);
    const std::uint64_t gathers = m.stats().gathers;
    const std::span<const view> nv = m.fetch(norm, nullptr);
    EXPECT_EQ(m.stats().gathers, gathers);  // no collective for a persistent-only block
    EXPECT_EQ(nv[0].data, m.persistent_parameter(norm, 0).data);
    m.release(norm, nullptr);
    const std::span<const view> lv = m.fetch(layer, nullptr);
    EXPECT_EQ(lv[0].data, norm1.data);
    expect_original(m, layer, lv);
    m.release(layer, nullptr);

    // Frozen: gathered, but no gradient view, shard or reduction.
    expect_original(m, frozen, m.fetch(frozen, nullptr));
    const std::uint64_t reductions = m.stats().reduce_scatters;
    const std::span<const view> fg = m.begin_gradients(frozen, nullptr);
    EXPECT_EQ(fg[0].data, nullptr);
    EXPECT_EQ(fg[0].bytes, 0U);
    m.reduce_gradients(frozen, nullptr);
    EXPECT_EQ(m.stats().reduce_scatters, reductions);
    EXPECT_EQ(m.gradient_shard(frozen).bytes, 0U);
    m.release(frozen, nullptr);
    const std::span<const view> lg = m.begin_gradients(layer, nullptr);
    EXPECT_EQ(lg[3].data, nullptr);  // "base" is frozen
    EXPECT_NE(lg[1].data, nullptr);
    m.reduce_gradients(layer, nullptr);
    m.finish_gradients(nullptr);
    m.end_step(nullptr);

    const zero3_stats s = m.stats();
    EXPECT_EQ(s.persistent_parameters, 2U + 1 + 1);  // norm1, norm2, final_norm, g
    EXPECT_EQ(s.frozen_parameters, 2U);
    EXPECT_EQ(s.gradient_shard_bytes, m.layout().trainable_shard_elements * 4);
  });
}

TEST(block_manager, misuse_is_reported) {
  run_ranks(1, 5s, [](rank_env& env) {
    block_manager m(small_model(2), small_options(), *env.comm, *env.persistent, *env.transient);
    EXPECT_THROW(m.release(1, nullptr), invalid_argument);
    EXPECT_THROW((void)m.fetch(99, nullptr), invalid_argument);
    EXPECT_THROW(m.reduce_gradients(1, nullptr), invalid_argument);
    (void)m.fetch(1, nullptr);
    (void)m.fetch(1, nullptr);  // a second consumer
    EXPECT_EQ(m.consumers(1), 2);
    m.release(1, nullptr);
    EXPECT_EQ(m.state(1), block_state::available);  // still held by one consumer
    try {
      m.end_step(nullptr);
      ADD_FAILURE() << "end_step with a block in use succeeded";
    } catch (const invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("block 1 'layer.0' still in use"), std::string::npos) << e.what();
    }
    m.release(1, nullptr);
    EXPECT_EQ(m.state(1), block_state::not_available);
    EXPECT_THROW(m.release(1, nullptr), invalid_argument);
    (void)m.begin_gradients(0, nullptr);
    (void)m.begin_gradients(1, nullptr);
    EXPECT_THROW((void)m.begin_gradients(2, nullptr), invalid_argument);  // both buckets held
    EXPECT_THROW((void)m.begin_gradients(1, nullptr), invalid_argument);
    EXPECT_THROW(m.end_step(nullptr), invalid_argument);
    m.reduce_gradients(0, nullptr);
    m.reduce_gradients(1, nullptr);
    m.end_step(nullptr);
    options tight = small_options();
    tight.max_live_bytes = 1024;
    EXPECT_THROW(block_manager(small_model(1), tight, *env.comm, *env.persistent, *env.transient), invalid_argument);
  });
}

TEST(block_manager, a_rank_that_never_joins_fails_the_fetch_with_rank_block_and_operation) {
  std::string message;
  std::mutex mutex;
  std::latch done(1);
  run_ranks(2, 200ms, [&](rank_env& env) {
    block_manager m(small_model(1), small_options(), *env.comm, *env.persistent, *env.transient);
    if (env.comm->rank() == 1) {
      done.wait();  // never fetches
      return;
    }
    try {
      (void)m.fetch(0, nullptr);
      ADD_FAILURE() << "fetch completed without rank 1";
    } catch (const collective_error& e) {
      EXPECT_TRUE(e.timed_out());
      EXPECT_EQ(e.rank(), 0);
      EXPECT_EQ(e.operation(), "all_gather");
      EXPECT_EQ(e.tag(), "block 0 'embed'");
      std::lock_guard lock(mutex);
      message = e.what();
    }
    done.count_down();
    EXPECT_THROW((void)m.fetch(1, nullptr), collective_error);  // the communicator stays aborted
  });
  EXPECT_NE(message.find("zero3 rank 0: all_gather #1 of block 0 'embed' did not complete within 200 ms: rank 1 has "
                         "not entered it"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("rank 1 has not entered all_gather #1 of block 0 'embed'; it has completed no collective"),
            std::string::npos)
      << message;
}

TEST(block_manager, statistics_json) {
  run_ranks(2, 10s, [](rank_env& env) {
    block_manager m(small_model(2), small_options(), *env.comm, *env.persistent, *env.transient);
    std::size_t gathered = 0;
    for (int step = 0; step < 2; ++step) {
      for (std::size_t b = 0; b < m.block_count(); ++b) {
        (void)m.fetch(b, nullptr);
        m.release(b, nullptr);
        if (step == 0) gathered += m.layout().blocks[b].gathered_bytes;
      }
      m.end_step(nullptr);
    }
    const zero3_stats s = m.stats();
    const nlohmann::json j = nlohmann::json::parse(to_json(s));
    EXPECT_EQ(j["schema"], "fragctl.zero3");
    EXPECT_EQ(j["world_size"], 2);
    EXPECT_EQ(j["communicator"], "threads");
    EXPECT_EQ(j["steps"], 2);
    EXPECT_EQ(j["fetches"], 2 * m.block_count());
    EXPECT_EQ(j["last_step"]["all_gather_bytes"], gathered);
    EXPECT_EQ(j["communicated_bytes"]["all_gather"], 2 * gathered);
    EXPECT_EQ(j["long_lived_bytes"]["shard"], m.layout().shard_bytes);
    EXPECT_EQ(j["gathered_bytes"]["current"], 0);
    EXPECT_EQ(j["gradient_bytes"]["current"], 0);  // no reduce yet
    EXPECT_GT(j["gathered_bytes"]["peak"].get<std::size_t>(), 0U);
    EXPECT_EQ(j["prefetch"]["trace_length"], m.block_count());
    EXPECT_TRUE(j.contains("stall_seconds"));
  });
}

}  // namespace
}  // namespace fragctl::zero3
