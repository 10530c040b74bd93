#include "conformance/conformance_suite.hpp"

struct arena_tag {
  static constexpr const char* expression = "arena";
};
INSTANTIATE_TYPED_TEST_SUITE_P(arena, conformance, arena_tag);
