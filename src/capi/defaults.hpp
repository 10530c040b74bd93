// Process-default allocators: one per device, built on first use from the
// environment (or from configure_defaults) and never destroyed. The C API's
// fragctl_default_allocator, the PyTorch entry points and the LD_PRELOAD
// layer all allocate through these.
//
// Why never destroyed: frees arrive during process exit (PyTorch's and the
// CUDA runtime's static destructors free what they hold), after any static
// allocator would be gone. The FRAGCTL_REPORT registry writes their report at
// exit (fragctl/stats_export.hpp), which needs no device call.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "capi/handle.hpp"
#include "fragctl/policy.hpp"

namespace fragctl::capi {

/// Devices 0 .. max_devices - 1 may have a default allocator.
inline constexpr int max_devices = 64;

/// What configure_defaults changes relative to the environment; an empty
/// optional keeps the environment's value.
struct default_overrides {
  std::optional<std::string> policy;
  std::optional<std::string> options;  ///< FRAGCTL_CONF syntax, applied on top of FRAGCTL_CONF
  std::optional<std::string> backend;  ///< "cuda", "hip", "sim" or "auto"
};

/// Fixes the configuration of default allocators not yet built: the
/// environment's, with `overrides` applied. Validates the policy expression,
/// options and backend now. FailedPrecondition if a default allocator exists;
/// InvalidArgument naming the variable or key otherwise. Thread-safe.
absl::Status configure_defaults(const default_overrides& overrides);

/// The default allocator of `device`, built on first use. Throws
/// invalid_argument (bad device or configuration) or backend_error (runtime
/// or device missing); a failed build is remembered and rethrown, without a
/// new attempt, until configure_defaults runs again. Thread-safe; the fast
/// path is one atomic load.
fragctl_allocator& default_allocator(int device);

/// The default allocator of `device` if it was built, else nullptr. Never
/// builds, never throws.
fragctl_allocator* find_default_allocator(int device) noexcept;

/// Every default allocator built so far, in creation order.
std::vector<fragctl_allocator*> default_allocators();

}  // namespace fragctl::capi
