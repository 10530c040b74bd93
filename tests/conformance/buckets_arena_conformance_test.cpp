#include "conformance/conformance_suite.hpp"

struct buckets_arena_tag {
  static constexpr const char* expression = "buckets:arena";
};
INSTANTIATE_TYPED_TEST_SUITE_P(buckets_arena, conformance, buckets_arena_tag);
