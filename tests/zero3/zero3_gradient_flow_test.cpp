// The gradient path of a framework binding (fragctl/zero3/gradient_flow.hpp),
// driven as fragctl.torch.zero3 drives it, by a binding written here that
// does the actions with host arithmetic on backed sim (thread ranks). Each
// case of tests/torch/test_zero3.py that exercises the gradient semantics
// has its counterpart, checked element by element against the mean over
// ranks of what each rank's gradients sum to: a parameter applied twice,
// accumulation over backwards while `.grad` is set, a second reduce in one
// backward (a recompute) kept, a second reduce at the end of backward with a
// persistent parameter left without gradient, a backward that raised
// settled at the next forward, slices freed before a forward only when no
// gradient is set, partial sums delivered at the end, frozen parameters, a
// block without gradient keeping none, holds taken once and released at the
// reduce, held slices without gradient adding nothing to what they carry,
// and the same results one action per call.
#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fragctl/zero3/zero3.h"
#include "gtest/gtest.h"
#include "support/test_support.hpp"
#include "zero3/zero3_harness.hpp"

namespace fragctl::zero3 {
namespace {

using namespace std::chrono_literals;
using testing::rank_env;
using testing::run_ranks;

// Blocks: "first" (w0 partitioned, b0 persistent), "shared" (w1, b1), "last"
// (w2 and a frozen f2). fp32 parameters and gradients.
std::vector<block_spec> model() {
  return {{"first", {{"w0", 600, 4, true}, {"b0", 16, 4, true}}},
          {"shared", {{"w1", 700, 4, true}, {"b1", 20, 4, true}}},
          {"last", {{"w2", 300, 4, true}, {"f2", 200, 4, false}}}};
}

options model_options() {
  options o;
  o.persistence_threshold = 64;
  o.gradient_type = data_type::float32;
  return o;
}

/// A tensor of the binding: its own memory, or a view of the manager's.
struct tensor {
  std::shared_ptr<std::vector<float>> own;
  float* data = nullptr;
  std::size_t n = 0;
};

tensor owned(const float* from, std::size_t n) {
  auto v = std::make_shared<std::vector<float>>(from, from + n);
  return {v, v->data(), n};
}

tensor memory(void* p, std::size_t n) { return {nullptr, static_cast<float*>(p), n}; }

/// Gradient of application `a` of parameter `p` of block `b` on rank `r`:
/// small integers, so sums and halves are exact in fp32.
std::vector<float> gradient(int r, std::size_t b, std::size_t p, int a, std::size_t n) {
  std::vector<float> g(n);
  for (std::size_t e = 0; e < n; ++e) {
    g[e] = static_cast<float>((r + 1) * (a + 1) + static_cast<int>((e + b + p) % 7));
  }
  return g;
}

/// What fragctl.torch.zero3's _gradients.py does, in C++.
struct binding {
  binding(block_manager& manager, int rank) : m(manager), r(rank) {
    const model_layout& l = m.layout();
    for (std::size_t b = 0; b < l.blocks.size(); ++b) {
      if (l.blocks[b].trainable_shard_elements() > 0) {
        views.emplace_back();
        shard_of.emplace_back(b, SIZE_MAX);
      }
      for (std::size_t p = 0; p < l.blocks[b].parameters.size(); ++p) {
        const parameter_layout& pl = l.blocks[b].parameters[p];
        if (!pl.persistent || !pl.trainable) continue;
        views.push_back(memory(m.persistent_gradient(b, p).data, pl.elements));
        shard_of.emplace_back(b, p);
      }
    }
    grads.resize(views.size());
  }

  std::vector<std::size_t> event(gradient_event e, std::size_t b = 0, std::size_t p = 0,
                                 std::optional<tensor> value = std::nullopt, bool report = false) {
    std::vector<std::size_t> tracked;
    for (;;) {
      std::vector<unsigned char> set;
      if (report) {
        for (const auto& g : grads) set.push_back(g.has_value() ? 1 : 0);
      }
      const gradient_batch batch = m.gradient_step(e, b, p, nullptr, set, capacity);
      e = gradient_event::resume;
      report = false;
      ++calls;
      for (const gradient_action& a : batch.actions) do_action(a, value, tracked, report);
      if (!batch.more) return tracked;
    }
  }

