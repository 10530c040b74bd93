// Linking fragctl from C++: build an allocator from a policy name and use it.
#include <cstdio>

#include "fragctl/allocator_stack.hpp"
#include "fragctl/config.hpp"
#include "fragctl/policy.hpp"

int main() {
  auto cfg = fragctl::parse_config("sim_capacity:1GiB");  // FRAGCTL_CONF syntax
  if (!cfg.ok()) return 1;
  cfg->backend = fragctl::backend_kind::sim;  // host simulator: runs anywhere
  cfg->policy = "caching";
  auto stack = fragctl::make_allocator(*cfg);
  fragctl::device_allocator& allocator = stack->allocator();

  void* block = allocator.allocate(64 << 20, /*stream=*/nullptr);
  allocator.deallocate(block, 64 << 20, nullptr);

  const fragctl::allocator_stats s = stack->stats();
  std::printf("policy=%s peak_requested=%zu peak_reserved=%zu\n", s.allocator.c_str(),
              s.requested.peak, s.reserved.peak);
  return s.requested.peak == (64u << 20) ? 0 : 1;
}
