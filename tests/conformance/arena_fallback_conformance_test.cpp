#include "conformance/conformance_suite.hpp"

struct arena_fallback_tag {
  static constexpr const char* expression = "arena";
  static constexpr bool virtual_memory = false;
  static constexpr bool fixed_reservation = true;
};
INSTANTIATE_TYPED_TEST_SUITE_P(arena_fallback, conformance, arena_fallback_tag);