  void do_action(const gradient_action& a, std::optional<tensor>& value, std::vector<std::size_t>& tracked,
                 bool& report) {
    auto* at = static_cast<float*>(a.pointer);
    switch (a.what) {
      case gradient_do::track: tracked.push_back(a.param); break;
      case gradient_do::fetch: (void)m.fetch(a.block, nullptr); ++fetches; break;
      case gradient_do::queue_end: end_queued = true; break;
      case gradient_do::report: report = true; break;
      case gradient_do::carry: kept[a.slot] = owned(grads[a.shard]->data, grads[a.shard]->n); break;
      case gradient_do::zero_view: std::fill_n(views[a.shard]->data, views[a.shard]->n, 0.0F); break;
      case gradient_do::keep: kept[a.slot] = *value; break;
      case gradient_do::add_kept: value = sum(take(a.slot), *value); break;
      case gradient_do::take: value = take(a.slot); break;
      case gradient_do::drop: ASSERT_EQ(kept.erase(a.slot), 1U); break;
      case gradient_do::bucket_copy:
        for (std::size_t i = 0; i < a.elements; ++i) at[i] = value->data[i] / world();
        break;
      case gradient_do::bucket_add:
        for (std::size_t i = 0; i < a.elements; ++i) at[i] += value->data[i] / world();
        break;
      case gradient_do::bucket_zero: std::fill_n(at, a.elements, 0.0F); break;
      case gradient_do::keep_slice: kept[a.slot] = owned(at, a.elements); break;
      case gradient_do::add_slice: kept[a.slot] = sum(kept.at(a.slot), memory(at, a.elements)); break;
      case gradient_do::release: m.release(a.block, nullptr); ++releases; break;
      case gradient_do::bind:
        views[a.shard] = a.pointer == nullptr ? std::nullopt : std::optional<tensor>(memory(at, a.elements));
        break;
      case gradient_do::bind_kept: views[a.shard] = take(a.slot); break;
      case gradient_do::add_to_view: {
        const tensor t = take(a.slot);
        for (std::size_t i = 0; i < t.n; ++i) views[a.shard]->data[i] += t.data[i];
        break;
      }
      case gradient_do::set_grad: grads[a.shard] = views[a.shard]; break;
    }
  }

  tensor take(std::size_t slot) {
    auto it = kept.find(slot);
    EXPECT_NE(it, kept.end()) << "slot " << slot;
    if (it == kept.end()) return {};
    tensor t = it->second;
    kept.erase(it);
    return t;
  }
  static tensor sum(const tensor& a, const tensor& b) {
    tensor t = owned(a.data, a.n);
    for (std::size_t i = 0; i < t.n; ++i) t.data[i] += b.data[i];
    return t;
  }
  [[nodiscard]] float world() const { return static_cast<float>(m.stats().world_size); }

  /// A forward over `blocks` (every block when empty): the root's event,
  /// then each block fetched, applied with gradients, released. Returns the
  /// parameters tracked per block.
  std::map<std::size_t, std::vector<std::size_t>> forward(std::vector<std::size_t> blocks = {},
                                                          bool in_backward = false) {
    (void)event(in_backward ? gradient_event::forward_in_backward : gradient_event::forward, 0, 0, std::nullopt,
                true);
    if (blocks.empty()) {
      for (std::size_t b = 0; b < m.block_count(); ++b) blocks.push_back(b);
    }
    std::map<std::size_t, std::vector<std::size_t>> tracked;
    for (const std::size_t b : blocks) {
      (void)m.fetch(b, nullptr);
      const std::vector<std::size_t> t = event(gradient_event::applied, b);
      tracked[b].insert(tracked[b].end(), t.begin(), t.end());
      m.release(b, nullptr);
    }
    return tracked;
  }

  /// Gradients of application `a` for every parameter of `params`, blocks
  /// last to first, each block unpacked first (as autograd reads its saved
  /// weights before the gradient arrives).
  void backward(const std::map<std::size_t, std::vector<std::size_t>>& params, int a) {
    for (auto it = params.rbegin(); it != params.rend(); ++it) {
      (void)event(gradient_event::unpacked, it->first);
      for (const std::size_t p : it->second) arrive(it->first, p, a);
    }
  }

