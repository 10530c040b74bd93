// Backend selection (FRAGCTL_BACKEND): make_backend, and the stand-ins for the
// CUDA and HIP factories in builds configured without them.
#include <algorithm>
#include <memory>

#include "fragctl/backend.hpp"
#include "fragctl/config.hpp"
#include "fragctl/error.hpp"
#include "fragctl/log.hpp"
#include "fragctl/sim_backend.hpp"

namespace fragctl {

namespace {

/// Code of errors that say a backend is not available in this build.
[[maybe_unused]] constexpr int not_supported_code = 801;  // CUDA_ERROR_NOT_SUPPORTED and hipErrorNotSupported

std::unique_ptr<device_backend> make_sim(const config& cfg) {
  return std::make_unique<sim_backend>(sim_options_from(cfg));
}

}  // namespace

sim_options sim_options_from(const config& cfg) {
  sim_options options;
  options.capacity = cfg.sim_capacity;
  options.granularity = cfg.sim_granularity;
  options.backed = cfg.sim_backed;
  options.virtual_memory = cfg.sim_virtual_memory;
  options.device = cfg.device;
  options.devices = std::max(cfg.sim_devices, cfg.device + 1);
  options.context_bytes = cfg.sim_context;
  options.other_process_bytes = cfg.sim_other_processes;
  return options;
}

#ifndef FRAGCTL_HAVE_CUDA
std::unique_ptr<device_backend> make_cuda_backend(int /*device*/) {
  throw backend_error("cuda backend: fragctl was built without CUDA support (FRAGCTL_WITH_CUDA=OFF)",
                      not_supported_code, "not_supported");
}
#endif

#ifndef FRAGCTL_HAVE_HIP
std::unique_ptr<device_backend> make_hip_backend(int /*device*/) {
  throw backend_error("hip backend: fragctl was built without HIP support (FRAGCTL_WITH_HIP=OFF or no HIP headers)",
                      not_supported_code, "not_supported");
}
#endif

std::unique_ptr<device_backend> make_backend(const config& cfg) {
  switch (cfg.backend) {
    case backend_kind::sim:
      return make_sim(cfg);
    case backend_kind::cuda:
      return make_cuda_backend(cfg.device);
    case backend_kind::hip:
      return make_hip_backend(cfg.device);
    case backend_kind::automatic:
      break;
  }
  try {
    return make_cuda_backend(cfg.device);
  } catch (const backend_error& e) {
    logger().info("backend: cuda skipped: {}", e.what());
  }
  try {
    return make_hip_backend(cfg.device);
  } catch (const backend_error& e) {
    logger().info("backend: hip skipped: {}", e.what());
  }
  logger().info("backend: no GPU backend found a device; using sim ({} bytes, granularity {})", cfg.sim_capacity,
                cfg.sim_granularity);
  return make_sim(cfg);
}

}  // namespace fragctl
