// The checkpoint planner against hand-computed cases (the model in
// fragctl/checkpoint/planner.hpp) and against brute force on small chains.
#include "fragctl/checkpoint/planner.hpp"

#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <string>
#include <vector>

#include "fragctl/error.hpp"

namespace fragctl::checkpoint {
namespace {

std::vector<layer_profile> profile(const std::vector<std::size_t>& bytes) {
  std::vector<layer_profile> l;
  for (std::size_t b : bytes) l.push_back({b, 1.0});
  return l;
}

std::vector<bool> keep(std::size_t n, const std::vector<std::size_t>& kept) {
  std::vector<bool> k(n, false);
  for (std::size_t i : kept) k[i] = true;
  return k;
}

TEST(checkpoint_planner, keeping_all_or_none_holds_everything) {
  const auto layers = profile({4, 1, 1, 4, 1, 1});
  const checkpoint_plan all = evaluate_plan(layers, std::vector<bool>(6, true));
  EXPECT_EQ(all.peak_bytes, 12u);
  EXPECT_EQ(all.recompute_cost, 0.0);
  EXPECT_EQ(all.segments, 0u);
  const checkpoint_plan none = evaluate_plan(layers, std::vector<bool>(6, false));
  EXPECT_EQ(none.peak_bytes, 12u);
  EXPECT_EQ(none.recompute_cost, 6.0);
  EXPECT_EQ(none.segments, 1u);
  EXPECT_THROW((void)evaluate_plan(layers, std::vector<bool>(5, false)), invalid_argument);
}

TEST(checkpoint_planner, a_plan_peaks_recomputing_its_highest_segment) {
  // Keep {1, 3, 5} of a = 4 1 1 4 1 1: S(n) = 6; segments [0] over 0 -> 4,
  // [2] over S(2) = 1 -> 2, [4] over S(4) = 5 -> 6. Peak 6, three recomputed.
  const auto layers = profile({4, 1, 1, 4, 1, 1});
  const checkpoint_plan p = evaluate_plan(layers, keep(6, {1, 3, 5}));
  EXPECT_EQ(p.peak_bytes, 6u);
  EXPECT_EQ(p.recompute_cost, 3.0);
  EXPECT_EQ(p.checkpointed_bytes, 6u);
  EXPECT_EQ(p.segments, 3u);
}

TEST(checkpoint_planner, sqrt_n_segments) {
  // 16 equal layers: segments of 4, layers 3, 7, 11, 15 kept. Recomputing
  // [12, 14] over 3 kept ones peaks at 6; 12 layers are recomputed.
  const checkpoint_plan p = plan_sqrt(profile(std::vector<std::size_t>(16, 1)));
  EXPECT_EQ(p.checkpointed, keep(16, {3, 7, 11, 15}));
  EXPECT_EQ(p.peak_bytes, 6u);
  EXPECT_EQ(p.recompute_cost, 12.0);
  EXPECT_EQ(p.segments, 4u);

  // 6 layers: s = round(sqrt(6)) = 2, layers 1, 3, 5 kept (the case above).
  const checkpoint_plan six = plan_sqrt(profile({4, 1, 1, 4, 1, 1}));
  EXPECT_EQ(six.checkpointed, keep(6, {1, 3, 5}));
  EXPECT_EQ(six.peak_bytes, 6u);

  EXPECT_TRUE(plan_sqrt({}).checkpointed.empty());
}

TEST(checkpoint_planner, budget_plans_by_hand) {
  const auto layers = profile({4, 1, 1, 4, 1, 1});
  // Budget 7: no plan keeps five layers (at least 8 bytes); of the plans that
  // keep four, {1, 2, 4, 5} (S = 4, recomputing [3] over S(3) = 2 -> 6) has
  // the lowest peak.
  auto p7 = plan_for_budget(layers, 7);
  ASSERT_TRUE(p7.ok()) << p7.status();
  EXPECT_EQ(p7->checkpointed, keep(6, {1, 2, 4, 5}));
  EXPECT_EQ(p7->recompute_cost, 2.0);
  EXPECT_EQ(p7->peak_bytes, 6u);

  // Budget 5: the only plan recomputing three layers is {2, 4, 5}: segments
  // [0, 1] -> 5 and [3] over S(3) = 1 -> 5.
  auto p5 = plan_for_budget(layers, 5);
  ASSERT_TRUE(p5.ok()) << p5.status();
  EXPECT_EQ(p5->checkpointed, keep(6, {2, 4, 5}));
  EXPECT_EQ(p5->recompute_cost, 3.0);
  EXPECT_EQ(p5->peak_bytes, 5u);

  // Budget 12 (everything): nothing recomputed.
  auto p12 = plan_for_budget(layers, 12);
  ASSERT_TRUE(p12.ok());
  EXPECT_EQ(p12->recompute_cost, 0.0);
  EXPECT_EQ(p12->checkpointed, std::vector<bool>(6, true));

  // Budget 4: layer 0 alone fills it, so layer 1 must be kept, and layer 3
  // then sits on top of it either way. The least peak is 5.
  auto p4 = plan_for_budget(layers, 4);
  ASSERT_FALSE(p4.ok());
  EXPECT_EQ(p4.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(std::string(p4.status().message()).find("least peak any plan reaches is 5 bytes"), std::string::npos)
      << p4.status();
}

TEST(checkpoint_planner, recompute_costs_weigh_the_choice) {
  // a = 2 1 2, budget 4. Feasible plans: {0, 2} (peak 4, recomputes 1),
  // {1, 2} (peak 3, recomputes 0), {1} and {2} (peak 3, recompute two).
  // Equal costs: {1, 2} ties with {0, 2} and has the lower peak.
  auto uniform = plan_for_budget(profile({2, 1, 2}), 4);
  ASSERT_TRUE(uniform.ok());
  EXPECT_EQ(uniform->checkpointed, keep(3, {1, 2}));
  EXPECT_EQ(uniform->peak_bytes, 3u);
  // Layer 0 five times as costly to recompute: keep it.
  const std::vector<layer_profile> weighted{{2, 5.0}, {1, 1.0}, {2, 1.0}};
  auto costly = plan_for_budget(weighted, 4);
  ASSERT_TRUE(costly.ok());
  EXPECT_EQ(costly->checkpointed, keep(3, {0, 2}));
  EXPECT_EQ(costly->recompute_cost, 1.0);
  EXPECT_EQ(costly->peak_bytes, 4u);
}

/// Every subset of a small chain, for the brute-force comparison.
struct brute_result {
  double best_cost = std::numeric_limits<double>::infinity();
  std::size_t least_peak = std::numeric_limits<std::size_t>::max();
};
brute_result brute_force(const std::vector<layer_profile>& layers, std::size_t budget) {
  brute_result r;
  const std::size_t n = layers.size();
  for (std::uint32_t mask = 0; mask < (1u << n); ++mask) {
    std::vector<bool> k(n);
    for (std::size_t i = 0; i < n; ++i) k[i] = ((mask >> i) & 1u) != 0;
    const checkpoint_plan p = evaluate_plan(layers, k);
    r.least_peak = std::min(r.least_peak, p.peak_bytes);
    if (p.peak_bytes <= budget) r.best_cost = std::min(r.best_cost, p.recompute_cost);
  }
  return r;
}

TEST(checkpoint_planner, budget_plans_match_brute_force) {
  std::mt19937 rng(12345);
  for (int round = 0; round < 300; ++round) {
    const std::size_t n = 1 + rng() % 10;
    std::vector<layer_profile> layers;
    std::size_t total = 0;
    for (std::size_t i = 0; i < n; ++i) {
      layers.push_back({1 + rng() % 8, static_cast<double>(1 + rng() % 4)});
      total += layers.back().activation_bytes;
    }
    const std::size_t budget = rng() % (total + 2);
    SCOPED_TRACE(::testing::Message() << "round " << round << " n " << n << " budget " << budget);
    const brute_result b = brute_force(layers, budget);
    auto p = plan_for_budget(layers, budget);
    if (b.best_cost == std::numeric_limits<double>::infinity()) {
      ASSERT_FALSE(p.ok());
      EXPECT_NE(std::string(p.status().message()).find("reaches is " + std::to_string(b.least_peak) + " bytes"),
                std::string::npos)
          << p.status();
    } else {
      ASSERT_TRUE(p.ok()) << p.status();
      EXPECT_EQ(p->recompute_cost, b.best_cost);
      EXPECT_LE(p->peak_bytes, budget);
      EXPECT_EQ(evaluate_plan(layers, p->checkpointed).peak_bytes, p->peak_bytes);
    }
  }
}

}  // namespace
}  // namespace fragctl::checkpoint
