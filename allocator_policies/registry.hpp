// What the registry (registry.cpp) offers the rest of the policies layer:
// allocator_stack builds its chain with it. Private to the layer.
#pragma once

#include <memory>

#include "fragctl/backend.hpp"
#include "fragctl/config.hpp"
#include "fragctl/device_allocator.hpp"

namespace fragctl {

/// Builds the policy chain of cfg.policy on `backend` (no adaptors) and sets
/// cfg.policy to the expression built, defaults filled in ("" -> "arena",
/// "buckets" -> "buckets:arena"); the policies see that expression. Warns
/// once per FRAGCTL_CONF key that belongs to a policy outside the chain.
/// Throws invalid_argument for a bad expression.
[[nodiscard]] std::unique_ptr<device_allocator> build_configured_policy(config& cfg, device_backend& backend);

}  // namespace fragctl
