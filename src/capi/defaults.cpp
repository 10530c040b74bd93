// The process-default allocator registry (capi/defaults.hpp).
#include "capi/defaults.hpp"

#include <array>
#include <atomic>
#include <mutex>

#include "fmt/format.h"
#include "fragctl/allocator_stack.hpp"
#include "fragctl/config.hpp"
#include "fragctl/error.hpp"
#include "util/strings.hpp"

namespace fragctl::capi {

namespace {

/// A remembered failure to build a device's allocator.
struct failure {
  enum class kind { none, invalid, backend } what = kind::none;
  std::string message;
};

struct registry {
  std::mutex mutex;  // guards everything but the slots' fast-path loads
  std::optional<config> configured;
  std::array<std::atomic<fragctl_allocator*>, max_devices> slots{};
  std::array<failure, max_devices> failures;
  std::vector<fragctl_allocator*> order;
};

registry& instance() {
  static registry* const r = new registry;  // never destroyed (see header)
  return *r;
}

std::string message_of(const absl::Status& status) { return std::string(util::to_std(status.message())); }

absl::StatusOr<config> base_config(const registry& r) {
  if (r.configured) return *r.configured;
  return config_from_environment();
}

[[noreturn]] void rethrow(const failure& f) {
  if (f.what == failure::kind::backend) throw backend_error(f.message, 0, "unavailable");
  throw invalid_argument(f.message);
}

}  // namespace

absl::Status configure_defaults(const default_overrides& overrides) {
  registry& r = instance();
  const std::lock_guard<std::mutex> lock(r.mutex);
  if (!r.order.empty()) {
    return absl::FailedPreconditionError(fmt::format(
        "the default allocator of device {} exists already: configure defaults before the first allocation",
        r.order.front()->stack->configuration().device));
  }
  auto cfg = config_from_environment();
  if (!cfg.ok()) return cfg.status();
  if (overrides.policy) cfg->policy = std::string(util::trim(*overrides.policy));
  if (overrides.options) {
    cfg = parse_config(*overrides.options, *std::move(cfg));
    if (!cfg.ok()) return absl::InvalidArgumentError(fmt::format("options: {}", message_of(cfg.status())));
  }
  if (overrides.backend) {
    auto kind = parse_backend_kind(*overrides.backend);
    if (!kind.ok()) return absl::InvalidArgumentError(fmt::format("backend: {}", message_of(kind.status())));
    cfg->backend = *kind;
  }
  if (absl::Status s = validate_policy(cfg->policy); !s.ok()) return s;
  r.configured = *std::move(cfg);
  r.failures.fill(failure{});
  return absl::OkStatus();
}

fragctl_allocator& default_allocator(int device) {
  if (device < 0 || device >= max_devices) {
    throw invalid_argument(fmt::format("device {} out of range 0..{}", device, max_devices - 1));
  }
  registry& r = instance();
  const auto index = static_cast<std::size_t>(device);
  if (fragctl_allocator* a = r.slots[index].load(std::memory_order_acquire)) return *a;

  const std::lock_guard<std::mutex> lock(r.mutex);
  if (fragctl_allocator* a = r.slots[index].load(std::memory_order_relaxed)) return *a;
  if (r.failures[index].what != failure::kind::none) rethrow(r.failures[index]);
  try {
    auto cfg = base_config(r);
    if (!cfg.ok()) throw invalid_argument(message_of(cfg.status()));
    cfg->device = device;
    auto* handle = new fragctl_allocator{make_allocator(*cfg), true};
    r.order.push_back(handle);
    r.slots[index].store(handle, std::memory_order_release);
    return *handle;
  } catch (const backend_error& e) {
    r.failures[index] = {failure::kind::backend, e.what()};
    throw;
  } catch (const invalid_argument& e) {
    r.failures[index] = {failure::kind::invalid, e.what()};
    throw;
  }
}

fragctl_allocator* find_default_allocator(int device) noexcept {
  if (device < 0 || device >= max_devices) return nullptr;
  return instance().slots[static_cast<std::size_t>(device)].load(std::memory_order_acquire);
}

std::vector<fragctl_allocator*> default_allocators() {
  registry& r = instance();
  const std::lock_guard<std::mutex> lock(r.mutex);
  return r.order;
}

}  // namespace fragctl::capi
