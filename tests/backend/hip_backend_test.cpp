// The HIP backend against a real AMD GPU: the GPU backend suite
// (gpu_backend_suite.hpp) for HIP, the mirror of cuda_backend_test.
#include "gpu_backend_suite.hpp"

namespace fragctl::testing {

const gpu_runtime hip{"hip", "HIP", make_hip_backend, "hipErrorInvalidDevice", "hipError", "hipFree"};

INSTANTIATE_TEST_SUITE_P(hip, gpu_backend_unavailable, ::testing::Values(hip));
INSTANTIATE_TEST_SUITE_P(hip, gpu_backend_test, ::testing::Values(hip));

}  // namespace fragctl::testing