  void arrive(std::size_t b, std::size_t p, int a) {
    const std::size_t n = m.layout().blocks[b].parameters[p].elements;
    const std::vector<float> g = gradient(r, b, p, a, n);
    (void)event(gradient_event::arrived, b, p, owned(g.data(), n));
  }

  void end_backward() {
    ASSERT_TRUE(end_queued);
    end_queued = false;
    (void)event(gradient_event::backward_ended);
  }

  /// The shard whose gradient holds parameter `p` of block `b`.
  [[nodiscard]] std::size_t shard(std::size_t b, std::size_t p) const {
    const bool whole = m.layout().blocks[b].parameters[p].persistent;
    for (std::size_t k = 0; k < shard_of.size(); ++k) {
      if (shard_of[k] == std::make_pair(b, whole ? p : SIZE_MAX)) return k;
    }
    return SIZE_MAX;
  }

  /// Checks every element of parameter `p` of block `b` this rank holds in
  /// its shard's gradient (`.grad`) against expected(element); returns how
  /// many were checked.
  template <class F>
  std::size_t check(std::size_t b, std::size_t p, F expected) {
    const std::size_t k = shard(b, p);
    const std::optional<tensor>& g = grads[k];
    if (!g.has_value()) {
      ADD_FAILURE() << "block " << b << " parameter " << p << ": no gradient";
      return 0;
    }
    const parameter_layout& pl = m.layout().blocks[b].parameters[p];
    std::size_t first = 0;
    std::size_t count = pl.elements;
    std::size_t from = 0;
    if (!pl.persistent) {
      const block_manager::parameter_part part = m.shard_of(b, p);
      if (part.data.data == nullptr) return 0;
      const auto* t_start = static_cast<const unsigned char*>(m.shard_buffer().data) + m.layout().blocks[b].shard_offset;
      first = static_cast<std::size_t>(static_cast<const unsigned char*>(part.data.data) - t_start) / 4;
      count = part.data.bytes / 4;
      from = part.parameter_offset / 4;
    }
    for (std::size_t j = 0; j < count; ++j) {
      const float want = expected(from + j);
      if (g->data[first + j] != want) {
        ADD_FAILURE() << "rank " << r << " block " << b << " parameter " << p << " element " << from + j << ": "
                      << g->data[first + j] << ", expected " << want;
        return j;
      }
    }
    return count;
  }

