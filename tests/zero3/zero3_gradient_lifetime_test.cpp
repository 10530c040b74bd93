// Regression (issue 20, one-GPU peak): the gradient shard was allocated at
// construction, so it held gradient_shard_bytes through every forward, where
// FSDP2 holds no gradient. On sim with 1 and 2 thread ranks: no gradient
// slice is held before a block's first reduce or after release_gradients
// (the long-lived allocator's bytes during a forward drop by exactly the
// slices'), each reduce allocates its block's slice and fills it with the
// sum over ranks, and release_gradients is refused while a block holds a
// reduce bucket; a reduce into a slice released on the same stream reuses it
// and waits for that stream's earlier work, and one on another stream never
// writes it early; a reduce whose slice allocation fails keeps its bucket.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "zero3/zero3_harness.hpp"

namespace fragctl::zero3 {
namespace {

using namespace std::chrono_literals;
using testing::load_parameters;
using testing::rank_env;
using testing::run_ranks;
using testing::small_model;
using testing::small_options;

/// A backward over every block (last to first): each trainable gradient is
/// all ones.
void backward(block_manager& m, stream_t s) {
  for (std::size_t b = m.block_count(); b-- > 0;) {
    (void)m.fetch(b, s);
    const std::span<const view> grads = m.begin_gradients(b, s);
    for (const view& g : grads) {
      auto* f = static_cast<float*>(g.data);
      for (std::size_t i = 0; i < g.bytes / sizeof(float); ++i) f[i] = 1.0F;
    }
    m.reduce_gradients(b, s);
    m.release(b, s);
  }
  m.finish_gradients(s);
}

/// A forward over every block; returns the most gradient-slice bytes the
/// manager held at any fetch.
std::size_t forward(block_manager& m, stream_t s) {
  std::size_t held = 0;
  for (std::size_t b = 0; b < m.block_count(); ++b) {
    (void)m.fetch(b, s);
    held = std::max(held, m.stats().gradients.current);
    m.release(b, s);
  }
  return held;
}

/// Every element of every held slice equals `ranks` (a sum of ones); padding
/// (zero in the buckets) stays zero, so the count of `ranks` is returned.
std::size_t count_sums(block_manager& m, float ranks) {
  std::size_t n = 0;
  for (std::size_t b = 0; b < m.block_count(); ++b) {
    const view g = m.gradient_shard(b);
    if (g.bytes == 0) continue;
    EXPECT_NE(g.data, nullptr) << "block " << b;
    if (g.data == nullptr) continue;
    const auto* f = static_cast<const float*>(g.data);
    for (std::size_t i = 0; i < g.bytes / sizeof(float); ++i) {
      EXPECT_TRUE(f[i] == ranks || f[i] == 0.0F) << "block " << b << " element " << i << " = " << f[i];
      n += f[i] == ranks;
    }
  }
  return n;
}

class zero3_gradient_lifetime_ranks : public ::testing::TestWithParam<int> {};

TEST_P(zero3_gradient_lifetime_ranks, gradient_slices_live_from_reduce_to_release) {
  const int ranks = GetParam();
  run_ranks(ranks, 10s, [ranks](rank_env& env) {
    block_manager m(small_model(3), small_options(), *env.comm, *env.persistent, *env.transient);
    load_parameters(m);
    const std::size_t slices = m.stats().gradient_shard_bytes;
    ASSERT_GT(slices, 0U);
    const std::size_t without_gradients = env.persistent->state().allocated;
    for (std::size_t b = 0; b < m.block_count(); ++b) EXPECT_EQ(m.gradient_shard(b).data, nullptr) << b;

    // Step 1: nothing held in the first forward; every slice after backward.
    EXPECT_EQ(forward(m, nullptr), 0U);
    backward(m, nullptr);
    env.backend.complete_all();
    EXPECT_EQ(m.stats().gradients.current, slices);
    EXPECT_EQ(m.stats().gradients.peak, slices);
    EXPECT_GE(env.persistent->state().allocated, without_gradients + slices);
    const std::size_t sums = count_sums(m, static_cast<float>(ranks));
    EXPECT_GT(sums, 0U);
    m.end_step(nullptr);

    // zero_grad(set_to_none=True): released; the next forward holds none,
    // and the long-lived allocator holds exactly what it held before.
    m.release_gradients(nullptr);
    env.backend.complete_all();
    EXPECT_EQ(m.stats().gradients.current, 0U);
    EXPECT_EQ(env.persistent->state().allocated, without_gradients);
    for (std::size_t b = 0; b < m.block_count(); ++b) EXPECT_EQ(m.gradient_shard(b).data, nullptr) << b;
    EXPECT_EQ(forward(m, nullptr), 0U);
    EXPECT_EQ(env.persistent->state().allocated, without_gradients);
    m.release_gradients(nullptr);  // nothing held: a no-op

    // Step 2: slices again (possibly elsewhere), with the same sums.
    backward(m, nullptr);
    env.backend.complete_all();
    EXPECT_EQ(m.stats().gradients.current, slices);
    EXPECT_EQ(count_sums(m, static_cast<float>(ranks)), sums);
    m.end_step(nullptr);

    // set_to_none=False: no release; the next forward holds every slice.
    EXPECT_EQ(forward(m, nullptr), slices);
    m.end_step(nullptr);
  });
}

INSTANTIATE_TEST_SUITE_P(zero3_gradient_lifetime, zero3_gradient_lifetime_ranks, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& i) { return std::to_string(i.param); });

/// Completes the work of `streams` in turn, 16 rounds (more than the waits
/// between them here need); work waiting on any other stream stays pending.
void complete_until_blocked(sim_backend& sim, std::initializer_list<stream_t> streams) {
  for (int round = 0; round < 16; ++round) {
    for (const stream_t s : streams) sim.complete(s);
  }
}

// release_gradients(s) frees the slices on s (after s waits for the comm
// stream): with sim work completing only when told, a kernel on s still
// reading the slices (an optimizer step) holds back the next backward's
// reduce-scatter into the reused memory until s completes; a backward on
// another stream never writes them early.
/// After a step on stream `optimizer`, a kernel left reading the gradient
/// slices there, release_gradients(optimizer) and a backward on the same
/// stream or another: returns (slices reused by that backward, whether its
/// reduces completed while the kernel still ran).
std::pair<std::size_t, bool> reduce_after_release(bool same_stream) {
  rank_env env(0, /*manual_completion=*/true);
  env.comm = make_thread_communicator(make_thread_group(1, 5s), 0, env.backend);
  block_manager m(small_model(2), small_options(), *env.comm, *env.persistent, *env.transient);
  const stream_t optimizer = env.backend.create_stream();
  const stream_t next = same_stream ? optimizer : env.backend.create_stream();
  const stream_t comm = m.comm_stream();
  backward(m, optimizer);
  m.end_step(optimizer);
  env.backend.complete_all();
  std::vector<void*> slices;
  for (std::size_t b = 0; b < m.block_count(); ++b) slices.push_back(m.gradient_shard(b).data);

  env.backend.submit(optimizer);  // a kernel still reading the slices
  m.release_gradients(optimizer);
  backward(m, next);
  std::size_t reused = 0;
  for (std::size_t b = 0; b < m.block_count(); ++b) {
    reused += slices[b] != nullptr && m.gradient_shard(b).data == slices[b];
  }
  const event_t reduced = env.backend.create_event();
  env.backend.record_event(reduced, comm);
  if (same_stream) {
    complete_until_blocked(env.backend, {comm});  // the kernel heads `optimizer`: leave it running
  } else {
    complete_until_blocked(env.backend, {next, comm});
  }
  const bool early = env.backend.query_event(reduced);
  env.backend.complete(optimizer);
  complete_until_blocked(env.backend, {next, comm});
  EXPECT_TRUE(env.backend.query_event(reduced));  // positive control: ordered, not stuck

  m.end_step(next);
  env.backend.complete_all();
  env.backend.destroy_event(reduced);
  if (next != optimizer) env.backend.destroy_stream(next);
  env.backend.destroy_stream(optimizer);
  return {reused, early};
}

TEST(zero3_gradient_lifetime, reduce_into_a_released_slice_waits_for_the_releasing_stream) {
  // Released and reduced again on one stream (the training loop's): the
  // slices are reused at once, and the reduce-scatters into them run only
  // after the kernel that still read them.
  const auto [reused, early] = reduce_after_release(/*same_stream=*/true);
  EXPECT_GT(reused, 0U);
  EXPECT_FALSE(early) << "a reduce-scatter into a freed slice ran before the kernel";
}

TEST(zero3_gradient_lifetime, a_slice_released_on_one_stream_is_not_written_by_another_streams_reduce_early) {
  // Reduced on another stream: whatever the allocator hands over, no
  // reduce-scatter writes a slice the kernel still reads.
  const auto [reused, early] = reduce_after_release(/*same_stream=*/false);
  EXPECT_TRUE(reused == 0 || !early) << reused << " slices reused, and a reduce-scatter ran before the kernel";
}

/// Forwards to an upstream allocator and counts the calls made on streams
/// other than `expected`.
class stream_check final : public device_allocator {
 public:
  stream_check(device_allocator& upstream, stream_t expected) : upstream_(upstream), expected_(expected) {}
  int others = 0;  // allocations and frees on another stream
  int calls = 0;

