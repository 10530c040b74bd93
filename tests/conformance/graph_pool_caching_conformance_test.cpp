#include "conformance/conformance_suite.hpp"

struct graph_pool_caching_tag {
  static constexpr const char* expression = "graph_pool:caching";
  static constexpr bool holds_memory = true;
};
INSTANTIATE_TYPED_TEST_SUITE_P(graph_pool_caching, conformance, graph_pool_caching_tag);