  block_manager& m;
  int r;
  std::size_t capacity = 64;
  std::map<std::size_t, tensor> kept;
  std::vector<std::optional<tensor>> views;
  std::vector<std::optional<tensor>> grads;
  std::vector<std::pair<std::size_t, std::size_t>> shard_of;
  bool end_queued = false;
  int calls = 0;
  int fetches = 0;
  int releases = 0;
};

/// The mean over `ranks` of the sum of applications `as` (0-based) of
/// parameter p of block b, element e.
float mean(int ranks, std::size_t b, std::size_t p, std::size_t e, std::initializer_list<int> as) {
  float total = 0.0F;
  for (int r = 0; r < ranks; ++r) {
    for (const int a : as) total += gradient(r, b, p, a, e + 1)[e] / static_cast<float>(ranks);
  }
  return total;
}

/// Checks every trainable parameter of the model for the sum of `as`.
void check_all(binding& g, int ranks, std::initializer_list<int> as) {
  const model_layout& l = g.m.layout();
  for (std::size_t b = 0; b < l.blocks.size(); ++b) {
    for (std::size_t p = 0; p < l.blocks[b].parameters.size(); ++p) {
      if (!l.blocks[b].parameters[p].trainable) continue;
      (void)g.check(b, p, [&](std::size_t e) { return mean(ranks, b, p, e, as); });
    }
  }
}

/// Runs body(env, manager, binding) on `ranks` thread ranks, each with a
/// manager of model() and a binding over it.
void each_rank(int ranks, const std::function<void(rank_env&, block_manager&, binding&)>& body) {
  run_ranks(ranks, 10s, [&body](rank_env& env) {
    block_manager m(model(), model_options(), *env.comm, *env.persistent, *env.transient);
    binding g(m, env.comm->rank());
    body(env, m, g);
  });
}

class zero3_gradient_flow : public ::testing::TestWithParam<int> {};

// test_two_ranks_equal_the_unsharded_model's gradient half; frozen f2 has
// none (not tracked), and no block stays held.
TEST_P(zero3_gradient_flow, one_backward_gives_the_mean_over_ranks) {
  const int ranks = GetParam();
  each_rank(ranks, [ranks](rank_env& env, block_manager& m, binding& g) {
    const auto tracked = g.forward();
    EXPECT_EQ(tracked.at(2), (std::vector<std::size_t>{0}));  // f2 is frozen
    g.backward(tracked, 0);
    g.end_backward();
    env.backend.complete_all();
    check_all(g, ranks, {0});
    EXPECT_EQ(g.fetches, 3);
    EXPECT_EQ(g.releases, 3);
    for (std::size_t b = 0; b < m.block_count(); ++b) EXPECT_EQ(m.consumers(b), 0) << b;
    EXPECT_TRUE(g.kept.empty());
    EXPECT_THROW((void)m.gradient_step(gradient_event::arrived, 2, 1, nullptr, {}, 64), invalid_argument);
  });
}

// test_a_layer_applied_twice_gets_both_applications_gradients: "shared"
// applied twice reaches its bucket once, as the sum (without the counting
// the second application's gradient overwrote the first's).
TEST_P(zero3_gradient_flow, a_parameter_applied_twice_reaches_the_bucket_once_as_the_sum) {
  const int ranks = GetParam();
  each_rank(ranks, [ranks](rank_env& env, block_manager& m, binding& g) {
    auto tracked = g.forward({0, 1, 1, 2});
    EXPECT_EQ(tracked.at(1).size(), 4U);
    g.backward({{2, {0}}}, 0);
    for (const std::size_t p : {0, 1}) g.arrive(1, p, 1);  // the second application first
    for (const std::size_t p : {0, 1}) g.arrive(1, p, 0);
    g.backward({{0, {0, 1}}}, 0);
    g.end_backward();
    env.backend.complete_all();
    for (const std::size_t p : {0, 1}) (void)g.check(1, p, [&](std::size_t e) { return mean(ranks, 1, p, e, {0, 1}); });
    (void)g.check(0, 0, [&](std::size_t e) { return mean(ranks, 0, 0, e, {0}); });
    EXPECT_EQ(m.stats().reduce_scatters, 4U);  // each block once, the persistent gradients once
  });
}

// The same when one application's output gets no gradient: its partial sum
// is delivered when backward ends.
TEST_P(zero3_gradient_flow, a_partial_sum_is_delivered_when_backward_ends) {
  const int ranks = GetParam();
  each_rank(ranks, [ranks](rank_env& env, block_manager& /*m*/, binding& g) {
    (void)g.forward({0, 1, 1, 2});
    g.backward({{2, {0}}}, 0);
    for (const std::size_t p : {0, 1}) g.arrive(1, p, 1);  // application 0 never reports
    g.backward({{0, {0, 1}}}, 0);
    EXPECT_EQ(g.kept.size(), 2U);
    g.end_backward();
    env.backend.complete_all();
    for (const std::size_t p : {0, 1}) (void)g.check(1, p, [&](std::size_t e) { return mean(ranks, 1, p, e, {1}); });
    EXPECT_TRUE(g.kept.empty());
  });
}

// test_gradients_accumulate_over_micro_batches_until_the_step: while
// `.grad` is set a backward adds to it; after set_to_none it starts over.
TEST_P(zero3_gradient_flow, gradients_accumulate_across_backwards_while_set) {
  const int ranks = GetParam();
  each_rank(ranks, [ranks](rank_env& env, block_manager& /*m*/, binding& g) {
    g.backward(g.forward(), 0);
    g.end_backward();
    g.backward(g.forward(), 1);
    g.end_backward();
    env.backend.complete_all();
    check_all(g, ranks, {0, 1});
    EXPECT_TRUE(g.kept.empty());
    for (auto& grad : g.grads) grad.reset();  // zero_grad(set_to_none=True)
    g.backward(g.forward(), 2);
    g.end_backward();
    env.backend.complete_all();
    check_all(g, ranks, {2});
  });
}

// With `.grad` kept, a block whose slice is held but which gets no
// gradient in the next backward ends with what it carried, once: held
// views start each backward at zero (the slice still holds the last sum).
TEST_P(zero3_gradient_flow, a_held_slice_without_gradient_adds_nothing_to_what_it_carried) {
  const int ranks = GetParam();
  each_rank(ranks, [ranks](rank_env& env, block_manager& /*m*/, binding& g) {
    g.backward(g.forward(), 0);
    g.end_backward();
    g.backward(g.forward({0, 2}), 1);  // "shared" unused this time
    g.end_backward();
    env.backend.complete_all();
    for (const std::size_t p : {0, 1}) (void)g.check(1, p, [&](std::size_t e) { return mean(ranks, 1, p, e, {0}); });
    (void)g.check(2, 0, [&](std::size_t e) { return mean(ranks, 2, 0, e, {0, 1}); });
  });
}

// test_a_whole_forward_recomputed_inside_backward_keeps_the_gradients_reduced_before_it:
// the recompute's forward inside the backward frees nothing, and each
// block's second reduce keeps the first reduce's sum (without the keeping
// the second reduce-scatter overwrote it).
TEST_P(zero3_gradient_flow, a_second_reduce_in_one_backward_keeps_the_first) {
  const int ranks = GetParam();
  each_rank(ranks, [ranks](rank_env& env, block_manager& m, binding& g) {
    g.backward(g.forward(), 0);  // the second micro-batch, first in backward
    const std::size_t before = m.stats().gradients.current;
    EXPECT_GT(before, 0U);
    const auto again = g.forward({}, true);  // the recompute
    EXPECT_EQ(m.stats().gradients.current, before);
    g.backward(again, 1);
    g.end_backward();
    env.backend.complete_all();
    check_all(g, ranks, {0, 1});
    EXPECT_TRUE(g.kept.empty());
  });
}

// test_a_second_reduce_at_the_end_of_backward_keeps_the_first: the
// recompute leaves persistent b1 without gradient, so "shared" is reduced
// again when backward ends: the first reduce's slice is kept, b1's bucket
// view (its replicated gradient, holding the first gradient) is neither
// zeroed nor overwritten, w1 gets both.
TEST_P(zero3_gradient_flow, a_second_reduce_at_the_end_of_backward_keeps_the_first) {
  const int ranks = GetParam();
  each_rank(ranks, [ranks](rank_env& env, block_manager& /*m*/, binding& g) {
    g.backward(g.forward(), 0);
    auto again = g.forward({}, true);
    again[1] = {0};  // b1 unused by the recomputed forward
    g.backward(again, 1);
    g.end_backward();
    env.backend.complete_all();
    (void)g.check(1, 0, [&](std::size_t e) { return mean(ranks, 1, 0, e, {0, 1}); });
    (void)g.check(1, 1, [&](std::size_t e) { return mean(ranks, 1, 1, e, {0}); });
    (void)g.check(0, 1, [&](std::size_t e) { return mean(ranks, 0, 1, e, {0, 1}); });
    EXPECT_TRUE(g.kept.empty());
  });
}

// test_a_backward_that_raised_after_some_reduces_leaves_no_gradient_held:
// the next forward settles the backward (its buckets reduced, its holds
// released, nothing carried kept), sets no gradient, and with no `.grad`
// set frees the slices the raised backward reduced; the next step is right.
TEST_P(zero3_gradient_flow, a_backward_that_raised_is_settled_at_the_next_forward) {
  const int ranks = GetParam();
  each_rank(ranks, [ranks](rank_env& env, block_manager& m, binding& g) {
    g.backward(g.forward(), 0);
    g.end_backward();
    const std::size_t slices = m.stats().gradient_shard_bytes;
    EXPECT_EQ(m.stats().gradients.current, slices);
    for (auto& grad : g.grads) grad.reset();
    const auto tracked = g.forward();
    EXPECT_EQ(m.stats().gradients.current, 0U);
    g.backward({{2, tracked.at(2)}}, 1);            // "last" reduced
    (void)g.event(gradient_event::unpacked, 1);     // "shared" held, then the backward raises
    g.arrive(1, 0, 1);                              // a bucket held
    EXPECT_GT(m.stats().gradients.current, 0U);
    EXPECT_LT(m.stats().gradients.current, slices);
    EXPECT_EQ(m.consumers(1), 1);
    g.end_queued = false;                           // torch drops the callback
    const auto next = g.forward();
    EXPECT_EQ(m.stats().gradients.current, 0U);
    for (std::size_t b = 0; b < m.block_count(); ++b) EXPECT_EQ(m.consumers(b), 0) << b;
    for (const auto& grad : g.grads) EXPECT_FALSE(grad.has_value());
    EXPECT_TRUE(g.kept.empty());
    g.backward(next, 2);
    g.end_backward();
    env.backend.complete_all();
    check_all(g, ranks, {2});
  });
}

// test_gradients_are_freed_before_forward_after_zero_grad and
// test_gradients_kept_by_zero_grad_without_set_to_none_stay_allocated: a
// forward frees the slices only when no shard's gradient is set; a forward
// inside a backward never; the step ends at the forward after a backward.
TEST_P(zero3_gradient_flow, slices_are_freed_before_a_forward_only_when_no_gradient_is_set) {
  each_rank(GetParam(), [](rank_env& /*env*/, block_manager& m, binding& g) {
    const std::size_t slices = m.stats().gradient_shard_bytes;
    g.backward(g.forward(), 0);
    g.end_backward();
    EXPECT_EQ(m.stats().steps, 0U);
    (void)g.forward();  // every .grad set (set_to_none=False): kept
    EXPECT_EQ(m.stats().steps, 1U);
    EXPECT_EQ(m.stats().gradients.current, slices);
    g.backward(g.forward(), 0);
    g.end_backward();
    g.grads[0].reset();  // one set still: kept
    (void)g.forward();
    EXPECT_EQ(m.stats().gradients.current, slices);
    g.backward(g.forward(), 0);
    g.end_backward();
    for (auto& grad : g.grads) grad.reset();
    (void)g.forward({}, true);  // no backward has begun: an ordinary forward
    EXPECT_EQ(m.stats().gradients.current, 0U);
    for (std::size_t k = 0; k < g.views.size(); ++k) {
      EXPECT_EQ(g.views[k].has_value(), g.shard_of[k].second != SIZE_MAX) << k;  // persistent views stay
    }
  });
}

// A block that gets no gradient in a backward (not applied, or applied and
// held but its outputs got none) while it holds no slice keeps no
// gradient, as torch leaves an unused parameter; persistent gradients are
// always held, zero here.
TEST_P(zero3_gradient_flow, a_block_without_gradient_keeps_none) {
  const int ranks = GetParam();
  each_rank(ranks, [ranks](rank_env& env, block_manager& m, binding& g) {
    const auto tracked = g.forward({1, 2});
    g.backward({{2, tracked.at(2)}}, 0);
    (void)g.event(gradient_event::unpacked, 1);  // held, no gradient arrives
    g.end_backward();
    env.backend.complete_all();
    EXPECT_FALSE(g.grads[g.shard(0, 0)].has_value());
    EXPECT_FALSE(g.grads[g.shard(1, 0)].has_value());
    (void)g.check(0, 1, [](std::size_t) { return 0.0F; });
    (void)g.check(1, 1, [](std::size_t) { return 0.0F; });
    (void)g.check(2, 0, [&](std::size_t e) { return mean(ranks, 2, 0, e, {0}); });
    EXPECT_EQ(m.consumers(1), 0);
  });
}

// A block is fetched for backward once however often its saved parameters
// are unpacked, and released at its reduce.
TEST_P(zero3_gradient_flow, backward_holds_a_block_once_until_its_reduce) {
  each_rank(GetParam(), [](rank_env& /*env*/, block_manager& m, binding& g) {
    (void)g.forward();
    for (int i = 0; i < 3; ++i) (void)g.event(gradient_event::unpacked, 2);
    EXPECT_EQ(g.fetches, 1);
    EXPECT_EQ(m.consumers(2), 1);
    g.arrive(2, 0, 0);
    EXPECT_EQ(g.releases, 1);
    EXPECT_EQ(m.consumers(2), 0);
    (void)g.event(gradient_event::unpacked, 2);  // read again after the reduce: held until backward ends
    EXPECT_EQ(m.consumers(2), 1);
    g.end_backward();
    EXPECT_EQ(m.consumers(2), 0);
    EXPECT_EQ(g.releases, 2);
  });
}

// One action per call: the same gradients (the batch is handed out in
// pieces, in order).
TEST_P(zero3_gradient_flow, one_action_per_call_gives_the_same_gradients) {
  const int ranks = GetParam();
  each_rank(ranks, [ranks](rank_env& env, block_manager& /*m*/, binding& g) {
    g.capacity = 1;
    auto tracked = g.forward({0, 1, 1, 2});
    g.backward(tracked, 0);
    g.end_backward();
    g.backward(g.forward(), 1);
    auto again = g.forward({}, true);
    g.backward(again, 2);
    g.end_backward();
    env.backend.complete_all();
    (void)g.check(1, 0, [&](std::size_t e) { return 2.0F * mean(ranks, 1, 0, e, {0}) + mean(ranks, 1, 0, e, {1, 2}); });
    (void)g.check(2, 0, [&](std::size_t e) { return mean(ranks, 2, 0, e, {0, 1, 2}); });
    EXPECT_TRUE(g.kept.empty());
  });
}

TEST(zero3_gradient_flow_errors, bad_events_are_refused) {
  run_ranks(1, 10s, [](rank_env& env) {
    block_manager m(model(), model_options(), *env.comm, *env.persistent, *env.transient);
    EXPECT_EQ(m.gradient_shards(), 5U);  // w0 (T of "first"), b0, w1 (T of "shared"), b1, w2 (T of "last")
    const std::vector<unsigned char> two(2, 0);
    EXPECT_THROW((void)m.gradient_step(gradient_event::applied, 3, 0, nullptr, {}, 8), invalid_argument);
    EXPECT_THROW((void)m.gradient_step(gradient_event::arrived, 2, 1, nullptr, {}, 8), invalid_argument);  // frozen
    EXPECT_THROW((void)m.gradient_step(gradient_event::forward, 0, 0, nullptr, two, 8), invalid_argument);
    EXPECT_THROW((void)m.gradient_step(gradient_event::applied, 0, 0, nullptr, {}, 0), invalid_argument);
    // A backward that begins without the shards' gradients reported.
    (void)m.gradient_step(gradient_event::applied, 2, 0, nullptr, {}, 8);
    const gradient_batch b = m.gradient_step(gradient_event::arrived, 2, 0, nullptr, {}, 8);
    ASSERT_TRUE(b.more);
    EXPECT_THROW((void)m.gradient_step(gradient_event::resume, 0, 0, nullptr, {}, 8), invalid_argument);
  });
}

// Through the C API: one block applied, its gradient arrives (the first of
// a backward asks for the shards' gradients), the copy into the bucket and
// the reduce; bad calls are statuses with a message.
TEST(zero3_gradient_flow_capi, a_gradient_through_the_c_api) {
  fragctl_allocator* pool = nullptr;
  ASSERT_EQ(fragctl_create("arena", "sim_backed:true,sim_capacity:256MiB,arena_size:64MiB", "sim", 0, &pool),
            FRAGCTL_OK)
      << fragctl_last_error();
  fragctl_zero3* z = nullptr;
  ASSERT_EQ(fragctl_zero3_create(pool, pool, "stage3_param_persistence_threshold:64,gradient_type:fp32", "local", &z),
            FRAGCTL_OK)
      << fragctl_last_error();
  const fragctl_zero3_param layer[] = {{"w", 1000, 4, 1}, {"frozen", 100, 4, 0}};
  ASSERT_EQ(fragctl_zero3_add_block(z, "layer", layer, 2), FRAGCTL_OK);
  ASSERT_EQ(fragctl_zero3_start(z), FRAGCTL_OK);
  fragctl_zero3_gradient_action actions[8] = {};
  std::size_t count = 0;
  int more = 0;
  const unsigned char none_set[1] = {0};
  const auto call = [&](int event, std::size_t param, const unsigned char* set, std::size_t shards) {
    return fragctl_zero3_gradient_event(z, event, 0, param, nullptr, set, shards, actions, 8, &count, &more);
  };
  ASSERT_EQ(call(FRAGCTL_ZERO3_FORWARD, 0, none_set, 1), FRAGCTL_OK) << fragctl_last_error();
  EXPECT_EQ(count, 0U);
  ASSERT_EQ(call(FRAGCTL_ZERO3_APPLIED, 0, nullptr, 0), FRAGCTL_OK);
  ASSERT_EQ(count, 1U);
  EXPECT_EQ(actions[0].what, FRAGCTL_ZERO3_DO_TRACK);
  EXPECT_EQ(actions[0].param, 0U);
  ASSERT_EQ(call(FRAGCTL_ZERO3_ARRIVED, 0, nullptr, 0), FRAGCTL_OK);
  ASSERT_EQ(count, 2U);
  EXPECT_EQ(actions[0].what, FRAGCTL_ZERO3_DO_QUEUE_END);
  EXPECT_EQ(actions[1].what, FRAGCTL_ZERO3_DO_REPORT);
  EXPECT_EQ(more, 1);
  ASSERT_EQ(call(FRAGCTL_ZERO3_RESUME, 0, none_set, 1), FRAGCTL_OK);
  ASSERT_EQ(count, 1U);
  EXPECT_EQ(actions[0].what, FRAGCTL_ZERO3_DO_BUCKET_COPY);
  ASSERT_NE(actions[0].pointer, nullptr);
  std::fill_n(static_cast<float*>(actions[0].pointer), 1000, 2.0F);
  EXPECT_EQ(more, 1);
  ASSERT_EQ(call(FRAGCTL_ZERO3_RESUME, 0, nullptr, 0), FRAGCTL_OK);  // the reduce
  EXPECT_EQ(count, 0U);
  EXPECT_EQ(more, 0);
  ASSERT_EQ(call(FRAGCTL_ZERO3_BACKWARD_ENDED, 0, nullptr, 0), FRAGCTL_OK);
  ASSERT_EQ(count, 2U);
  EXPECT_EQ(actions[0].what, FRAGCTL_ZERO3_DO_BIND);
  EXPECT_EQ(actions[1].what, FRAGCTL_ZERO3_DO_SET_GRAD);
  void* data = nullptr;
  void* gradient = nullptr;
  std::size_t elements = 0;
  ASSERT_EQ(fragctl_zero3_trainable_shard(z, 0, &data, &gradient, &elements), FRAGCTL_OK);
  EXPECT_EQ(actions[0].pointer, gradient);
  EXPECT_EQ(actions[0].elements, elements);
  EXPECT_EQ(static_cast<const float*>(gradient)[999], 2.0F);  // one rank: the reduce is a copy

  EXPECT_EQ(call(99, 0, nullptr, 0), FRAGCTL_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fragctl_last_error()).find("unknown gradient event 99"), std::string::npos);
  EXPECT_EQ(call(FRAGCTL_ZERO3_FORWARD, 0, nullptr, 0), FRAGCTL_ERROR_INVALID_ARGUMENT);  // 1 shard
  EXPECT_NE(std::string(fragctl_last_error()).find("gradients_set has 0 entries"), std::string::npos);
  EXPECT_EQ(call(FRAGCTL_ZERO3_ARRIVED, 1, nullptr, 0), FRAGCTL_ERROR_INVALID_ARGUMENT);  // frozen
  EXPECT_EQ(fragctl_zero3_gradient_event(z, FRAGCTL_ZERO3_RESUME, 0, 0, nullptr, nullptr, 0, nullptr, 8, &count,
                                         &more),
            FRAGCTL_ERROR_INVALID_ARGUMENT);
  fragctl_zero3_destroy(z);
  EXPECT_EQ(fragctl_destroy(pool), FRAGCTL_OK) << fragctl_last_error();
}

INSTANTIATE_TEST_SUITE_P(ranks, zero3_gradient_flow, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& i) { return std::to_string(i.param); });

}  // namespace
}  // namespace fragctl::zero3
