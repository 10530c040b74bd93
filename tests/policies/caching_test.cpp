// The caching policy's own rules, on the sim backend (accounting mode).
#include "allocator_policies/caching/caching_policy.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "fragctl/error.hpp"
#include "fragctl/sim_backend.hpp"

namespace fragctl {
namespace {

using ::testing::HasSubstr;

std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

class caching_test : public ::testing::Test {
 protected:
  explicit caching_test(std::size_t capacity = 80 * GiB, bool manual = false)
      : sim_(make_options(capacity, manual)) {}

  static sim_options make_options(std::size_t capacity, bool manual) {
    sim_options o;
    o.capacity = capacity;
    o.manual_completion = manual;
    return o;
  }

  caching_policy& policy() {
    if (!policy_) policy_ = std::make_unique<caching_policy>(cfg_, sim_);
    return *policy_;
  }
  std::size_t held() const { return sim_.counters().held_bytes; }

  config cfg_;
  sim_backend sim_;
  std::unique_ptr<caching_policy> policy_;
};

TEST_F(caching_test, rounds_requests_to_512_bytes) {
  EXPECT_EQ(policy().allocation_size(1), 512u);
  EXPECT_EQ(policy().allocation_size(512), 512u);
  EXPECT_EQ(policy().allocation_size(513), 1024u);
  EXPECT_EQ(policy().allocation_size(MiB + 1), MiB + 512);
  void* p = policy().allocate(1000);
  EXPECT_EQ(addr(p) % min_alignment, 0u);
  EXPECT_EQ(policy().state().allocated, 1024u);
  policy().deallocate(p, 1000);
}

TEST_F(caching_test, small_requests_share_a_2_mib_segment) {
  void* a = policy().allocate(1000);
  void* b = policy().allocate(4096);
  void* c = policy().allocate(MiB);  // the largest small request
  EXPECT_EQ(held(), 2 * MiB);
  EXPECT_EQ(policy().state().segments, 1u);
  EXPECT_EQ(addr(b), addr(a) + 1024);
  EXPECT_EQ(addr(c), addr(b) + 4096);
  policy().deallocate(a, 1000);
  policy().deallocate(b, 4096);
  policy().deallocate(c, MiB);
}

TEST_F(caching_test, large_segment_sizes_follow_the_request) {
  struct row {
    std::size_t request, segment;
  };
  for (const row r : {row{MiB + 1, 20 * MiB}, row{10 * MiB - 512, 20 * MiB}, row{10 * MiB, 10 * MiB},
                      row{11 * MiB + 1, 12 * MiB}, row{100 * MiB, 100 * MiB}}) {
    sim_backend sim;
    caching_policy p(cfg_, sim);
    void* ptr = p.allocate(r.request);
    EXPECT_EQ(sim.counters().held_bytes, r.segment) << r.request;
    EXPECT_EQ(p.state().reserved, r.segment) << r.request;
    p.deallocate(ptr, r.request);
  }
}

TEST_F(caching_test, best_fit_takes_the_smallest_block_that_fits) {
  void* a = policy().allocate(12 * MiB);
  void* b = policy().allocate(16 * MiB);
  void* c = policy().allocate(14 * MiB);
  policy().deallocate(a, 12 * MiB);
  policy().deallocate(b, 16 * MiB);
  policy().deallocate(c, 14 * MiB);
  EXPECT_EQ(policy().allocate(13 * MiB), c);
  EXPECT_EQ(policy().allocate(15 * MiB), b);
  EXPECT_EQ(held(), 42 * MiB);
}

TEST_F(caching_test, best_fit_prefers_the_lowest_address_among_equal_sizes) {
  void* x = policy().allocate(12 * MiB);
  void* y = policy().allocate(12 * MiB);
  void* z = policy().allocate(12 * MiB);
  policy().deallocate(z, 12 * MiB);
  policy().deallocate(y, 12 * MiB);
  policy().deallocate(x, 12 * MiB);
  const void* lowest = std::min({x, y, z}, [](void* l, void* r) { return addr(l) < addr(r); });
  EXPECT_EQ(policy().allocate(12 * MiB), lowest);
}

TEST_F(caching_test, large_blocks_split_when_more_than_1_mib_remains) {
  void* a = policy().allocate(2 * MiB);  // 20 MiB segment, 18 MiB remain
  void* b = policy().allocate(2 * MiB);
  EXPECT_EQ(held(), 20 * MiB);
  EXPECT_EQ(addr(b), addr(a) + 2 * MiB);
  EXPECT_EQ(policy().state().allocated, 4 * MiB);
  EXPECT_EQ(policy().state().largest_free_block, 16 * MiB);
  policy().deallocate(a, 2 * MiB);
  policy().deallocate(b, 2 * MiB);
}

TEST_F(caching_test, large_blocks_keep_a_tail_of_1_mib_or_less) {
  void* a = policy().allocate(12 * MiB);
  policy().deallocate(a, 12 * MiB);
  void* b = policy().allocate(11 * MiB);  // 1 MiB would remain: not split
  EXPECT_EQ(b, a);
  EXPECT_EQ(policy().state().allocated, 11 * MiB);  // the rounded request
  EXPECT_EQ(policy().state().cached_free, MiB);      // the tail, held but not reusable
  EXPECT_EQ(policy().state().largest_free_block, 0u);
  policy().deallocate(b, 11 * MiB);
}

TEST_F(caching_test, small_blocks_split_down_to_512_bytes) {
  void* a = policy().allocate(2 * MiB - 512 - MiB);  // leaves 1 MiB + 512
  void* b = policy().allocate(MiB);                  // leaves exactly 512
  void* c = policy().allocate(1);
  EXPECT_EQ(held(), 2 * MiB);
  EXPECT_EQ(addr(c), addr(a) + 2 * MiB - 512);
  EXPECT_EQ(policy().state().largest_free_block, 0u);
  policy().deallocate(a, MiB - 512);
  policy().deallocate(b, MiB);
  policy().deallocate(c, 1);
}

TEST_F(caching_test, oversize_blocks_are_not_split_nor_used_for_smaller_requests) {
  cfg_.max_split_size = 32 * MiB;
  void* big = policy().allocate(40 * MiB);
  policy().deallocate(big, 40 * MiB);
  void* mid = policy().allocate(8 * MiB);  // below max_split_size: not from the 40 MiB block
  EXPECT_NE(mid, big);
  EXPECT_EQ(held(), 60 * MiB);
  void* near = policy().allocate(36 * MiB);  // within 20 MiB of it: taken whole
  EXPECT_EQ(near, big);
  EXPECT_EQ(policy().state().largest_free_block, 12 * MiB);  // the 40 MiB block is taken whole
  policy().deallocate(near, 36 * MiB);
  void* far = policy().allocate(18 * MiB + 512);  // oversize block too big for it
  EXPECT_NE(far, big);
  policy().deallocate(mid, 8 * MiB);
  policy().deallocate(far, 18 * MiB + 512);
}

TEST_F(caching_test, freeing_coalesces_back_into_one_free_segment) {
  void* a = policy().allocate(2 * MiB);
  void* b = policy().allocate(2 * MiB);
  void* c = policy().allocate(2 * MiB);
  policy().deallocate(a, 2 * MiB);
  policy().deallocate(c, 2 * MiB);
  EXPECT_EQ(policy().state().largest_free_block, 16 * MiB);  // c merged with the tail
  policy().release_cached();
  EXPECT_EQ(held(), 20 * MiB);  // b still pins the segment
  policy().deallocate(b, 2 * MiB);
  const pool_state s = policy().state();
  EXPECT_EQ(s.largest_free_block, 20 * MiB);
  EXPECT_EQ(s.cached_free, 20 * MiB);
  EXPECT_EQ(s.allocated, 0u);
  EXPECT_EQ(policy().allocate(20 * MiB), a);  // the whole segment again
  EXPECT_EQ(held(), 20 * MiB);
  policy().deallocate(a, 20 * MiB);
}

TEST_F(caching_test, a_block_freed_on_one_stream_is_not_handed_to_another) {
  stream_t s1 = sim_.create_stream();
  stream_t s2 = sim_.create_stream();
  void* a = policy().allocate(4096, s1);
  policy().deallocate(a, 4096, s1);
  void* b = policy().allocate(4096, s2);
  EXPECT_NE(b, a);
  EXPECT_EQ(held(), 4 * MiB);  // one small segment per stream
  EXPECT_EQ(policy().allocate(4096, s1), a);
  policy().deallocate(a, 4096, s1);
  policy().deallocate(b, 4096, s2);
  policy_.reset();
  sim_.destroy_stream(s1);
  sim_.destroy_stream(s2);
}

class caching_manual_test : public caching_test {
 protected:
  caching_manual_test() : caching_test(80 * GiB, /*manual=*/true) {}
};

TEST_F(caching_manual_test, a_block_freed_on_another_stream_waits_for_its_event) {
  stream_t s1 = sim_.create_stream();
  stream_t s2 = sim_.create_stream();
  void* a = policy().allocate(12 * MiB, s1);
  sim_.submit(s2);                       // work on s2 that uses it
  policy().deallocate(a, 12 * MiB, s2);
  void* b = policy().allocate(12 * MiB, s1);
  EXPECT_NE(b, a);
  EXPECT_EQ(policy().state().cached_free, 12 * MiB);
  sim_.complete(s2);
  EXPECT_EQ(policy().allocate(12 * MiB, s1), a);
  policy().deallocate(a, 12 * MiB, s1);
  policy().deallocate(b, 12 * MiB, s1);
  policy_.reset();
  EXPECT_EQ(sim_.live().events, 0u);
  EXPECT_EQ(sim_.live().allocations, 0u);
  sim_.destroy_stream(s1);
  sim_.destroy_stream(s2);
}

TEST_F(caching_manual_test, release_cached_waits_for_pending_cross_stream_frees) {
  stream_t s1 = sim_.create_stream();
  stream_t s2 = sim_.create_stream();
  void* a = policy().allocate(12 * MiB, s1);
  sim_.submit(s2);
  policy().deallocate(a, 12 * MiB, s2);
  policy().release_cached();
  EXPECT_EQ(held(), 0u);
  EXPECT_GE(sim_.counters().of(backend_call::synchronize_event), 1u);
  EXPECT_GE(sim_.counters().of(backend_call::synchronize_stream), 1u);
  policy_.reset();
  sim_.destroy_stream(s1);
  sim_.destroy_stream(s2);
}

TEST_F(caching_test, release_cached_returns_only_wholly_free_segments) {
  void* small = policy().allocate(4096);
  void* large = policy().allocate(12 * MiB);
  void* other = policy().allocate(16 * MiB);
  policy().deallocate(large, 12 * MiB);
  policy().deallocate(other, 16 * MiB);
  EXPECT_EQ(held(), 30 * MiB);
  policy().release_cached();
  EXPECT_EQ(held(), 2 * MiB);
  EXPECT_EQ(policy().state().segments, 1u);
  EXPECT_EQ(policy().state().reserved, 2 * MiB);
  EXPECT_EQ(sim_.counters().of(backend_call::free), 2u);
  policy().deallocate(small, 4096);
  policy().release_cached();
  EXPECT_EQ(held(), 0u);
}

class caching_small_device_test : public caching_test {
 protected:
  caching_small_device_test() : caching_test(40 * MiB) {}
};

TEST_F(caching_small_device_test, out_of_memory_releases_the_cache_and_retries_once) {
  void* a = policy().allocate(12 * MiB);
  policy().deallocate(a, 12 * MiB);
  void* b = policy().allocate(30 * MiB);  // fits only once the 12 MiB segment is gone
  EXPECT_NE(b, nullptr);
  EXPECT_EQ(policy().state().retries, 1u);
  EXPECT_EQ(held(), 30 * MiB);
  policy().deallocate(b, 30 * MiB);
}

TEST_F(caching_small_device_test, without_release_on_oom_the_cache_is_kept) {
  cfg_.release_on_oom = false;
  void* a = policy().allocate(12 * MiB);
  policy().deallocate(a, 12 * MiB);
  EXPECT_THROW((void)policy().allocate(30 * MiB), out_of_memory);
  EXPECT_EQ(held(), 12 * MiB);
  EXPECT_EQ(policy().state().retries, 0u);
}

TEST_F(caching_small_device_test, a_request_that_cannot_fit_throws_and_leaves_the_policy_usable) {
  void* a = policy().allocate(30 * MiB);
  void* s = policy().allocate(4096);
  policy().deallocate(s, 4096);
  try {
    (void)policy().allocate(20 * MiB);
    FAIL() << "expected out_of_memory";
  } catch (const out_of_memory& e) {
    EXPECT_EQ(e.details().requested, 20 * MiB);
    EXPECT_EQ(e.details().reserved, 30 * MiB);  // the free small segment was released
    EXPECT_EQ(e.details().cached_free, 0u);
    EXPECT_EQ(e.details().largest_free_block, 0u);
    EXPECT_EQ(e.details().device_total, 40 * MiB);
    const std::string what = e.what();
    EXPECT_THAT(what, HasSubstr("20971520 bytes"));
    EXPECT_THAT(what, HasSubstr("reserved"));
    EXPECT_THAT(what, HasSubstr("free in cache"));
    EXPECT_THAT(what, HasSubstr("largest free block"));
  }
  EXPECT_EQ(policy().state().retries, 0u);
  void* small = policy().allocate(4096);
  EXPECT_NE(small, nullptr);
  policy().deallocate(small, 4096);
  policy().deallocate(a, 30 * MiB);
  void* c = policy().allocate(36 * MiB);  // fits once both free segments are gone
  EXPECT_EQ(policy().state().retries, 1u);
  EXPECT_EQ(held(), 36 * MiB);
  policy().deallocate(c, 36 * MiB);
}

TEST_F(caching_test, frees_of_foreign_or_dead_pointers_are_not_owned) {
  void* a = policy().allocate(4096);
  const free_result foreign = policy().try_deallocate(static_cast<char*>(a) + 512, 4096);
  EXPECT_EQ(foreign.status, free_status::not_owned);
  const free_result first = policy().try_deallocate(a, 4096);
  EXPECT_EQ(first.status, free_status::ok);
  EXPECT_EQ(first.bytes, 4096u);
  const free_result second = policy().try_deallocate(a, 4096);
  EXPECT_EQ(second.status, free_status::not_owned);
  EXPECT_EQ(policy().state().allocated, 0u);
}

TEST_F(caching_test, a_wrong_size_is_reported_and_the_block_still_freed) {
  void* a = policy().allocate(1000);
  const free_result rounded = policy().try_deallocate(a, 1024);  // the rounded size is accepted
  EXPECT_EQ(rounded.status, free_status::ok);
  void* b = policy().allocate(1000);
  const free_result wrong = policy().try_deallocate(b, 3000);
  EXPECT_EQ(wrong.status, free_status::size_mismatch);
  EXPECT_EQ(wrong.bytes, 1000u);
  EXPECT_EQ(policy().state().allocated, 0u);
  EXPECT_EQ(policy().live_blocks(), 0u);
}

TEST_F(caching_test, destruction_returns_every_segment_even_with_live_blocks) {
  void* a = policy().allocate(4096);
  void* b = policy().allocate(12 * MiB);
  (void)policy().allocate(30 * MiB);
  policy().deallocate(b, 12 * MiB);
  EXPECT_NE(a, nullptr);
  EXPECT_EQ(sim_.live().allocations, 3u);
  policy_.reset();
  EXPECT_EQ(sim_.live().allocations, 0u);
  EXPECT_EQ(sim_.counters().held_bytes, 0u);
}

TEST_F(caching_test, rejects_a_zero_segment_rounding) {
  cfg_.segment_round = 0;
  EXPECT_THROW({ caching_policy p(cfg_, sim_); }, invalid_argument);
}

}  // namespace
}  // namespace fragctl
