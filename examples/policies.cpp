// The same fragmenting workload through two policies, on the host simulator:
// many mid-size blocks, every other one freed, then larger blocks that fit
// none of the holes. Prints what each policy held at its peak.
#include <cstdio>
#include <vector>

#include "fragctl/allocator_stack.hpp"
#include "fragctl/config.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/version.hpp"

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

// Returns 0 when the policy served the workload.
int run(const char* policy) {
  auto cfg = fragctl::parse_config("sim_capacity:8GiB");
  if (!cfg.ok()) return 1;
  cfg->backend = fragctl::backend_kind::sim;
  cfg->policy = policy;
  auto stack = fragctl::make_allocator(*cfg);
  fragctl::device_allocator& allocator = stack->allocator();

  std::vector<void*> small;
  for (int i = 0; i < 64; ++i) small.push_back(allocator.allocate(6 * MiB, nullptr));
  for (std::size_t i = 0; i < small.size(); i += 2) allocator.deallocate(small[i], 6 * MiB, nullptr);
  std::vector<void*> large;
  for (int i = 0; i < 16; ++i) large.push_back(allocator.allocate(14 * MiB, nullptr));
  for (void* p : large) allocator.deallocate(p, 14 * MiB, nullptr);
  for (std::size_t i = 1; i < small.size(); i += 2) allocator.deallocate(small[i], 6 * MiB, nullptr);

  const fragctl::allocator_stats s = stack->stats();
  std::printf("%-8s peak requested %6.1f MiB, peak reserved %6.1f MiB, reserved/requested %.3f\n", policy,
              static_cast<double>(s.requested.peak) / MiB, static_cast<double>(s.reserved.peak) / MiB,
              static_cast<double>(s.reserved.peak) / static_cast<double>(s.requested.peak));
  return s.requested.peak == 32 * 6 * MiB + 16 * 14 * MiB ? 0 : 1;  // after the holes, at the large blocks
}

}  // namespace

int main() {
  std::printf("fragctl %s\n", FRAGCTL_VERSION);
  return run("caching") | run("arena");
}
