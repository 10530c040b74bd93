// fragctl_memory_kind_of and fragctl_environment_memory_kind (fragctl/fragctl.h):
// which memory a backend's addresses refer to, the one place that answers it.
#include "capi/handle.hpp"
#include "fragctl/backend.hpp"
#include "fragctl/config.hpp"
#include "fragctl/fragctl.h"
#include "fragctl/sim_backend.hpp"
#include "util/strings.hpp"

namespace {

/// Only the simulator hands out host memory (backed) or none (accounting);
/// every other backend is a GPU runtime.
fragctl_memory_kind kind_of(const fragctl::device_backend& backend) noexcept {
  const auto* sim = dynamic_cast<const fragctl::sim_backend*>(&backend);
  if (sim == nullptr) return FRAGCTL_MEMORY_DEVICE;
  return sim->options().backed ? FRAGCTL_MEMORY_HOST : FRAGCTL_MEMORY_NONE;
}

}  // namespace

using fragctl::capi::fail;
using fragctl::capi::guarded;

extern "C" {

fragctl_status fragctl_memory_kind_of(fragctl_allocator* allocator, fragctl_memory_kind* kind) {
  FRAGCTL_REQUIRE(allocator != nullptr && kind != nullptr, "fragctl_memory_kind_of: allocator or kind is NULL");
  *kind = kind_of(allocator->stack->backend());
  return FRAGCTL_OK;
}

fragctl_status fragctl_environment_memory_kind(fragctl_memory_kind* kind) {
  FRAGCTL_REQUIRE(kind != nullptr, "fragctl_environment_memory_kind: kind is NULL");
  return guarded([&] {
    const auto cfg = fragctl::config_from_environment();
    if (!cfg.ok()) {
      return fail(FRAGCTL_ERROR_INVALID_ARGUMENT, fragctl::util::to_std(cfg.status().message()));
    }
    *kind = kind_of(*fragctl::make_backend(*cfg));
    return FRAGCTL_OK;
  });
}

}  // extern "C"
