// The CUDA driver backend against a real device: the GPU backend suite
// (gpu_backend_suite.hpp) for CUDA.
#include "gpu_backend_suite.hpp"

namespace fragctl::testing {

const gpu_runtime cuda{"cuda", "CUDA", make_cuda_backend, "CUDA_ERROR_INVALID_DEVICE", "CUDA_ERROR_", "cuMemFree"};

INSTANTIATE_TEST_SUITE_P(cuda, gpu_backend_unavailable, ::testing::Values(cuda));
INSTANTIATE_TEST_SUITE_P(cuda, gpu_backend_test, ::testing::Values(cuda));

}  // namespace fragctl::testing
