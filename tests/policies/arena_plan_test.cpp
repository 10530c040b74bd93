// The arena's steady-state plan (step_plan.hpp) on the sim backend: a job
// that repeats itself is served without driver calls once its step is
// found, the peak memory is no higher than without the plan, a job that
// leaves its plan goes back to best fit, failed driver calls (at the plan's
// start too) leave the arena consistent, the memory map shows the plan's
// free memory, and the plan's figures reach the statistics and the report.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"

#include "allocator_policies/arena/arena_policy.hpp"
#include "allocator_policies/arena/step_plan.hpp"
#include "fragctl/replay.hpp"
#include "fragctl/run_report.hpp"
#include "fragctl/sim_backend.hpp"
#include "fragctl/stats.hpp"
#include "fragctl/trace.hpp"
#include "support/arena_world.hpp"
#include "support/log_capture.hpp"
#include "support/test_support.hpp"
#include "support/trace_support.hpp"

namespace fragctl {
namespace {

sim_options options() {
  sim_options o;
  o.capacity = 8 * GiB;
  o.granularity = 2 * MiB;
  return o;
}

// The span size the model job below is measured at. Its blocks (parameters
// of 3-5 MiB, layer tensors of tens to hundreds of MiB, on 2 MiB granules)
// leave best fit, at spans of 32 MiB, 1.5% above the live bytes and
// re-stitching in most steps, and the plan's claims ("no driver call at no
// higher peak", the steps it plans) are made against that. At the default
// 16 MiB spans best fit holds 1.003 of this job's live bytes, less than
// the plan's greedy layout packs (0.9% above the step's live peak on the
// varying steps, 2.3% on the 1,024-token ones): there the plan holds 1.013
// against 1.003 (and 1.048 against 1.025 where a step's logits outgrow
// their slot), and where the high-water rule refuses such a layout it
// plans fewer steps (1 of 4 when two lengths alternate, 6 of 8 with
// evaluations between steps). One cause, the layout's packing on this
// job (0.1-0.3% on the live traces); the trade at the default is stated by
// at_the_default_span_size_the_plan_trades_its_packing_for_the_calls.
constexpr std::size_t model_span = 32 * MiB;

config with_plan(bool on, std::size_t span = model_span) {
  config cfg;
  cfg.step_plan = on;
  cfg.map_chunk = span;
  return cfg;
}

// A model of a checkpointed transformer's training step at `tokens` tokens:
// long-lived parameters (made by the caller), per layer a kept input and
// transient tensors whose sizes follow the tokens; backward recomputes and
// frees the kept inputs in reverse; gradients live until the step's end,
// as set_to_none leaves them.
struct job {
  arena_policy& a;
  std::vector<std::size_t> params;
  std::size_t peak_live = 0, live = 0;
  // With batch_scale, each step first makes its input batch (tokens *
  // batch_scale bytes) and frees the previous step's: what outlives a step
  // differs in size from step to step, as a data loader's batch does.
  std::size_t batch_scale = 0;
  void* batch = nullptr;
  std::size_t batch_bytes = 0;

  // The live blocks by address: a block served over another live one is
  // counted (the arena's first duty is never to hand out memory twice).
  std::map<std::uintptr_t, std::size_t> blocks{};
  std::size_t overlaps = 0;
  // Frees check_free judged otherwise than the free (planned blocks too).
  std::size_t misjudged = 0;

  void* alloc(std::size_t bytes) {
    live += a.allocation_size(bytes);
    peak_live = std::max(peak_live, live);
    void* p = a.allocate(bytes, 0);
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    const auto above = blocks.lower_bound(at);
    if (above != blocks.end() && above->first < at + bytes) ++overlaps;
    if (above != blocks.begin() && std::prev(above)->first + std::prev(above)->second > at) ++overlaps;
    blocks[at] = bytes;
    return p;
  }
  void free(void* p, std::size_t bytes) {
    live -= a.allocation_size(bytes);
    blocks.erase(reinterpret_cast<std::uintptr_t>(p));
    const std::optional<free_result> judged = a.check_free(p, bytes);
    const std::optional<free_result> interior = a.check_free(static_cast<char*>(p) + 1, bytes);
    const free_result result = a.try_deallocate(p, bytes, 0);
    const bool as_judged = judged && judged->status == result.status && judged->bytes == result.bytes;
    if (!as_judged || result.status != free_status::ok || !interior || interior->status != free_status::not_owned) {
      ++misjudged;
    }
    const std::optional<free_result> after = a.check_free(p, bytes);
    if (!after || after->status != free_status::not_owned) ++misjudged;
  }

  // The model's eight parameters (`bytes(layer)` each), allocated first and
  // freed by free_parameters() at the end.
  std::vector<void*> weights{};
  void make_parameters(std::size_t (*bytes)(std::size_t layer)) {
    for (std::size_t l = 0; l < 8; ++l) {
      params.push_back(bytes(l));
      weights.push_back(alloc(params.back()));
    }
  }
  void free_parameters() {
    for (std::size_t l = 0; l < weights.size(); ++l) free(weights[l], params[l]);
    weights.clear();
  }

