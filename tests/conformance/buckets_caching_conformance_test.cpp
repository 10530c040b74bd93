#include "conformance/conformance_suite.hpp"

struct buckets_caching_tag {
  static constexpr const char* expression = "buckets:caching";
};
INSTANTIATE_TYPED_TEST_SUITE_P(buckets_caching, conformance, buckets_caching_tag);