 private:
  void* do_allocate(std::size_t bytes, stream_t stream) override {
    count(stream);
    return upstream_.allocate(bytes, stream);
  }
  free_result do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override {
    count(stream);
    return upstream_.try_deallocate(ptr, bytes, stream);
  }
  void count(stream_t stream) noexcept {
    ++calls;
    others += stream != expected_;
  }
  std::size_t do_allocation_size(std::size_t bytes) const noexcept override { return upstream_.allocation_size(bytes); }
  pool_state do_state() const override { return upstream_.state(); }
  void do_release_cached() override { upstream_.release_cached(); }
  device_backend& do_backend() const noexcept override { return upstream_.backend(); }
  std::string_view do_name() const noexcept override { return "stream_check"; }

  device_allocator& upstream_;
  stream_t expected_;
};

TEST(zero3_gradient_lifetime, gathered_blocks_and_slices_come_from_the_stream_that_uses_them) {
  // Regression (issue 20, one pool under fragctl.torch.enable): the manager
  // allocated and freed on its comm stream, so PyTorch's stream could take
  // that memory only once the host saw the frees complete, and the arena
  // re-stitched physical memory every step (289 driver calls per step).
  rank_env env(0);
  env.comm = make_thread_communicator(make_thread_group(1, 5s), 0, env.backend);
  const stream_t s = env.backend.create_stream();
  {
    stream_check transient(*env.transient, s);
    stream_check persistent(*env.persistent, s);
    options o = small_options();
    o.prefetch = false;  // a block gathered ahead and never fetched is freed on the comm stream
    block_manager m(small_model(3), o, *env.comm, persistent, transient);
    const int long_lived = persistent.calls;  // shards and buckets, on no stream
    for (int step = 0; step < 2; ++step) {
      (void)forward(m, s);
      backward(m, s);
      m.end_step(s);
      m.release_gradients(s);
    }
    EXPECT_GT(transient.calls, 0);
    EXPECT_EQ(transient.others, 0) << "gathered blocks allocated or freed off the fetching stream";
    EXPECT_GT(persistent.calls, long_lived);
    EXPECT_EQ(persistent.others, long_lived) << "gradient slices allocated or freed off the reducing stream";
  }
  env.backend.destroy_stream(s);
}

TEST(zero3_gradient_lifetime, release_while_a_block_holds_a_reduce_bucket_is_refused) {
  run_ranks(1, 5s, [](rank_env& env) {
    block_manager m(small_model(2), small_options(), *env.comm, *env.persistent, *env.transient);
    (void)m.begin_gradients(1, nullptr);
    try {
      m.release_gradients(nullptr);
      ADD_FAILURE() << "release_gradients with a bucket held succeeded";
    } catch (const invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("release_gradients while block 1 'layer.0' holds a reduce bucket (its "
                                           "reduce_gradients has not been called)"),
                std::string::npos)
          << e.what();
    }
    m.reduce_gradients(1, nullptr);
    EXPECT_NE(m.gradient_shard(1).data, nullptr);
    m.release_gradients(nullptr);  // positive control: accepted once the reduce is issued
    EXPECT_EQ(m.gradient_shard(1).data, nullptr);
    EXPECT_EQ(m.stats().gradients.current, 0U);
  });
}

