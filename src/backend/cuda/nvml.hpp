// NVML's per-process device memory, loaded at run time (the cuda backend's
// get_process_memory).
//
// Nothing links NVML: libnvidia-ml.so.1 is opened with dlopen on first use,
// as the driver is (cuda_driver.hpp), and its few entry points are declared
// here by their documented C signatures, so no nvml.h is needed to build.
// The device is found by its PCI bus id (cuDeviceGetPCIBusId), which NVML
// and CUDA agree on whatever CUDA_VISIBLE_DEVICES renumbers. This process is
// found by its pid in nvmlDeviceGetComputeRunningProcesses' list; inside a
// PID namespace (a container that hides host PIDs) it is not there, and the
// figures are "not measured".
#pragma once

#include <string>

#include "fragctl/backend.hpp"

namespace fragctl::cuda {

/// This process's and the other processes' device memory on the device with
/// PCI bus id `pci_bus_id` ("0000:3B:00.0"), from NVML. `measured` false
/// when NVML is missing or fails, or this process is not in its list. Loads
/// NVML once per process (never unloaded). Thread-safe; never throws.
[[nodiscard]] process_memory nvml_process_memory(const std::string& pci_bus_id) noexcept;

}  // namespace fragctl::cuda
