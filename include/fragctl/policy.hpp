// Policies and how they compose (DESIGN.md, "The four policies").
//
// A policy is a device_allocator in allocator_policies/<name>/ that satisfies
// `allocator_policy`. Base policies get memory from the backend (`caching`,
// `arena`); wrapper policies get it from an upstream allocator (`buckets`,
// `warmup`). A policy expression names wrappers from the outside in, then at
// most one base: "warmup:buckets:arena" is warmup over buckets over arena. An
// expression that ends in a wrapper gets the default base. The default
// expression is "arena" where the backend has virtual memory, else "caching".
// The entry point that builds a policy chain with its adaptors is
// fragctl/allocator_stack.hpp (included at the end, for code written before
// it had its own header).
#pragma once

#include <concepts>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "fragctl/backend.hpp"
#include "fragctl/config.hpp"
#include "fragctl/device_allocator.hpp"

namespace fragctl {

/// What every policy class provides: it is a device_allocator, constructible
/// from the configuration (a base policy from the backend, a wrapper from its
/// upstream), and names itself with a constant usable in FRAGCTL_POLICY.
template <class P>
concept allocator_policy =
    std::derived_from<P, device_allocator> && !std::is_abstract_v<P> && requires {
      { P::policy_name } -> std::convertible_to<std::string_view>;
    } && (std::constructible_from<P, const config&, device_backend&> ||
          std::constructible_from<P, const config&, std::unique_ptr<device_allocator>>);

/// One registered policy.
struct policy_info {
  std::string_view name;
  bool wraps_upstream;    ///< true for wrappers (buckets, warmup)
  std::string_view help;  ///< one line for --help and docs
};

/// Every policy FRAGCTL_POLICY offers. Pool kinds made for one use (the
/// graph_pool wrapper: a CUDA graph's private pool, built with
/// fragctl_create) are accepted in expressions but not listed.
[[nodiscard]] const std::vector<policy_info>& policies();

/// The expressions the documentation recommends and the conformance suite
/// covers, base policies first: "caching", "arena", "buckets:caching",
/// "buckets:arena", "warmup:arena", "warmup:buckets:arena" (those whose
/// policies are registered). `fragctl replay --policy all` replays these.
[[nodiscard]] const std::vector<std::string>& documented_compositions();

/// The default policy expression for a backend ("arena" with virtual memory,
/// else "caching").
[[nodiscard]] std::string default_policy(const device_backend& backend);

/// Checks a policy expression; errors name the unknown or misplaced part and
/// list what is accepted.
[[nodiscard]] absl::Status validate_policy(std::string_view expression);

/// Builds the bare policy chain of `expression` on `backend` (no adaptors).
/// Empty expression means default_policy(backend). Throws invalid_argument
/// for a bad expression.
[[nodiscard]] std::unique_ptr<device_allocator> make_policy(std::string_view expression,
                                                            const config& cfg,
                                                            device_backend& backend);

}  // namespace fragctl

#include "fragctl/allocator_stack.hpp"  // IWYU pragma: export
