#include "conformance/conformance_suite.hpp"

struct caching_tag {
  static constexpr const char* expression = "caching";
};
INSTANTIATE_TYPED_TEST_SUITE_P(caching, conformance, caching_tag);
