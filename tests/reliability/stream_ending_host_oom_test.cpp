// stream_ending when host memory runs out (caching re-files its free blocks
// in new pool entries, the one step of it that needs memory): at every
// allocation it makes, an operator new that fails there. The call throws
// std::bad_alloc and the allocator stays as it was and usable, the stream
// alive (the preload shim then leaves it undestroyed); a second call
// succeeds, and after the stream is destroyed nothing names it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "fragctl/allocator_stack.hpp"
#include "fragctl/config.hpp"
#include "fragctl/sim_backend.hpp"

namespace {
thread_local long fail_in = -1;  // the n-th operator new from now fails (0: the next); -1: none
void* take(std::size_t n) {
  if (fail_in >= 0 && fail_in-- == 0) throw std::bad_alloc();
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
}  // namespace

void* operator new(std::size_t n) { return take(n); }
void* operator new[](std::size_t n) { return take(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace fragctl {
namespace {

// One try: the stream met every way (cached blocks of three sizes, a live
// block, a block used on it), stream_ending failing at the `n`-th
// allocation. Returns whether it failed.
bool end_with_a_failure_at(const std::string& policy, long n) {
  config cfg;
  cfg.policy = policy;
  cfg.block_table = true;
  auto backend = std::make_unique<sim_backend>();
  sim_backend& sim = *backend;
  allocator_stack stack(std::move(backend), cfg);
  device_allocator& a = stack.allocator();
  const stream_t s = sim.create_stream();
  void* live = a.allocate(4096, s);
  std::vector<std::pair<void*, std::size_t>> cached;
  for (std::size_t bytes : {std::size_t{4096}, std::size_t{3} << 20, std::size_t{64} << 20}) {
    cached.emplace_back(a.allocate(bytes, s), bytes);
  }
  for (const auto& [p, bytes] : cached) a.deallocate(p, bytes, s);
  void* used = a.allocate(8192, nullptr);
  a.record_stream(used, s);
  const pool_state before = a.state();

  bool failed = false;
  fail_in = n;
  try {
    a.stream_ending(s);
  } catch (const std::bad_alloc&) {
    failed = true;
  }
  fail_in = -1;
  if (failed) {
    const pool_state after = a.state();
    EXPECT_EQ(after.reserved, before.reserved);
    EXPECT_EQ(after.allocated, before.allocated);
    // Nothing forgotten: the live block still names s, and no block cached
    // for s serves the default stream.
    EXPECT_EQ(a.block_info(live)->stream, s) << "failure at " << n;
    for (const auto& [p, bytes] : cached) {
      void* d = a.allocate(bytes, nullptr);
      EXPECT_NE(d, p) << "a block cached for s served the default stream after a failure at " << n;
      a.deallocate(d, bytes, nullptr);
    }
    // The stream is alive: the allocator goes on with it, then ends it.
    void* again = a.allocate(4096, s);
    a.deallocate(again, 4096, s);
    a.stream_ending(s);
  }
  sim.destroy_stream(s);
  a.deallocate(used, 8192, nullptr);
  a.deallocate(live, 4096, a.block_info(live)->stream);
  void* p = a.allocate(std::size_t{3} << 20, nullptr);
  a.deallocate(p, std::size_t{3} << 20, nullptr);
  a.release_cached();
  EXPECT_EQ(a.state().allocated, 0u);
  EXPECT_EQ(sim.destroyed_stream_calls(), 0u) << "after a failure at allocation " << n;
  return failed;
}

TEST(stream_ending, out_of_host_memory_leaves_the_allocator_as_it_was) {
  for (const char* policy : {"caching", "buckets:caching", "graph_pool:caching", "arena"}) {
    SCOPED_TRACE(policy);
    long failures = 0;
    long n = 0;
    while (end_with_a_failure_at(policy, n)) {
      ++failures;
      ++n;
      ASSERT_LT(n, 64) << "stream_ending never succeeds";
    }
    if (std::string(policy).find("caching") != std::string::npos) {
      EXPECT_GT(failures, 0) << "the control: caching's re-filing allocates, so some position fails";
    }
  }
}

}  // namespace
}  // namespace fragctl
