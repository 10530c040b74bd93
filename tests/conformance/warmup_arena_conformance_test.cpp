#include "conformance/conformance_suite.hpp"

struct warmup_arena_tag {
  static constexpr const char* expression = "warmup:arena";
  static constexpr const char* conf = "warmup_bytes:64MiB";
  static constexpr bool reuses_in_place = false;
};
INSTANTIATE_TYPED_TEST_SUITE_P(warmup_arena, conformance, warmup_arena_tag);
