#include "conformance/conformance_suite.hpp"

struct warmup_caching_tag {
  static constexpr const char* expression = "warmup:caching";
};
INSTANTIATE_TYPED_TEST_SUITE_P(warmup_caching, conformance, warmup_caching_tag);