  // With other_shape, attention's backward makes one tensor fewer per layer
  // (a short sequence's kernels): the step departs from the long steps'
  // shape midway.
  // With batch_tokens, the batch is made for that many tokens instead; with
  // first_act_scale, the first layer's input is that many times its size.
  void step(std::size_t tokens, std::size_t logits_scale = 1, bool other_shape = false, std::size_t batch_tokens = 0,
            std::size_t first_act_scale = 1) {
    constexpr int layers = 8;
    const std::size_t act = tokens * 8 * KiB;          // a layer's input
    const std::size_t scores = tokens * tokens * 96;   // attention scores
    const std::size_t mlp = tokens * 22 * KiB;         // the MLP's inner width
    if (batch_scale != 0) {
      const std::size_t bytes = (batch_tokens != 0 ? batch_tokens : tokens) * batch_scale;
      void* next = alloc(bytes);
      if (batch != nullptr) free(batch, batch_bytes);
      batch = next;
      batch_bytes = bytes;
    }
    std::vector<void*> kept;
    std::vector<std::size_t> kept_bytes;
    void* x = alloc(act * first_act_scale);
    std::size_t x_bytes = act * first_act_scale;
    for (int l = 0; l < layers; ++l) {
      void* s = alloc(scores);
      void* p = alloc(scores * 2);  // fp32 softmax
      free(s, scores);
      void* o = alloc(act);
      free(p, scores * 2);
      void* m = alloc(mlp);
      void* m2 = alloc(mlp);
      free(o, act);
      void* y = alloc(act);
      free(m, mlp);
      free(m2, mlp);
      kept.push_back(x);
      kept_bytes.push_back(x_bytes);
      x = y;
      x_bytes = act;
    }
    const std::size_t logits_bytes = tokens * 256 * KiB / 8 * logits_scale;
    void* logits = alloc(logits_bytes);
    free(x, x_bytes);
    void* dx = alloc(act);
    free(logits, logits_bytes);
    std::vector<void*> grads;
    for (int l = layers - 1; l >= 0; --l) {
      void* s = alloc(scores);
      void* p = alloc(scores * 2);
      void* m = alloc(mlp);
      free(s, scores);
      void* g = alloc(params[static_cast<std::size_t>(l)]);
      grads.push_back(g);
      void* dp = other_shape ? nullptr : alloc(scores * 2);
      free(p, scores * 2);
      void* ndx = alloc(act);
      if (dp != nullptr) free(dp, scores * 2);
      free(m, mlp);
      free(dx, act);
      free(kept[static_cast<std::size_t>(l)], kept_bytes[static_cast<std::size_t>(l)]);
      dx = ndx;
    }
    free(dx, act);
    // The optimizer: one temporary per parameter, then the gradients go.
    std::vector<void*> temps;
    for (int l = 0; l < layers; ++l) temps.push_back(alloc(params[static_cast<std::size_t>(l)]));
    for (int l = 0; l < layers; ++l) free(temps[static_cast<std::size_t>(l)], params[static_cast<std::size_t>(l)]);
    for (int l = 0; l < layers; ++l) {
      free(grads[static_cast<std::size_t>(layers - 1 - l)], params[static_cast<std::size_t>(l)]);
    }
  }
};

// Parameter sizes: 3-5 MiB, each layer's its own; 3 MiB and a little more
// per layer; 3 MiB each.
std::size_t varied_parameter(std::size_t l) { return (3 + l % 3) * MiB + 4096 * l; }
std::size_t growing_parameter(std::size_t l) { return 3 * MiB + 4096 * l; }
std::size_t flat_parameter(std::size_t /*l*/) { return 3 * MiB; }

struct outcome {
  std::vector<std::uint64_t> calls;  // driver memory calls per step
  double ratio = 0;                  // peak held / peak live
  pool_state state;
  std::size_t map_live = 0;          // live bytes the memory map shows after the last step
  std::size_t map_free = 0;          // free bytes it shows
};

// Runs the job for each entry of `tokens` (one step each); returns the
// driver memory calls of each step and the peak memory held over the peak
// live bytes.
outcome run(const std::vector<std::size_t>& tokens, bool plan, const std::vector<std::size_t>& logits_scale = {},
            std::size_t batch_scale = 0, const std::vector<bool>& other_shape = {}, std::size_t span = model_span) {
  sim_backend sim(options());
  arena_policy a(with_plan(plan, span), sim);
  job j{a, {}};
  j.batch_scale = batch_scale;
  j.make_parameters(varied_parameter);
  outcome out;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::uint64_t before = sim.counters().memory_calls();
    j.step(tokens[i], i < logits_scale.size() ? logits_scale[i] : 1, i < other_shape.size() && other_shape[i]);
    out.calls.push_back(sim.counters().memory_calls() - before);
  }
  EXPECT_EQ(j.overlaps, 0u) << "a block was served over a live one";
  EXPECT_EQ(j.misjudged, 0u) << "check_free answered otherwise than the free found";
  out.ratio = static_cast<double>(sim.counters().peak_held_bytes) / static_cast<double>(j.peak_live);
  out.state = a.state();
  for (const memory_segment& seg : a.memory_map().segments) {
    for (const memory_block& b : seg.blocks) (b.use == block_use::live ? out.map_live : out.map_free) += b.size;
  }
  if (j.batch != nullptr) j.free(j.batch, j.batch_bytes);
  j.free_parameters();
  return out;
}

std::uint64_t sum(const std::vector<std::uint64_t>& v, std::size_t from) {
  std::uint64_t n = 0;
  for (std::size_t i = from; i < v.size(); ++i) n += v[i];
  return n;
}

TEST(arena_plan, repeating_job_makes_no_driver_calls_once_planned) {
  const std::vector<std::size_t> tokens(16, 2048);
  const outcome with = run(tokens, true);
  const outcome without = run(tokens, false);
  // Without the plan, best fit re-stitches pages in every step (the
  // positive control: the job is one the plan has to change).
  EXPECT_GT(sum(without.calls, 6), 0u) << "the job does not exercise stitching";
  // With it, the step is found within its first repeats and the later
  // steps make no driver call at all.
  for (std::size_t i = 6; i < tokens.size(); ++i) EXPECT_EQ(with.calls[i], 0u) << "step " << i;
  EXPECT_GE(with.state.plan.steps_detected, 1u);
  EXPECT_GE(with.state.plan.planned_steps, 5u);
  EXPECT_EQ(with.state.plan.last_step_driver_calls, 0u);
  EXPECT_GT(with.state.plan.planned_bytes, 0u);
  // No more memory than without the plan.
  EXPECT_LE(with.ratio, without.ratio + 1e-9);
}

TEST(arena_plan, memory_map_shows_the_plan_free_between_steps) {
  // Between two planned steps no planned block is live: the plan's ranges
  // are free memory in the map, not one live block.
  const outcome with = run(std::vector<std::size_t>(10, 2048), true);
  ASSERT_GE(with.state.plan.planned_steps, 1u);
  ASSERT_GT(with.state.plan.region_bytes, 0u);
  EXPECT_EQ(with.map_live, with.state.allocated);
  EXPECT_GE(with.map_free, with.state.plan.region_bytes);
}

// Sequence lengths drawn per step, every step of one shape: the varying
// job of the two cases below.
const std::vector<std::size_t> varying_tokens = {1024, 1536, 768,  2048, 1280, 1792, 896,  1664,
                                                 1152, 1920, 1408, 640,  1856, 1216, 1984, 1088};

TEST(arena_plan, varying_job_is_served_from_the_layout_of_its_largest_step) {
  // Sequence lengths drawn per step: no two steps ask for the same sizes,
  // but every step has the same shape. Best fit re-stitches in most steps
  // (the positive control); the plan, laid out at the largest size seen at
  // each point of the step, serves every later step with no driver call,
  // at no higher peak.
  const std::vector<std::size_t>& tokens = varying_tokens;
  const outcome with = run(tokens, true);
  const outcome without = run(tokens, false);
  EXPECT_GT(sum(without.calls, 6), 0u) << "the job does not exercise stitching";
  for (std::size_t i = 5; i < tokens.size(); ++i) EXPECT_EQ(with.calls[i], 0u) << "step " << i;
  EXPECT_LE(with.ratio, without.ratio + 1e-9);
  EXPECT_GE(with.state.plan.planned_steps, 10u);
  EXPECT_EQ(with.map_live, with.state.allocated);
}

TEST(arena_plan, at_the_default_span_size_the_plan_trades_its_packing_for_the_calls) {
  // The varying job above at the default spans (16 MiB): best fit holds
  // less than at 32 MiB (1.003 of the live bytes against 1.015) and still
  // re-stitches in most steps (the control); the plan serves every later
  // step with no driver call, holds no more than at 32 MiB (1.013), and
  // above best fit what its layout packs above the step's live peak and
  // the parameters' spans (1.0 point on this job; the bound leaves a
  // quarter of a point).
  const std::vector<std::size_t>& tokens = varying_tokens;
  const std::size_t span = config{}.map_chunk;
  ASSERT_LT(span, model_span) << "the default is the span size this case is about";
  const outcome with = run(tokens, true, {}, 0, {}, span);
  const outcome without = run(tokens, false, {}, 0, {}, span);
  const outcome at_model_span = run(tokens, true);
  const outcome best_fit_at_model_span = run(tokens, false);
  EXPECT_GT(sum(without.calls, 6), 0u) << "the job does not exercise stitching";
  EXPECT_LT(without.ratio, best_fit_at_model_span.ratio) << "the default's premise: smaller spans, less held";
  for (std::size_t i = 5; i < tokens.size(); ++i) EXPECT_EQ(with.calls[i], 0u) << "step " << i;
  EXPECT_GE(with.state.plan.planned_steps, 10u);
  EXPECT_LE(with.ratio, at_model_span.ratio + 1e-9);
  EXPECT_LE(with.ratio, without.ratio + 0.0125);
  EXPECT_EQ(with.map_live, with.state.allocated);
}

TEST(arena_plan, a_larger_step_is_laid_out_again_at_its_start) {
  // Planned on steps of up to 1,536 tokens, then a step of 2,048: its
  // first allocation is larger than any seen, so the plan is laid out
  // again for it (each size following the first one's, linearly or as the
  // square for the scores) instead of leaving it to best fit, and the
  // steps after it make no driver call.
  const std::vector<std::size_t> tokens = {1024, 1536, 768, 1280, 1024, 1536, 1152, 896,
                                           2048, 1280, 2048, 1024, 1792, 640};
  const outcome with = run(tokens, true);
  const outcome without = run(tokens, false);
  EXPECT_GT(without.calls[8], 0u) << "the larger step does not exercise stitching";
  EXPECT_LT(with.calls[8] * 4, without.calls[8]);
  for (std::size_t i = 9; i < tokens.size(); ++i) EXPECT_EQ(with.calls[i], 0u) << "step " << i;
  EXPECT_LE(with.ratio, without.ratio + 1e-9);
  EXPECT_EQ(with.state.plan.dropped, 0u) << "the plan was left";
}

// Steps whose first allocation does not follow the rest of the step (the
// live KV-cache generation job: a request's prompt embedding is batch x
// prompt, its cache batch x (prompt + new tokens), its logits batch x
// prompt x vocabulary): here the first layer's input is made `scale` times
// its size. Returns the peak held over the peak live bytes, and the plan's
// planned steps after each step.
struct two_dimensional {
  double ratio = 0;
  std::vector<std::uint64_t> planned;  // planned steps so far, after each step
};
two_dimensional run_two_dimensional(bool plan, const std::vector<std::pair<std::size_t, std::size_t>>& steps) {
  sim_backend sim(options());
  arena_policy a(with_plan(plan), sim);
  job j{a, {}};
  j.make_parameters(varied_parameter);
  two_dimensional out;
  for (const auto& [tokens, scale] : steps) {
    j.step(tokens, 1, false, 0, scale);
    out.planned.push_back(a.state().plan.planned_steps);
  }
  EXPECT_EQ(j.overlaps, 0u) << "a block was served over a live one";
  EXPECT_EQ(j.misjudged, 0u) << "check_free answered otherwise than the free found";
  out.ratio = static_cast<double>(sim.counters().peak_held_bytes) / static_cast<double>(j.peak_live);
  j.free_parameters();
  return out;
}

// A job whose step `guess` the plan would lay out on a guess: held as best
// fit holds it, and planned again after that step.
void expect_the_guess_raised_no_memory(const two_dimensional& with, const two_dimensional& without,
                                       std::size_t guess) {
  EXPECT_LE(with.ratio, without.ratio + 0.02) << "best fit holds " << without.ratio;
  EXPECT_LT(with.ratio, 1.1);
  EXPECT_GE(with.planned.back(), with.planned[guess] + 2) << "no step after the guess is planned";
}

TEST(arena_plan, a_larger_first_allocation_that_does_not_predict_its_step_raises_no_memory) {
  // Steps of one shape whose first allocation (the first layer's input,
  // tokens x 8 KiB x scale) varies on its own: the two largest, 16 MiB at
  // 2,048 tokens and 12 MiB at 384 tokens x 4, fit every other size as
  // the cube of the first (the clamp), which the third largest, 10 MiB at
  // 1,280 tokens, contradicts. Then a step whose first allocation is 20
  // MiB (1,280 tokens x 2): laid out again by that fit, the plan would map
  // about twice the 2,048-token step's live bytes for a step smaller than
  // it (the live generation job held 1.416 of its live bytes so, from a
  // request at step 42 of 64). A fit its own history contradicts raises
  // no memory above the high-water mark: the step goes to best fit, the
  // job holds what best fit holds, and the plan, learnt anew with that
  // step in its history, serves the steps after it.
  std::vector<std::pair<std::size_t, std::size_t>> steps;
  for (int r = 0; r < 3; ++r) {
    for (const auto& s : {std::pair<std::size_t, std::size_t>{2048, 1}, {384, 4}, {1280, 1}, {1024, 1}, {768, 1}}) {
      steps.push_back(s);
    }
  }
  const std::size_t guess = steps.size();
  steps.emplace_back(1280, 2);
  for (int r = 0; r < 4; ++r) steps.emplace_back(1024, 1), steps.emplace_back(2048, 1);
  const two_dimensional with = run_two_dimensional(true, steps);
  const two_dimensional without = run_two_dimensional(false, steps);
  ASSERT_GE(with.planned[guess - 1], 5u) << "control: the plan serves the steps of every size";
  expect_the_guess_raised_no_memory(with, without, guess);
}

TEST(arena_plan, a_first_allocation_far_beyond_the_repeats_raises_no_memory) {
  // Two sizes of step only (1,536 and 2,048 tokens, first allocations 12
  // and 16 MiB: no third repeat to check the fit on), then a step of 1,024
  // tokens whose first allocation is 24 MiB, 1.5 times the largest, more
  // than the two repeats lie apart (1.33): the powers of that pair (the
  // inputs linear, the scores squared) would lay it out at about twice the
  // 2,048-token step's live bytes. A guess that far out raises no memory
  // above the high-water mark, and the plan, learnt anew, serves steps
  // after it again once it pays (left waiting on the guess, it served none);
  // the generation job's request at step 42 was 2.4 times its largest
  // repeat, the two 2 apart.
  std::vector<std::pair<std::size_t, std::size_t>> steps;
  for (int r = 0; r < 6; ++r) steps.emplace_back(r % 2 == 0 ? 1536 : 2048, 1);
  const std::size_t guess = steps.size();
  steps.emplace_back(1024, 3);
  for (int r = 0; r < 6; ++r) steps.emplace_back(1536, 1), steps.emplace_back(2048, 1);
  const two_dimensional with = run_two_dimensional(true, steps);
  const two_dimensional without = run_two_dimensional(false, steps);
  ASSERT_GE(with.planned[guess - 1], 2u) << "control: the plan serves steps of both lengths";
  expect_the_guess_raised_no_memory(with, without, guess);
}

TEST(arena_plan, a_step_the_plan_cannot_be_resized_for_is_never_served_beyond_its_layout) {
  // Planned steps of 1,024 and 2,048 tokens whose input batch (the step's
  // first allocation, which outlives it: not planned) follows the tokens.
  // Then a step whose batch is a hundred times the largest, as an
  // evaluation's first batch can be: resized for it, the scores' slots
  // (the square of the length) would pass 2^32 units, so the plan cannot
  // be laid out again. The layer inputs' slots came first and were grown
  // in place before that failure, and the step, its first layer's input
  // twice its slot, went on on the old layout: that input was served over
  // the next layer's (a 188 MB block over a 23 MB parameter on the live
  // declm trace with evaluations; every run's loss NaN from there). Now
  // the plan is left at that input, every block is served where no other
  // lives, and the steps after are planned again.
  sim_backend sim(options());
  arena_policy a(with_plan(true), sim);
  job j{a, {}};
  j.batch_scale = 64;
  j.make_parameters(growing_parameter);
  for (int i = 0; i < 12; ++i) j.step(i % 2 == 0 ? 1024 : 2048);
  ASSERT_GE(a.state().plan.planned_steps, 4u) << "control: the plan serves whole steps of both lengths";
  ASSERT_EQ(j.overlaps, 0u);
  j.step(2048, 1, false, /*batch_tokens=*/204800, /*first_act_scale=*/2);
  EXPECT_EQ(j.overlaps, 0u) << "a block was served over a live one";
  for (int i = 0; i < 6; ++i) j.step(i % 2 == 0 ? 1024 : 2048);
  EXPECT_EQ(j.overlaps, 0u);
  if (j.batch != nullptr) j.free(j.batch, j.batch_bytes);
  j.free_parameters();
  EXPECT_EQ(a.state().allocated, 0u);
}

// Planned training steps with an evaluation after every third: its batch,
// then a block of `eval_bytes` while the live bytes are still at the
// steps' floor (the live declm job's eval logits), both freed before the
// next step. Returns the driver calls of each training step and the peak
// held over the peak live bytes.
outcome run_with_evaluations(bool plan, std::size_t eval_bytes) {
  sim_backend sim(options());
  arena_policy a(with_plan(plan), sim);
  job j{a, {}};
  j.batch_scale = 64;
  j.make_parameters(growing_parameter);
  outcome out;
  for (int i = 0; i < 18; ++i) {
    const std::uint64_t before = sim.counters().memory_calls();
    j.step(2048);
    out.calls.push_back(sim.counters().memory_calls() - before);
    if (i >= 6 && i % 3 == 0) {
      void* batch = j.alloc(2048 * 64);
      void* logits = j.alloc(eval_bytes);
      j.free(logits, eval_bytes);
      j.free(batch, 2048 * 64);
    }
  }
  EXPECT_EQ(j.overlaps, 0u) << "a block was served over a live one";
  out.ratio = static_cast<double>(sim.counters().peak_held_bytes) / static_cast<double>(j.peak_live);
  out.state = a.state();
  if (j.batch != nullptr) j.free(j.batch, j.batch_bytes);
  j.free_parameters();
  return out;
}

TEST(arena_plan, an_evaluation_between_steps_is_served_in_the_idle_plan) {
  // The evaluation's large block comes at the steps' floor, where the plan
  // (left for the evaluation's other shape, waiting) sends blocks to best
  // fit; best fit had only the memory outside the plan's idle ranges and
  // mapped the block anew: the live declm job with evaluations held 1.015
  // of its live bytes (1.006 without them). Without the plan best fit
  // re-stitches the step's freed pages for it (the control: the job holds
  // no more there). Now a gap of the idle ranges serves it.
  const std::size_t eval_bytes = 300 * MiB;
  const outcome with = run_with_evaluations(true, eval_bytes);
  const outcome without = run_with_evaluations(false, eval_bytes);
  ASSERT_GE(with.state.plan.planned_steps, 8u) << "control: the plan serves the training steps";
  ASSERT_GE(with.state.plan.dropped, 1u) << "control: the evaluations depart from the plan";
  EXPECT_LE(with.ratio, without.ratio + 1e-9);
  for (std::size_t i = 8; i < with.calls.size(); ++i) EXPECT_EQ(with.calls[i], 0u) << "step " << i;
}

TEST(arena_plan, long_steps_after_short_ones_are_planned_as_soon_as_it_pays) {
  // A job shaped like a decoder LM at sequence lengths drawn per step:
  // long steps, short ones that best fit serves from mapped memory with no
  // driver call, then long ones again, which best fit re-stitches. Its input
  // batch outlives each step at the step's size, so the live bytes between
  // two steps differ by a little. The plan is found in the first steps,
  // waits while it would not pay (the short steps), and starts at the
  // first step start after best fit paid more calls in a step than the
  // plan's start costs: the long steps after that make no driver call, at
  // no higher peak.
  const std::vector<std::size_t> tokens = {2048, 1536, 384, 256, 384, 256,  1920,
                                           2048, 2048, 1792, 2048, 1920, 1024, 2048};
  const outcome with = run(tokens, true, {}, 64);
  const outcome without = run(tokens, false, {}, 64);
  EXPECT_GT(sum(without.calls, 7), 0u) << "the long steps do not exercise stitching";
  for (std::size_t i = 8; i < tokens.size(); ++i) EXPECT_EQ(with.calls[i], 0u) << "step " << i;
  EXPECT_LE(with.ratio, without.ratio + 1e-9);
  EXPECT_GE(with.state.plan.planned_steps, 5u);
}

// The arena on sim, as `fragctl replay TRACE --policy arena --capacity
// 141GiB` runs it, with the step plan on or off.
replay_result replay_arena(const trace& t, bool plan) {
  replay_options o;
  o.policy = "arena";
  o.cfg.backend = backend_kind::sim;
  o.cfg.sim_capacity = 141 * GiB;
  o.cfg.step_plan = plan;
  return replay(t, o);
}

// A mixture of experts at one shape, traced live (tools/gpu/runs/2026-11-28/
// k48.sh: 16 steps on an H200; its routing still varies the experts' sizes
// per step): best fit re-stitches 208-368 driver calls a step on the replay,
// each step fewer than mapping the plan's 16 GB range costs (about 970 at
// 16 MiB a call), so judged on one step the plan never starts (before: 12
// starts refused, none planned). Judged on the steps in a row at the job's
// shape, it starts once best fit's calls there add up to the range's, and
// every step after makes no driver call, here at no more memory than best
// fit (its peak was set before).
TEST(arena_plan, a_job_at_one_shape_starts_its_plan_once_best_fit_paid_for_it) {
  const trace t = testing::test_data_trace("moe-one-shape.trace.csv.gz");
  const replay_result with = replay_arena(t, true);
  const replay_result without = replay_arena(t, false);
  const step_plan_state& p = with.stats.pool.plan;
  // The control: the step's calls alone do not pay for the range.
  EXPECT_GE(p.starts_refused_calls, 2u) << "one step of best fit pays for the plan: not the case at hand";
  EXPECT_GE(p.planned_steps, 5u);
  EXPECT_EQ(p.planned_step_driver_calls, 0u);
  EXPECT_EQ(p.last_step_driver_calls, 0u);
  EXPECT_EQ(with.ooms, 0u);
  EXPECT_LE(with.peak_reserved, without.peak_reserved);
  // Best fit alone keeps re-stitching: more calls over the same steps.
  EXPECT_GT(without.backend_memory_calls, with.backend_memory_calls + 1000);
}

// The moe trace with its steps growing as decoding's do: from the 8,630th
// allocation on (the job's fourth step start, the plan's first judged one),
// every size but the step's first allocation's (its input, 54,272 bytes)
// 0.4% larger at each step of 2,096 allocations. Each step has the count and first
// allocation of the one before and outgrows the plan's slots: a plan
// started on them is left at its first step (judged on the steps' count
// and first allocation alone, it started and was left 5 times in 16 steps,
// 13,591 calls against best fit's 8,283). Such steps are no run: the plan
// is judged on one step, as before, and never starts.
TEST(arena_plan, steps_that_outgrow_the_layout_at_one_first_allocation_are_no_run) {
  trace t = testing::test_data_trace("moe-one-shape.trace.csv.gz");
  absl::flat_hash_map<std::uint64_t, std::size_t> size_at;
  std::size_t n = 0;
  for (trace_event& e : t.events) {
    if (e.kind == trace_event::action::alloc) {
      ++n;
      if (n >= 8'630 && e.size != 54'272) {
        const std::size_t steps = (n - 8'630) / 2'096 + 1;
        e.size += e.size / 1000 * 4 * steps;
      }
      size_at[e.addr] = e.size;
    } else if (const auto it = size_at.find(e.addr); it != size_at.end()) {
      e.size = it->second;
      size_at.erase(it);
    }
  }
  const replay_result with = replay_arena(t, true);
  const replay_result without = replay_arena(t, false);
  const step_plan_state& p = with.stats.pool.plan;
  EXPECT_EQ(p.dropped, 0u) << "a plan started on steps it cannot serve";
  EXPECT_EQ(p.planned_steps, 0u);
  EXPECT_GE(p.starts_refused_calls, 8u) << "the control: the plan is judged at the step starts";
  EXPECT_LE(with.backend_memory_calls, without.backend_memory_calls);
  EXPECT_LE(with.peak_reserved, without.peak_reserved);
}

// resnet at one shape, traced live (k45, 16 steps): its calls over the steps
// in a row pass the calls rule, and its layout holds more than best fit's
// high-water mark, at every start. Refused for the memory in a run, the
// plan backs off: laid out at 3 of the 9 starts after the run began,
// instead of at each (a layout of kvgen's step takes 36 ms).
TEST(arena_plan, a_plan_refused_for_its_memory_in_a_run_is_laid_out_ever_more_rarely) {
  const trace t = testing::test_data_trace("resnet-one-shape.trace.csv.gz");
  const replay_result with = replay_arena(t, true);
  const replay_result without = replay_arena(t, false);
  const step_plan_state& p = with.stats.pool.plan;
  EXPECT_EQ(p.planned_steps, 0u);
  EXPECT_GE(p.starts_refused_memory, 2u) << "the control: the run's plan is refused for its memory";
  EXPECT_LE(p.starts_refused_memory, 4u) << "laid out at every start of the run";
  EXPECT_EQ(with.peak_reserved, without.peak_reserved);
  EXPECT_EQ(with.backend_memory_calls, without.backend_memory_calls);
}

// step_plan alone: a job of 40 allocations a step (its input first, then
// layers kept and freed in reverse), the driver calls best fit would make
// counted by hand (`calls_per_step` in the middle of each step), and every
// start the plan asks for refused as the arena would: what it was judged on.
struct judged_start {
  std::uint64_t step_calls;
  std::uint64_t run_calls;
  bool in_run;
  std::size_t step;  // the job's step it began
};

class shape_run_job {
 public:
  explicit shape_run_job(bool back_off) : back_off_(back_off) {
    plan_.set_call_counter([](const void* c) { return *static_cast<const std::uint64_t*>(c); }, &calls_);
    for (int i = 0; i < 8; ++i) (void)allocate(4000, 0);  // parameters, never freed
  }
  // `grow` units more for every layer; `layers` of them (39: the found
  // step's); with `other_stream`, the fifth on stream 1.
  void step(std::uint32_t input_units, std::uint32_t grow = 0, std::uint32_t layers = 39,
            bool other_stream = false) {
    const std::uintptr_t input = allocate(input_units, 0);
    std::vector<std::uintptr_t> kept;
    const auto stream_of = [&](std::uint32_t l) { return other_stream && l == 4 ? 1u : 0u; };
    for (std::uint32_t l = 0; l < layers; ++l) kept.push_back(allocate(1000 + 10 * l + grow, stream_of(l)));
    calls_ += 10;
    for (std::uint32_t l = layers; l-- > 0;) plan_.after_free(kept[l], 1000 + 10 * l + grow, stream_of(l));
    plan_.after_free(input, input_units, 0);
    ++steps_;
  }
  const std::vector<judged_start>& judged() const { return judged_; }

 private:
  std::uintptr_t allocate(std::uint32_t units, std::uint32_t stream) {
    if (plan_.before_allocate(units, stream) == arena_detail::step_plan::next::need_region) {
      judged_.push_back({plan_.recent_step_calls(), plan_.shape_run_calls(), plan_.in_shape_run(), steps_});
      plan_.defer(back_off_ && plan_.in_shape_run());
    }
    const std::uintptr_t at = next_;
    next_ += std::uintptr_t{units} * 512;
    plan_.after_allocate(at, units, stream, false);
    return at;
  }
  arena_detail::step_plan plan_;
  std::uint64_t calls_ = 0;
  std::size_t steps_ = 0;
  std::uintptr_t next_ = 0x100000;
  bool back_off_;
  std::vector<judged_start> judged_;
};

TEST(arena_plan, best_fit_calls_add_up_over_steps_at_one_shape_and_start_again_at_another) {
  shape_run_job job(/*back_off=*/false);
  for (int i = 0; i < 20; ++i) job.step(500);
  const std::size_t before_other = job.judged().size();
  ASSERT_GE(before_other, 4u) << "the step is not found";
  job.step(400);  // another input (smaller: no larger layout): another shape
  for (int i = 0; i < 4; ++i) job.step(500);
  const std::vector<judged_start>& j = job.judged();
  ASSERT_EQ(j.size(), before_other + 5);
  // At one shape each start is judged on every step since the first whole
  // one: 10 calls more each time, while the last step alone stays at 10.
  for (std::size_t k = 2; k < before_other; ++k) {
    EXPECT_EQ(j[k].step_calls, 10u) << "start " << k;
    EXPECT_EQ(j[k].run_calls, j[k - 1].run_calls + 10) << "start " << k;
    EXPECT_TRUE(j[k].in_run) << "start " << k;
  }
  EXPECT_GE(j[before_other - 1].run_calls, 100u);
  // The start of the 400-unit step ends a step at the shape: still the run.
  EXPECT_EQ(j[before_other].run_calls, j[before_other - 1].run_calls + 10);
  // The start after it ends the 400-unit step: judged on that step alone,
  // and so on the steps at 500 after it, counted anew.
  EXPECT_EQ(j[before_other + 1].run_calls, 10u);
  EXPECT_FALSE(j[before_other + 1].in_run);
  EXPECT_EQ(j[before_other + 2].run_calls, 10u);  // ends the first 500 after the 400: a new run of one
  EXPECT_EQ(j[before_other + 3].run_calls, 20u);
  EXPECT_TRUE(j[before_other + 3].in_run);
}

TEST(arena_plan, a_step_of_another_count_or_outgrowing_its_slots_ends_the_run) {
  shape_run_job job(/*back_off=*/false);
  for (int i = 0; i < 20; ++i) job.step(500);
  const std::size_t found = job.judged().size();
  ASSERT_GE(found, 4u) << "the step is not found";
  ASSERT_GE(job.judged().back().run_calls, 100u) << "the control: a run at one shape";
  job.step(500, 0, 38);  // one allocation fewer, the same first allocation
  job.step(500);
  job.step(500);
  job.step(500, 5);      // every layer 5 units larger than its slot
  job.step(500);
  job.step(500);
  job.step(500, 0, 39, /*other_stream=*/true);  // one layer on another stream
  job.step(500);
  const std::vector<judged_start>& j = job.judged();
  ASSERT_EQ(j.size(), found + 8);
  EXPECT_EQ(j[found + 1].run_calls, 0u) << "a step of 39 allocations counted in the run";
  EXPECT_FALSE(j[found + 1].in_run);
  EXPECT_EQ(j[found + 2].run_calls, 10u);
  EXPECT_EQ(j[found + 3].run_calls, 20u);
  EXPECT_EQ(j[found + 4].run_calls, 0u) << "a step larger than its slots counted in the run";
  EXPECT_EQ(j[found + 5].run_calls, 10u);
  EXPECT_EQ(j[found + 6].run_calls, 20u);
  EXPECT_EQ(j[found + 7].run_calls, 0u) << "a step with a block on another stream counted in the run";
}

TEST(arena_plan, a_plan_refused_for_its_memory_at_one_shape_is_judged_ever_more_rarely) {
  // Without backing off every start is judged (and on the arena, laid out).
  shape_run_job every(/*back_off=*/false);
  shape_run_job backing(/*back_off=*/true);
  for (int i = 0; i < 64; ++i) {
    every.step(500);
    backing.step(500);
  }
  ASSERT_GE(every.judged().size(), 50u) << "the control: a start judged at every step";
  // Refused in a run: 1, 2, 4, 8, 16 starts left out after each refusal.
  EXPECT_LE(backing.judged().size(), 12u);
  EXPECT_GE(backing.judged().size(), 6u);
  // A step of another shape is judged at its start, back-off or not, and
  // refused there (it ends a step of the run) it backs off; the start after
  // it ends a step of the new shape, no run yet: judged too.
  const std::size_t before = backing.judged().size();
  backing.step(400);
  EXPECT_EQ(backing.judged().size(), before + 1);
  EXPECT_TRUE(backing.judged().back().in_run);
  backing.step(400);
  EXPECT_EQ(backing.judged().size(), before + 2) << "a start skipped on the back-off of another shape's run";
  EXPECT_FALSE(backing.judged().back().in_run);
}

TEST(arena_plan, a_plan_backed_off_is_judged_at_least_once_in_65_steps) {
  // The back-off doubles up to 64 starts left out: a plan that would fit
  // later (its high-water mark risen, say) waits at most that long.
  shape_run_job backing(/*back_off=*/true);
  for (int i = 0; i < 600; ++i) backing.step(500);
  const std::vector<judged_start>& j = backing.judged();
  ASSERT_GE(j.size(), 8u);
  std::size_t widest = 0;
  for (std::size_t k = 1; k < j.size(); ++k) widest = std::max(widest, j[k].step - j[k - 1].step);
  EXPECT_EQ(widest, 65u) << "64 starts left out between two judged ones at most, and reached";
  EXPECT_LE(600 - j.back().step, 65u) << "no start judged at the end";
}

TEST(arena_plan, steps_of_the_plan_shape_after_one_of_another_shape_stay_planned) {
  // Long steps at sequence lengths drawn per step, with short steps of
  // another shape between them (attention's backward allocates otherwise
  // below some length): the plan departs midway through each short step,
  // keeps its layout (the rest of the short step is served in its ranges'
  // free memory) and serves the long steps after it with no driver call,
  // at no higher peak. Without the plan best fit re-stitches in the long
  // steps (the positive control).
  const std::vector<std::size_t> tokens = {1024, 1536, 768, 2048, 1280, 1792, 896, 1664, 1152, 1920, 256,
                                           1408, 1856, 1216, 384, 1984, 1088, 1600, 256, 1344, 1920, 1472};
  std::vector<bool> other(tokens.size(), false);
  other[10] = other[14] = other[18] = true;
  const outcome with = run(tokens, true, {}, 0, other);
  const outcome without = run(tokens, false, {}, 0, other);
  std::uint64_t without_long = 0;
  for (std::size_t i = 11; i < tokens.size(); ++i) {
    if (!other[i]) without_long += without.calls[i];
  }
  EXPECT_GT(without_long, 0u) << "the long steps do not exercise stitching";
  ASSERT_GE(with.state.plan.dropped, 1u) << "the short steps do not depart from the plan";
  // Before (the plan given up at each short step, best fit re-stitching on
  // its layout): 3,690 calls in these steps against best fit's 1,761, and
  // 4.66 times the live bytes held.
  for (std::size_t i = 11; i < tokens.size(); ++i) {
    if (!other[i]) {
      EXPECT_EQ(with.calls[i], 0u) << "step " << i;
    }
  }
  EXPECT_LE(with.ratio, without.ratio + 1e-9);
  EXPECT_EQ(with.map_live, with.state.allocated);
}

TEST(arena_plan, a_block_larger_than_its_slot_midway_hands_the_plan_over) {
  // Planned steps, then one whose logits (midway, with the layers' inputs
  // live in the plan) are four times their slot: the plan is left there,
  // and its live blocks become the arena's, so the rest of its ranges
  // serves the step instead of new memory; the job is planned again after.
  const std::vector<std::size_t> tokens(14, 1024);
  std::vector<std::size_t> logits(tokens.size(), 1);
  logits[8] = 4;
  const outcome with = run(tokens, true, logits);
  const outcome without = run(tokens, false, logits);
  EXPECT_GE(with.state.plan.dropped, 1u);
  EXPECT_LE(with.ratio, without.ratio + 1e-9);
  EXPECT_EQ(with.calls.back(), 0u) << "not planned again";
  EXPECT_EQ(with.map_live, with.state.allocated);
}

TEST(arena_plan, a_plan_handed_over_midway_leaves_no_planned_block_counted) {
  // Planned steps, one whose logits midway are four times their slot (the
  // plan is left with its blocks live, and hand_over makes them the
  // arena's), then steps planned again. Once every block is freed,
  // release_cached() gives back every byte: before, the blocks handed over
  // stayed counted as live planned ones, so no later plan's ranges were
  // ever freed (held until the arena's destruction; found by
  // arena_plan_soak_test).
  sim_backend sim(options());
  arena_policy a(with_plan(true), sim);
  job j{a, {}};
  j.make_parameters(varied_parameter);
  for (int i = 0; i < 14; ++i) j.step(1024, i == 8 ? 4 : 1);
  ASSERT_GE(a.state().plan.dropped, 1u) << "control: the larger logits leave the plan";
  ASSERT_GT(a.state().plan.region_bytes, 0u) << "control: planned again after";
  j.free_parameters();
  EXPECT_EQ(j.overlaps, 0u);
  EXPECT_EQ(a.state().allocated, 0u);
  a.release_cached();
  EXPECT_EQ(a.state().reserved, 0u) << "the plan's ranges were kept";
  EXPECT_EQ(sim.used_bytes(), 0u);
}

// A request of 2^41 bytes or more has more 512-byte units than 32 bits hold:
// cut to 32 bits, 2^41 + 512 bytes read as one unit, which the first slot
// of an active plan fits, and the arena handed out a small planned block.
TEST(arena_plan, a_request_too_large_to_count_is_never_served_from_the_plan) {
  sim_backend sim(options());
  arena_policy a(with_plan(true), sim);
  job j{a, {}};
  j.make_parameters(flat_parameter);
  for (int i = 0; i < 10; ++i) j.step(2048);
  ASSERT_GE(a.state().plan.planned_steps, 3u) << "control: the plan serves the steps";
  const std::size_t huge = (std::size_t{1} << 41) + 512;
  void* p = nullptr;
  EXPECT_THROW(p = a.allocate(huge, 0), out_of_memory) << "served at " << p;
  j.step(2048);  // the arena goes on
  j.free_parameters();
}

TEST(arena_plan, plan_off_leaves_best_fit_as_it_was) {
  // step_plan:false: nothing is recorded or planned.
  const outcome without = run(std::vector<std::size_t>(8, 1024), false);
  EXPECT_EQ(without.state.plan.steps_detected, 0u);
  EXPECT_EQ(without.state.plan.planned_bytes, 0u);
}

TEST(arena_plan, a_job_that_changes_shape_leaves_its_plan) {
  // Repeats long enough to be planned, then a longer sequence: the plan is
  // left, its memory goes back to best fit, and every block is still served.
  std::vector<std::size_t> tokens(8, 1024);
  tokens.push_back(2048);
  tokens.push_back(2048);
  const outcome with = run(tokens, true);
  EXPECT_GE(with.state.plan.planned_steps, 1u);
  EXPECT_GE(with.state.plan.dropped, 1u);
  EXPECT_GT(with.state.plan.unplanned_bytes, 0u);
}

TEST(arena_plan, at_debug_level_the_plan_says_what_it_found_started_and_left) {
  // FRAGCTL_LOG_LEVEL=debug: one line for each of the plan's rare events
  // (docs/policies/arena.md, "Reading the plan's decisions"); none at the
  // default level.
  std::vector<std::size_t> tokens(8, 1024);
  tokens.push_back(2048);
  tokens.push_back(2048);
  std::string quiet;
  {
    const testing::log_capture log(spdlog::level::warn);  // the default level
    (void)run(tokens, true);
    quiet = log.text();
  }
  EXPECT_EQ(quiet.find("step plan"), std::string::npos) << quiet;
  const testing::log_capture log(spdlog::level::debug);
  const outcome with = run(tokens, true);
  ASSERT_GE(with.state.plan.planned_steps, 1u);
  const std::string text = log.text();
  EXPECT_NE(text.find("arena step plan: a step of "), std::string::npos) << text;
  EXPECT_NE(text.find("arena step plan: started, "), std::string::npos) << text;
  // The 2,048-token step: laid out again for it, or left.
  EXPECT_TRUE(text.find("arena step plan: a larger step at allocation ") != std::string::npos ||
              text.find("arena step plan: off its layout at allocation ") != std::string::npos)
      << text;
}

TEST(arena_plan, figures_reach_json_and_report) {
  const outcome with = run(std::vector<std::size_t>(10, 2048), true);
  allocator_stats s;
  s.allocator = "arena";
  s.backend = "sim";
  s.pool = with.state;
  s.pool.plan.starts_refused_calls = 7;
  s.pool.plan.starts_refused_memory = 3;
  const std::string j = to_json(s);
  EXPECT_NE(j.find("\"step_plan\""), std::string::npos);
  EXPECT_NE(j.find("\"planned_steps\""), std::string::npos);
  const auto back = stats_from_json(j);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->pool.plan.planned_steps, with.state.plan.planned_steps);
  EXPECT_EQ(back->pool.plan.planned_bytes, with.state.plan.planned_bytes);
  EXPECT_EQ(back->pool.plan.last_step_driver_calls, with.state.plan.last_step_driver_calls);
  EXPECT_EQ(back->pool.plan.starts_refused_calls, 7u);
  EXPECT_EQ(back->pool.plan.starts_refused_memory, 3u);
  EXPECT_NE(to_prometheus(s).find("fragctl_step_plan_planned_steps_total"), std::string::npos);
  const std::string prometheus = to_prometheus(s);
  for (const auto& [name, value] : {std::pair<std::string, std::string>{"fragctl_step_plan_starts_refused_calls_total{", "} 7\n"},
                                    {"fragctl_step_plan_starts_refused_memory_total{", "} 3\n"}}) {
    const std::size_t at = prometheus.find(name);
    ASSERT_NE(at, std::string::npos) << prometheus;
    EXPECT_EQ(prometheus.find(value, at), prometheus.find('}', at)) << prometheus.substr(at, 200);
  }
  run_report r;
  r.name = "plan";
  r.stats = s;
  const std::string text = render_text(r, {});
  EXPECT_NE(text.find("Steady-state plan"), std::string::npos);
  EXPECT_NE(text.find("driver calls"), std::string::npos);
  EXPECT_NE(text.find("plan starts refused"), std::string::npos) << text;
  EXPECT_NE(text.find("7 for their calls"), std::string::npos) << text;
  EXPECT_NE(text.find("3 for the memory"), std::string::npos) << text;
  // Without a plan the section and the JSON object are absent.
  allocator_stats none;
  EXPECT_EQ(to_json(none).find("step_plan"), std::string::npos);
}

// A small repeating step on the backed fixture of the failure tests: kept
// inputs, transient blocks of several sizes, gradients until the step's end.
// With other_shape, the backward's recomputed block is freed after the
// kept input (another order) and one more, small block comes: a step of
// another shape, departing from the plan midway.
// small_step's forward: eight layers, each keeping one input.
std::vector<void*> small_forward(testing_arena::world& w) {
  using testing_arena::G;
  std::vector<void*> kept;
  for (int l = 0; l < 8; ++l) {
    void* a = w.take(10 * G + 512);
    void* b = w.take(20 * G);
    w.give(a);
    kept.push_back(w.take(2 * G + 1024));
    w.give(b);
  }
  return kept;
}

void small_step(testing_arena::world& w, bool other_shape = false) {
  using testing_arena::G;
  std::vector<void*> kept = small_forward(w), grads;
  for (int l = 7; l >= 0; --l) {
    void* r = w.take(20 * G);
    grads.push_back(w.take(3 * G));
    if (other_shape) {
      w.give(kept[static_cast<std::size_t>(l)]);
      void* extra = w.take(G);
      w.give(r);
      w.give(extra);
    } else {
      w.give(r);
      w.give(kept[static_cast<std::size_t>(l)]);
    }
  }
  for (void* g : grads) w.give(g);
}

config small_spans() {
  config cfg;
  cfg.map_chunk = 4 * testing_arena::G;
  return cfg;
}

TEST(arena_plan, plan_runs_on_the_failure_fixture) {
  // The positive control of the next test: without faults the small job is
  // planned (so the faults below reach the plan's start) and its later
  // steps make no driver call.
  testing_arena::world w(small_spans());
  void* weights = w.take(5 * testing_arena::G);
  std::uint64_t last = 0;
  for (int i = 0; i < 16; ++i) {
    const std::uint64_t before = w.sim->counters().memory_calls();
    small_step(w);
    last = w.sim->counters().memory_calls() - before;
    ASSERT_TRUE(w.consistent()) << "step " << i;
  }
  EXPECT_GE(w.arena->state().plan.planned_steps, 4u);
  EXPECT_EQ(last, 0u);
  w.give(weights);
  w.tear_down();
}

// Runs `steps` small steps (of another shape where `other` says so) with
// every k-th `target` call failing (k = 0: every call in steps 3 to 8,
// where the plan is found and would start, none before or after); after
// every step the arena agrees with the device and every block keeps its
// data; at the end the device is empty.
void steps_under_faults(sim_fault_target target, std::uint64_t k, int steps, bool (*other)(int)) {
  SCOPED_TRACE(::testing::Message() << "target " << static_cast<int>(target) << ", every " << k);
  testing_arena::world w(small_spans());
  void* weights = w.take(5 * testing_arena::G);
  if (k != 0) w.sim->fail_every(target, k);
  for (int i = 0; i < steps; ++i) {
    if (k == 0 && i == 3) w.sim->fail_from(target, 1);
    if (k == 0 && i == 9) w.sim->reset_faults();
    try {
      small_step(w, other(i));
    } catch (const out_of_memory&) {
      // A retry failed too: the step is cut short; its blocks stay live
      // and are checked, then freed below.
    }
    ASSERT_TRUE(w.consistent()) << "step " << i;
    while (w.blocks.size() > 1) w.give(w.blocks.back().p);
  }
  w.sim->reset_faults();
  w.give(weights);
  w.tear_down();
}

bool every_third_from_nine(int i) { return i >= 8 && i % 3 == 0; }
bool never_other(int) { return false; }

TEST(arena_plan, steps_of_another_shape_keep_the_plan_and_every_block_whole) {
  // Steps of another shape between planned ones on the backed fixture: the
  // plan waits through each (before: it was left at the first and never
  // served again, 2 steps planned in all) and serves the steps of its
  // shape after them; the blocks it serves in its ranges' gaps meanwhile
  // never overlap a live block (every block keeps its pattern), and the
  // arena agrees with the device after every step, with driver calls
  // failing too (as in the test below).
  {
    testing_arena::world w(small_spans());
    void* weights = w.take(5 * testing_arena::G);
    for (int i = 0; i < 24; ++i) {
      small_step(w, every_third_from_nine(i));
      ASSERT_TRUE(w.consistent()) << "step " << i;
    }
    EXPECT_GE(w.arena->state().plan.dropped, 5u) << "the other shape did not depart from the plan";
    // Steps 8, 10, 11, 13, ... 22 (the last one is counted at the next
    // step's start).
    EXPECT_GE(w.arena->state().plan.planned_steps, 11u);
    EXPECT_EQ(w.arena->state().plan.steps_detected, 1u);
    w.give(weights);
    w.tear_down();
  }
  for (const sim_fault_target target :
       {sim_fault_target::create_physical, sim_fault_target::map, sim_fault_target::set_access}) {
    for (const std::uint64_t k : {2u, 3u, 7u}) steps_under_faults(target, k, 24, every_third_from_nine);
  }
}

TEST(arena_plan, failed_driver_calls_leave_the_plan_consistent) {
  // Every k-th create, map or set_access fails (memory pressure that comes
  // and goes), including those that map the plan's range: each growth is
  // rolled back and retried, a plan that cannot get its range is
  // abandoned, and after every step the arena agrees with the device and
  // every block keeps its data; at the end the device is empty.
  for (const sim_fault_target target :
       {sim_fault_target::create_physical, sim_fault_target::map, sim_fault_target::set_access}) {
    // k = 0: every call fails in steps 3 to 8 (where the plan is found and
    // would start), none before or after.
    for (const std::uint64_t k : {0u, 2u, 3u, 7u}) steps_under_faults(target, k, 16, never_other);
  }
}

// A plan waiting through a step of another shape with blocks live must not
// keep its ranges' free memory from the arena: an allocation on another
// stream that best fit can serve once the ranges are handed over gets it,
// not out_of_memory (the fallback gave the ranges back only when no planned
// block was live).
bool other_stream_allocation_while_waiting(bool plan, std::size_t x, std::uint64_t* dropped,
                                           std::uint64_t* planned_steps) {
  using testing_arena::G;
  config cfg = small_spans();
  cfg.step_plan = plan;
  testing_arena::world w(cfg);
  void* weights = w.take(5 * G);
  for (int i = 0; i < 12; ++i) small_step(w);
  *planned_steps = w.arena->state().plan.planned_steps;
  // A step of another shape (small_step(w, true)) up to its first departure.
  std::vector<void*> kept = small_forward(w);
  void* r = w.take(20 * G);
  void* g = w.take(3 * G);
  w.give(kept[7]);          // out of line: the next allocation departs
  void* extra = w.take(G);  // the plan waits; served in a gap of its ranges
  w.give(r);
  w.give(extra);
  *dropped = w.arena->state().plan.dropped;
  // g and kept[0..6] are live in the plan's ranges; another stream asks.
  stream_t s = w.sim->create_stream();
  bool ok = false;
  try {
    void* p = w.arena->allocate(x, s);
    ok = true;
    w.arena->deallocate(p, x, s);
  } catch (const out_of_memory&) {
  }
  EXPECT_TRUE(w.consistent());
  w.give(g);
  for (int l = 0; l < 7; ++l) w.give(kept[static_cast<std::size_t>(l)]);
  w.give(weights);
  w.sim->synchronize_stream(s);
  w.tear_down();
  w.sim->destroy_stream(s);
  return ok;
}

TEST(arena_plan, a_waiting_plan_does_not_fail_another_streams_allocation) {
  using testing_arena::G;
  std::uint64_t dropped = 0, planned = 0;
  ASSERT_TRUE(other_stream_allocation_while_waiting(false, 210 * G, &dropped, &planned))
      << "control: best fit serves it (up to 230G here)";
  const bool ok = other_stream_allocation_while_waiting(true, 210 * G, &dropped, &planned);
  ASSERT_GE(planned, 3u) << "control: the plan serves the steps";
  ASSERT_EQ(dropped, 1u) << "control: the plan departed once and waits";
  EXPECT_TRUE(ok) << "out_of_memory while the waiting plan's ranges hold the free memory (largest that passes: 200G)";
}


// A plan that served steps and then waits (deferred) for the live bytes to
// come back to its floor must not stop learning when the job keeps more
// memory past its steps from then on (state made late, a cache): the floor
// is never reached again, and only a learning plan looks for periods.
struct phase_change {
  std::uint64_t tail_calls = 0, detected_in_second_phase = 0;
  step_plan_state plan{};  // at the end
};
phase_change after_phase_change(bool with_first_phase) {
  sim_backend sim(options());
  arena_policy a(with_plan(true), sim);
  job j{a, {}};
  j.make_parameters(varied_parameter);
  if (with_first_phase) {
    for (int i = 0; i < 12; ++i) j.step(i % 2 == 0 ? 256 : 384);  // short steps: planned
  }
  const std::uint64_t detected_before = a.state().plan.steps_detected;
  void* persistent = j.alloc(512 * MiB);  // outlives every later step
  const std::vector<std::size_t> tokens = {1024, 1536, 768,  2048, 1280, 1792, 896,  1664, 1152, 1920,
                                           1408, 1856, 1216, 1984, 1088, 1600, 1344, 1920, 1472, 2048};
  std::uint64_t tail = 0;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::uint64_t before = sim.counters().memory_calls();
    j.step(tokens[i]);
    if (i >= 12) tail += sim.counters().memory_calls() - before;
  }
  const phase_change out{tail, a.state().plan.steps_detected - detected_before, a.state().plan};
  j.free(persistent, 512 * MiB);
  j.free_parameters();
  return out;
}

