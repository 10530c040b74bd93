// NVML's per-process device memory (nvml.hpp).
#include "backend/cuda/nvml.hpp"

#include <unistd.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "fragctl/log.hpp"
#include "util/shared_library.hpp"

namespace fragctl::cuda {

namespace {

// NVML's types, as nvml.h declares them (NVML 11 and newer).
using nvml_return = int;  // nvmlReturn_t; NVML_SUCCESS is 0
using nvml_device = struct nvml_device_st*;
constexpr nvml_return nvml_success = 0;
constexpr nvml_return nvml_insufficient_size = 7;         // NVML_ERROR_INSUFFICIENT_SIZE
constexpr unsigned long long nvml_not_available = ~0ULL;  // NVML_VALUE_NOT_AVAILABLE

// nvmlProcessInfo_v2_t, which nvmlDeviceGetComputeRunningProcesses_v3 and
// _v2 fill; nvmlProcessInfo_v1_t, which the unversioned one fills.
struct process_info_v2 {
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};
struct process_info_v1 {
  unsigned int pid;
  unsigned long long used_gpu_memory;
};

using init_fn = nvml_return (*)();
using handle_by_bus_id_fn = nvml_return (*)(const char*, nvml_device*);
using processes_v2_fn = nvml_return (*)(nvml_device, unsigned int*, process_info_v2*);
using processes_v1_fn = nvml_return (*)(nvml_device, unsigned int*, process_info_v1*);

struct nvml_api {
  handle_by_bus_id_fn handle_by_bus_id = nullptr;
  processes_v2_fn processes_v2 = nullptr;  // _v3, else _v2
  processes_v1_fn processes_v1 = nullptr;
};

// Loaded and initialised once; nullopt where NVML is missing or nvmlInit fails.
std::optional<nvml_api> load() {
  std::vector<util::shared_library::attempt> failed;
  const std::optional<util::shared_library> library = util::shared_library::open({"libnvidia-ml.so.1"}, failed);
  if (!library) {
    logger().debug("cuda backend: no per-process device memory: libnvidia-ml.so.1 did not load ({})",
                   failed.empty() ? std::string("?") : failed.front().error);
    return std::nullopt;
  }
  const auto init = library->function<init_fn>("nvmlInit_v2");
  nvml_api api;
  api.handle_by_bus_id = library->function<handle_by_bus_id_fn>("nvmlDeviceGetHandleByPciBusId_v2");
  api.processes_v2 = library->function<processes_v2_fn>("nvmlDeviceGetComputeRunningProcesses_v3");
  if (api.processes_v2 == nullptr)
    api.processes_v2 = library->function<processes_v2_fn>("nvmlDeviceGetComputeRunningProcesses_v2");
  if (api.processes_v2 == nullptr)
    api.processes_v1 = library->function<processes_v1_fn>("nvmlDeviceGetComputeRunningProcesses");
  if (init == nullptr || api.handle_by_bus_id == nullptr ||
      (api.processes_v2 == nullptr && api.processes_v1 == nullptr)) {
    logger().debug("cuda backend: no per-process device memory: libnvidia-ml.so.1 lacks an entry point");
    return std::nullopt;
  }
  if (const nvml_return rc = init(); rc != nvml_success) {
    logger().debug("cuda backend: no per-process device memory: nvmlInit_v2 returned {}", rc);
    return std::nullopt;
  }
  return api;
}

// The running processes' (pid, bytes), asked with a growing buffer.
template <class Info, class Fn>
std::optional<std::vector<Info>> processes(Fn fn, nvml_device device) {
  std::vector<Info> list(16);
  for (int attempt = 0; attempt < 4; ++attempt) {
    auto count = static_cast<unsigned int>(list.size());
    const nvml_return rc = fn(device, &count, list.data());
    if (rc == nvml_success) {
      list.resize(count);
      return list;
    }
    if (rc != nvml_insufficient_size) return std::nullopt;
    list.resize(static_cast<std::size_t>(count) + 16);
  }
  return std::nullopt;
}

template <class Info>
process_memory split_by_pid(const std::vector<Info>& list) {
  process_memory m;
  const auto self = static_cast<unsigned int>(::getpid());
  for (const Info& p : list) {
    if (p.used_gpu_memory == nvml_not_available) continue;
    if (p.pid == self) {
      m.measured = true;
      m.this_process += static_cast<std::size_t>(p.used_gpu_memory);
    } else {
      m.other_processes += static_cast<std::size_t>(p.used_gpu_memory);
    }
  }
  return m;
}

}  // namespace

process_memory nvml_process_memory(const std::string& pci_bus_id) noexcept {
  try {
    static const std::optional<nvml_api> api = load();  // never unloaded
    if (!api) return {};
    nvml_device device = nullptr;
    if (api->handle_by_bus_id(pci_bus_id.c_str(), &device) != nvml_success) return {};
    if (api->processes_v2 != nullptr) {
      const auto list = processes<process_info_v2>(api->processes_v2, device);
      return list ? split_by_pid(*list) : process_memory{};
    }
    const auto list = processes<process_info_v1>(api->processes_v1, device);
    return list ? split_by_pid(*list) : process_memory{};
  } catch (...) {  // out of host memory: no figures
    return {};
  }
}

}  // namespace fragctl::cuda