// A slice allocation that runs out of memory leaves the block its bucket and
// issues nothing: release_gradients refuses (the reduce is still to come) and
// reduce_gradients succeeds once memory is free.
TEST(zero3_gradient_lifetime, a_reduce_whose_slice_does_not_fit_keeps_its_bucket) {
  run_ranks(1, 5s, [](rank_env& env) {
    limiting_adaptor limited(std::move(env.persistent), SIZE_MAX);
    block_manager m(small_model(2), small_options(), *env.comm, limited, *env.transient);
    limited.set_limit(limited.used());
    const std::uint64_t reduces = m.stats().reduce_scatters;
    (void)m.begin_gradients(1, nullptr);
    EXPECT_THROW(m.reduce_gradients(1, nullptr), out_of_memory);
    EXPECT_EQ(m.gradient_shard(1).data, nullptr);
    EXPECT_EQ(m.stats().gradients.current, 0U);
    EXPECT_EQ(m.stats().reduce_scatters, reduces);
    EXPECT_THROW(m.release_gradients(nullptr), invalid_argument);
    limited.set_limit(SIZE_MAX);
    m.reduce_gradients(1, nullptr);  // positive control: the retry reduces
    EXPECT_NE(m.gradient_shard(1).data, nullptr);
    EXPECT_EQ(m.stats().reduce_scatters, reduces + 1);
    m.release_gradients(nullptr);
    EXPECT_EQ(m.stats().gradients.current, 0U);
  });
}

// After the communicator is aborted (a reduce-scatter that will never end)
// release_gradients raises its error rather than queue frees behind it.
TEST(zero3_gradient_lifetime, release_after_an_abort_raises_the_collective_error) {
  run_ranks(1, 5s, [](rank_env& env) {
    block_manager m(small_model(2), small_options(), *env.comm, *env.persistent, *env.transient);
    (void)m.begin_gradients(1, nullptr);
    m.reduce_gradients(1, nullptr);
    const std::size_t held = m.stats().gradients.current;
    ASSERT_GT(held, 0U);
    env.comm->abort();
    EXPECT_THROW(m.release_gradients(nullptr), collective_error);
    EXPECT_EQ(m.stats().gradients.current, held);
  });
}

}  // namespace
}  // namespace fragctl::zero3
