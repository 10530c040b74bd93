// The checkpoint planner; the model is in fragctl/checkpoint/planner.hpp.
//
// plan_for_budget: a state is "layer j is kept, S bytes are kept up to and
// including j, cost c so far". From state (j, S, c) the next kept layer k > j
// makes the segment j+1..k-1, feasible when S + bytes(segment) <= budget, and
// S + a_k <= budget; the state (k, S + a_k, c + cost(segment)) follows. The
// plan ends with the segment after the last kept layer. For each j only
// Pareto-minimal (S, c) pairs matter (less stored and less cost dominate), so
// each j keeps a list sorted by S with strictly falling c. Layer -1 stands for
// the model input: (S = 0, c = 0).
#include "fragctl/checkpoint/planner.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "fmt/format.h"
#include "fragctl/error.hpp"

namespace fragctl::checkpoint {

checkpoint_plan evaluate_plan(std::span<const layer_profile> layers, std::vector<bool> checkpointed) {
  if (checkpointed.size() != layers.size()) {
    throw invalid_argument(fmt::format("evaluate_plan: {} flags for {} layers", checkpointed.size(), layers.size()));
  }
  checkpoint_plan p;
  std::size_t stored = 0;  // S(i)
  std::size_t segment = 0;
  bool in_segment = false;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    if (checkpointed[i]) {
      stored += layers[i].activation_bytes;
      in_segment = false;
      continue;
    }
    if (!in_segment) {
      in_segment = true;
      segment = stored;
      ++p.segments;
    }
    segment += layers[i].activation_bytes;
    p.peak_bytes = std::max(p.peak_bytes, segment);
    p.recompute_cost += layers[i].recompute_cost;
  }
  p.checkpointed_bytes = stored;
  p.peak_bytes = std::max(p.peak_bytes, stored);
  p.checkpointed = std::move(checkpointed);
  return p;
}

checkpoint_plan plan_sqrt(std::span<const layer_profile> layers) {
  const std::size_t n = layers.size();
  const auto s = std::max<std::size_t>(1, static_cast<std::size_t>(std::lround(std::sqrt(static_cast<double>(n)))));
  std::vector<bool> keep(n, false);
  for (std::size_t i = s - 1; i < n; i += s) keep[i] = true;
  return evaluate_plan(layers, std::move(keep));
}

namespace {

struct state {
  std::size_t stored = 0;
  double cost = 0;
  int parent_layer = -1;        // previous kept layer (-1: the input)
  std::size_t parent_index = 0; // its state in that layer's front
};

/// Inserts (stored, cost) into a Pareto front sorted by stored with falling cost.
void insert(std::vector<state>& front, const state& s) {
  auto it = std::lower_bound(front.begin(), front.end(), s.stored,
                             [](const state& a, std::size_t v) { return a.stored < v; });
  // Dominated by an entry storing no more and costing no more?
  if (it != front.begin() && std::prev(it)->cost <= s.cost) return;
  if (it != front.end() && it->stored == s.stored && it->cost <= s.cost) return;
  // Remove entries it dominates: storing at least as much, costing at least as much.
  auto end = it;
  while (end != front.end() && end->cost >= s.cost) ++end;
  it = front.erase(it, end);
  front.insert(it, s);
}

struct search {
  std::span<const layer_profile> layers;
  std::vector<std::size_t> bytes_prefix;  // sum a_0..a_{i-1}
  std::vector<double> cost_prefix;

  explicit search(std::span<const layer_profile> l) : layers(l) {
    bytes_prefix.assign(l.size() + 1, 0);
    cost_prefix.assign(l.size() + 1, 0.0);
    for (std::size_t i = 0; i < l.size(); ++i) {
      bytes_prefix[i + 1] = bytes_prefix[i] + l[i].activation_bytes;
      cost_prefix[i + 1] = cost_prefix[i] + l[i].recompute_cost;
    }
  }
  [[nodiscard]] std::size_t bytes(std::size_t from, std::size_t to) const { return bytes_prefix[to] - bytes_prefix[from]; }
  [[nodiscard]] double cost(std::size_t from, std::size_t to) const { return cost_prefix[to] - cost_prefix[from]; }

  /// The cheapest plan under `budget`, or an empty optional.
  [[nodiscard]] std::optional<std::vector<bool>> run(std::size_t budget) const {
    const std::size_t n = layers.size();
    // fronts[j + 1]: states with layer j kept last (fronts[0]: the input).
    std::vector<std::vector<state>> fronts(n + 1);
    fronts[0].push_back({});
    for (std::size_t k = 0; k < n; ++k) {
      for (std::size_t j1 = 0; j1 <= k; ++j1) {  // j1 = j + 1: the segment is j1..k-1
        const std::size_t seg = bytes(j1, k);
        for (std::size_t idx = 0; idx < fronts[j1].size(); ++idx) {
          const state& s = fronts[j1][idx];
          if (seg > 0 && s.stored + seg > budget) break;  // fronts grow in stored
          const std::size_t stored = s.stored + layers[k].activation_bytes;
          if (stored > budget) break;
          insert(fronts[k + 1], {stored, s.cost + cost(j1, k), static_cast<int>(j1) - 1, idx});
        }
      }
    }
    // The trailing segment after the last kept layer; best cost, then least peak.
    std::optional<std::pair<std::size_t, std::size_t>> best;  // (front, index)
    double best_cost = std::numeric_limits<double>::infinity();
    std::size_t best_peak = 0;
    for (std::size_t j1 = 0; j1 <= n; ++j1) {
      const std::size_t seg = bytes(j1, n);
      for (std::size_t idx = 0; idx < fronts[j1].size(); ++idx) {
        const state& s = fronts[j1][idx];
        if (seg > 0 && s.stored + seg > budget) break;
        const double c = s.cost + cost(j1, n);
        std::vector<bool> keep = trace(fronts, j1, idx);
        const std::size_t peak = evaluate_plan(layers, keep).peak_bytes;
        if (c < best_cost || (c == best_cost && peak < best_peak)) {
          best = {{j1, idx}};
          best_cost = c;
          best_peak = peak;
        }
      }
    }
    if (!best) return std::nullopt;
    return trace(fronts, best->first, best->second);
  }

  [[nodiscard]] std::vector<bool> trace(const std::vector<std::vector<state>>& fronts, std::size_t j1,
                                        std::size_t idx) const {
    std::vector<bool> keep(layers.size(), false);
    while (j1 > 0) {
      keep[j1 - 1] = true;
      const state& s = fronts[j1][idx];
      j1 = static_cast<std::size_t>(s.parent_layer + 1);
      idx = s.parent_index;
    }
    return keep;
  }
};

}  // namespace

absl::StatusOr<checkpoint_plan> plan_for_budget(std::span<const layer_profile> layers, std::size_t budget) {
  const search s(layers);
  if (auto keep = s.run(budget)) return evaluate_plan(layers, std::move(*keep));
  // The least peak any plan reaches: feasibility is monotone in the budget.
  std::size_t lo = 0, hi = s.bytes(0, layers.size());  // keeping all fits `hi`
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (s.run(mid)) hi = mid; else lo = mid + 1;
  }
  return absl::OutOfRangeError(fmt::format(
      "checkpoint planner: no plan fits {} bytes; the least peak any plan reaches is {} bytes", budget, lo));
}

}  // namespace fragctl::checkpoint
