// Which layers to checkpoint (docs/checkpoint.md, "Planner").
//
// Model (activation memory only, as in Chen et al. 2016, "Training Deep Nets
// with Sublinear Memory Cost"). A chain of n layers; layer i's activation
// takes a_i bytes and recomputing it costs c_i (one forward of the layer).
// A plan keeps the activations of a set C of layers through forward; every
// maximal run of other layers is a segment, recomputed in backward from the
// checkpoint before it (or the model input, which is not counted). Backward
// runs from the last layer down and frees each activation once its layer is
// done, so with S(i) = sum of a_j over j in C, j < i:
//
//   peak = max( S(n),                                   all checkpoints held
//               max over segments [l, r] of S(l) + a_l + ... + a_r )
//                                   recomputing a segment over the ones below
//   recompute cost = sum of c_i over layers not in C
//
// Forward never exceeds the peak: a segment's layer i is live beside S(l)
// only. Keeping every layer gives peak = total and no recompute; keeping none
// gives peak = total and recomputes everything.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace fragctl::checkpoint {

struct layer_profile {
  std::size_t activation_bytes = 0;  ///< a_i
  double recompute_cost = 1.0;       ///< c_i (a forward of the layer; 1 if unknown)
};

struct checkpoint_plan {
  std::vector<bool> checkpointed;  ///< per layer: keep its activation (in C)
  std::size_t peak_bytes = 0;      ///< predicted peak activation bytes (the model above)
  double recompute_cost = 0;       ///< sum of c_i over layers not kept
  std::size_t checkpointed_bytes = 0;  ///< S(n)
  std::size_t segments = 0;            ///< runs of recomputed layers
};

/// Peak and cost of keeping the layers `checkpointed` marks (same length as
/// `layers`; invalid_argument otherwise).
[[nodiscard]] checkpoint_plan evaluate_plan(std::span<const layer_profile> layers,
                                            std::vector<bool> checkpointed);

/// Chen et al.'s sqrt(n) plan: segments of s = round(sqrt(n)) layers, the
/// last layer of each kept (layers s-1, 2s-1, ...). Empty input, empty plan.
[[nodiscard]] checkpoint_plan plan_sqrt(std::span<const layer_profile> layers);

/// The plan with the least recompute cost whose peak fits `budget` bytes
/// (ties go to the lower peak among the plans the search keeps; the cost is
/// exact, the tie-break is not). By dynamic programming over
/// the last kept layer with Pareto sets of (stored bytes, cost): O(n^2 * P)
/// for P the size of those sets (at most n for equal activations). Error
/// kOutOfRange when no plan fits, naming the least peak any plan reaches.
[[nodiscard]] absl::StatusOr<checkpoint_plan> plan_for_budget(std::span<const layer_profile> layers,
                                                              std::size_t budget);

}  // namespace fragctl::checkpoint