TEST(arena_plan, a_plan_waiting_for_a_floor_never_reached_does_not_stop_learning) {
  const phase_change alone = after_phase_change(false);
  ASSERT_EQ(alone.tail_calls, 0u) << "control: the long steps alone are planned";
  ASSERT_GE(alone.detected_in_second_phase, 1u);
  const phase_change after = after_phase_change(true);
  EXPECT_GE(after.detected_in_second_phase, 1u)
      << "the short steps' plan, waiting for ever, stops learning: " << after.tail_calls
      << " driver calls in the last 8 long steps";
}

// A step of small blocks that best fit serves from the memory it mapped in
// the first step: found (after two steps: the calls judged are then those
// of the steps after the first), its plan never pays, and each step start
// counts a start refused for its calls.
step_plan_state small_blocks_job(std::uint64_t* calls_after_first) {
  sim_backend sim(options());
  arena_policy a(with_plan(true), sim);
  std::uint64_t after_first = 0;
  for (int step = 0; step < 16; ++step) {
    std::vector<void*> kept;
    for (int i = 0; i < 100; ++i) {
      void* t = a.allocate(MiB + 512 * static_cast<std::size_t>(i), 0);
      kept.push_back(a.allocate(256 * KiB, 0));
      a.deallocate(t, MiB + 512 * static_cast<std::size_t>(i), 0);
    }
    for (void* p : kept) a.deallocate(p, 256 * KiB, 0);
    if (step == 0) after_first = sim.counters().memory_calls();
  }
  *calls_after_first = sim.counters().memory_calls() - after_first;
  return a.state().plan;
}

TEST(arena_plan, refused_plan_starts_are_counted_by_reason) {
  std::uint64_t calls = 0;
  const step_plan_state small = small_blocks_job(&calls);
  ASSERT_EQ(calls, 0u) << "control: best fit serves the later steps with no driver call";
  ASSERT_GE(small.steps_detected, 1u) << "control: the step is found";
  EXPECT_EQ(small.planned_steps, 0u);
  // Once per step start judged: at least the steps after the plan was
  // found, at most every step.
  EXPECT_GE(small.starts_refused_calls, 8u);
  EXPECT_LE(small.starts_refused_calls, 16u);
  EXPECT_EQ(small.starts_refused_memory, 0u);
  // The short steps' plan, then long ones after a block kept past every
  // step: the plans found there are refused for the memory too (the
  // high-water mark), and some for their calls.
  const phase_change after = after_phase_change(true);
  EXPECT_GE(after.plan.starts_refused_memory, 1u);
  EXPECT_GE(after.plan.starts_refused_calls, 1u);
}


}  // namespace
}  // namespace fragctl
