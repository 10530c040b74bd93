// The incumbents of the microbenchmarks: the CUDA runtime's cudaMalloc /
// cudaFree, and cudaMallocAsync / cudaFreeAsync from the device's default
// memory pool kept warm (release threshold raised to the maximum, so freed
// memory stays in the pool). The runtime is loaded with dlopen in this
// benchmark only; no fragctl target links libcudart.
//
// libcudart is looked for as $FRAGCTL_CUDART (a path), then libcudart.so,
// libcudart.so.13, .12 and .11.0 on the loader's path, then under
// /usr/local/cuda/lib64.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "subject.hpp"

namespace fragctl::bench {

/// Pseudo-policy names of the runtime subjects: "cudaMalloc", "cudaMallocAsync".
[[nodiscard]] const std::vector<std::string>& cuda_runtime_subjects();
[[nodiscard]] bool is_cuda_runtime_subject(std::string_view name);

/// Empty when libcudart can be loaded and sees a device; else why not.
[[nodiscard]] std::string cuda_runtime_unavailable_reason();

/// Builds a runtime subject on `device` with subject_streams non-blocking
/// streams. Throws std::runtime_error naming what is missing.
[[nodiscard]] std::unique_ptr<subject> make_cuda_runtime_subject(std::string_view name, int device);

}  // namespace fragctl::bench
