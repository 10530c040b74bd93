// The conformance suite every policy and documented composition passes
// (DESIGN.md, "The four policies"; STYLE.md habit 8).
//
// A type-parameterized GoogleTest suite. Each instantiation is its own test
// program, a file of a few lines that includes this header once:
//
//   #include "conformance/conformance_suite.hpp"
//   struct caching_tag { static constexpr const char* expression = "caching"; };
//   INSTANTIATE_TYPED_TEST_SUITE_P(caching, conformance, caching_tag);
//
// A tag may also carry `static constexpr const char* conf` (FRAGCTL_CONF
// syntax), `static constexpr bool virtual_memory` (sim offers VM calls), and
// `static constexpr bool fixed_reservation = true` for a policy that holds one
// pre-reserved block for its life (the arena's fallback without VM), whose
// release_cached cannot return memory while any block is live, and
// `static constexpr bool reuses_in_place = false` for one that may place a
// block freed and asked for again on the same stream elsewhere (warmup over
// arena carves from the far end of its pre-fill), and
// `static constexpr bool holds_memory = true` for one that gives no memory
// back to the device until it is destroyed (graph_pool: graphs may replay
// into it), so that neither release_cached nor out-of-memory returns any.
//
// Everything runs on the sim backend: accounting mode for long sequences
// checked against an interval model, backed mode where tests write patterns
// through the pointers, manual completion for the stream-order rule.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fragctl/adaptors.hpp"
#include "fragctl/config.hpp"
#include "fragctl/device_allocator.hpp"
#include "fragctl/error.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/sim_backend.hpp"

namespace fragctl::testing {

/// A sim backend and a bare policy chain on it; the policy dies first.
struct policy_under_test {
  std::unique_ptr<sim_backend> backend;
  std::unique_ptr<device_allocator> allocator;

  policy_under_test() = default;
  policy_under_test(policy_under_test&&) = default;
  policy_under_test& operator=(policy_under_test&&) = default;
  ~policy_under_test() { allocator.reset(); }
};

/// Live blocks as half-open address intervals; rejects overlaps.
class interval_model {
 public:
  /// Adds [p, p + n); false if it overlaps a live interval.
  bool insert(std::uintptr_t p, std::size_t n) {
    auto next = live_.lower_bound(p);
    if (next != live_.end() && next->first < p + n) return false;
    if (next != live_.begin() && std::prev(next)->second > p) return false;
    live_.emplace(p, p + n);
    return true;
  }
  void erase(std::uintptr_t p) { live_.erase(p); }
  [[nodiscard]] bool overlaps(std::uintptr_t p, std::size_t n) const {
    auto next = live_.lower_bound(p);
    if (next != live_.end() && next->first < p + n) return true;
    return next != live_.begin() && std::prev(next)->second > p;
  }

 private:
  std::map<std::uintptr_t, std::uintptr_t> live_;
};

/// Log-uniform size in [lo, hi].
inline std::size_t log_uniform(std::mt19937_64& rng, std::size_t lo, std::size_t hi) {
  std::uniform_real_distribution<double> d(std::log2(static_cast<double>(lo)),
                                           std::log2(static_cast<double>(hi)));
  return std::clamp(static_cast<std::size_t>(std::exp2(d(rng))), lo, hi);
}

/// Fills a block's first and last bytes (up to 4 KiB each) with a pattern of `id`.
inline void stamp(void* p, std::size_t n, std::uint8_t id) {
  const std::size_t edge = std::min<std::size_t>(n, 4096);
  std::memset(p, id, edge);
  std::memset(static_cast<char*>(p) + n - edge, id, edge);
}

/// True when stamp(p, n, id) is still intact.
inline bool stamped(const void* p, std::size_t n, std::uint8_t id) {
  const std::size_t edge = std::min<std::size_t>(n, 4096);
  const auto* b = static_cast<const std::uint8_t*>(p);
  for (std::size_t i = 0; i < edge; ++i) {
    if (b[i] != id || b[n - edge + i] != id) return false;
  }
  return true;
}

}  // namespace fragctl::testing

template <class Tag>
class conformance : public ::testing::Test {
 protected:
  /// Builds the tag's policy over a fresh sim backend.
  static fragctl::testing::policy_under_test make(fragctl::sim_options options) {
    if constexpr (requires { Tag::virtual_memory; }) options.virtual_memory = Tag::virtual_memory;
    std::string conf;
    if constexpr (requires { Tag::conf; }) conf = Tag::conf;
    auto cfg = fragctl::parse_config(conf);
    EXPECT_TRUE(cfg.ok()) << cfg.status();
    fragctl::testing::policy_under_test t;
    t.backend = std::make_unique<fragctl::sim_backend>(options);
    t.allocator = fragctl::make_policy(Tag::expression, *cfg, *t.backend);
    return t;
  }
  static fragctl::sim_options accounting(std::size_t capacity = 8 * fragctl::GiB) {
    fragctl::sim_options o;
    o.capacity = capacity;
    return o;
  }
  static fragctl::sim_options backed(std::size_t capacity = 512 * fragctl::MiB) {
    fragctl::sim_options o;
    o.capacity = capacity;
    o.backed = true;
    return o;
  }

  static void end_a_stream_the_allocator_met(bool announce) {
    fragctl::sim_options options = accounting();
    options.manual_completion = true;
    auto t = make(options);
    fragctl::stream_t s = t.backend->create_stream();
    fragctl::stream_t other = t.backend->create_stream();
    std::vector<std::pair<void*, std::size_t>> live_on_s;
    for (std::size_t n : {std::size_t{4096}, 3 * fragctl::MiB, 64 * fragctl::MiB}) {
      void* cached = t.allocator->allocate(n, s);
      live_on_s.emplace_back(t.allocator->allocate(n, s), n);
      void* of_default = t.allocator->allocate(n, nullptr);
      void* of_s = t.allocator->allocate(n, s);
      t.backend->submit(s);
      t.backend->submit(other);
      t.allocator->deallocate(cached, n, s);
      t.allocator->deallocate(of_default, n, s);
      t.allocator->deallocate(of_s, n, other);
    }
    fragctl::event_t queued = t.backend->create_event();
    t.backend->record_event(queued, s);
    if (announce) {
      t.allocator->stream_ending(s);
      EXPECT_TRUE(t.backend->query_event(queued)) << "stream_ending returned before the stream's work was done";
    }
    t.backend->destroy_stream(s);
    t.backend->complete_all();
    t.backend->destroy_event(queued);
    // The program goes on without the stream: it frees what was allocated on
    // it, allocates on the streams it has, trims, and ends.
    try {
      for (const auto& [p, n] : live_on_s) t.allocator->deallocate(p, n, nullptr);
      for (std::size_t n : {std::size_t{4096}, 3 * fragctl::MiB, 64 * fragctl::MiB}) {
        for (fragctl::stream_t on : {static_cast<fragctl::stream_t>(nullptr), other}) {
          void* p = t.allocator->allocate(n, on);
          t.allocator->deallocate(p, n, on);
        }
      }
      t.allocator->release_cached();
    } catch (const fragctl::backend_error& e) {
      // The sim refuses the destroyed handle (counted below); CUDA may crash.
      EXPECT_FALSE(announce) << e.what();
    }
    t.allocator.reset();
    t.backend->destroy_stream(other);
    if (announce) {
      EXPECT_EQ(t.backend->destroyed_stream_calls(), 0U) << "the allocator named a stream after stream_ending";
    } else {
      EXPECT_GT(t.backend->destroyed_stream_calls(), 0U)
          << "the control: without stream_ending the allocator names the destroyed stream";
    }
  }
};

TYPED_TEST_SUITE_P(conformance);

using fragctl::GiB;
using fragctl::KiB;
using fragctl::MiB;

TYPED_TEST_P(conformance, zero_bytes_gives_null_and_freeing_null_is_a_no_op) {
  auto t = this->make(this->accounting());
  EXPECT_EQ(t.allocator->allocate(0), nullptr);
  t.allocator->deallocate(nullptr, 0);
  EXPECT_EQ(t.allocator->try_deallocate(nullptr, 0).status, fragctl::free_status::ok);
  EXPECT_EQ(t.allocator->state().allocated, 0U);
}

TYPED_TEST_P(conformance, pointers_are_aligned_and_sizes_rounded) {
  auto t = this->make(this->accounting());
  for (std::size_t n : {std::size_t{1}, std::size_t{511}, std::size_t{512}, std::size_t{513},
                        std::size_t{4096}, MiB - 1, MiB + 1, 3 * MiB + 7, 100 * MiB + 3}) {
    void* p = t.allocator->allocate(n);
    ASSERT_NE(p, nullptr) << n;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % fragctl::min_alignment, 0U) << n;
    const std::size_t rounded = t.allocator->allocation_size(n);
    EXPECT_GE(rounded, n);
    EXPECT_EQ(rounded % fragctl::min_alignment, 0U) << n;
    t.allocator->deallocate(p, n);
  }
  EXPECT_EQ(t.allocator->state().allocated, 0U);
}

TYPED_TEST_P(conformance, oversized_requests_are_invalid_not_out_of_memory) {
  auto t = this->make(this->accounting());
  EXPECT_THROW((void)t.allocator->allocate(SIZE_MAX), fragctl::invalid_argument);
  EXPECT_THROW((void)t.allocator->allocate(std::size_t{1} << 63), fragctl::invalid_argument);
}

TYPED_TEST_P(conformance, random_sequence_matches_interval_model) {
  auto t = this->make(this->accounting());
  fragctl::testing::interval_model model;
  std::mt19937_64 rng(2);
  struct block {
    void* p;
    std::size_t n;
  };
  std::vector<block> live;
  std::size_t allocated = 0;
  for (int step = 0; step < 20000; ++step) {
    // At most 300 live blocks (about 1 GiB): the test is about placement, not capacity.
    if (live.empty() || (live.size() < 300 && rng() % 100 < 55)) {
      const std::size_t n = fragctl::testing::log_uniform(rng, 1, 64 * MiB);
      void* p = t.allocator->allocate(n);
      ASSERT_TRUE(model.insert(reinterpret_cast<std::uintptr_t>(p), n))
          << "block of " << n << " bytes overlaps a live block at step " << step;
      live.push_back({p, n});
      allocated += t.allocator->allocation_size(n);
    } else {
      const std::size_t i = rng() % live.size();
      model.erase(reinterpret_cast<std::uintptr_t>(live[i].p));
      ASSERT_EQ(t.allocator->try_deallocate(live[i].p, live[i].n).status, fragctl::free_status::ok);
      allocated -= t.allocator->allocation_size(live[i].n);
      live[i] = live.back();
      live.pop_back();
    }
    if (step % 1000 == 0) {
      const fragctl::pool_state s = t.allocator->state();
      ASSERT_EQ(s.allocated, allocated) << "at step " << step;
      ASSERT_GE(s.reserved, s.allocated);
    }
  }
  for (const block& b : live) t.allocator->deallocate(b.p, b.n);
  EXPECT_EQ(t.allocator->state().allocated, 0U);
  EXPECT_EQ(t.allocator->misuse().not_owned + t.allocator->misuse().size_mismatch, 0U);
}

TYPED_TEST_P(conformance, live_blocks_keep_their_data) {
  auto t = this->make(this->backed());
  std::mt19937_64 rng(3);
  struct block {
    void* p;
    std::size_t n;
    std::uint8_t id;
  };
  std::vector<block> live;
  std::uint8_t next_id = 1;
  for (int step = 0; step < 3000; ++step) {
    if (live.empty() || rng() % 100 < 55) {
      const std::size_t n = fragctl::testing::log_uniform(rng, 1, 8 * MiB);
      void* p = t.allocator->allocate(n);
      fragctl::testing::stamp(p, n, next_id);
      live.push_back({p, n, next_id});
      next_id = static_cast<std::uint8_t>(next_id % 250 + 1);
    } else {
      const std::size_t i = rng() % live.size();
      ASSERT_TRUE(fragctl::testing::stamped(live[i].p, live[i].n, live[i].id))
          << "block of " << live[i].n << " bytes was overwritten by another block";
      t.allocator->deallocate(live[i].p, live[i].n);
      live[i] = live.back();
      live.pop_back();
    }
    if (step % 500 == 499) t.allocator->release_cached();
  }
  for (const block& b : live) {
    EXPECT_TRUE(fragctl::testing::stamped(b.p, b.n, b.id));
    t.allocator->deallocate(b.p, b.n);
  }
}

TYPED_TEST_P(conformance, stream_order_rule_holds_across_streams) {
  fragctl::sim_options options = this->accounting();
  options.manual_completion = true;
  auto t = this->make(options);
  fragctl::stream_t s = t.backend->create_stream();
  fragctl::stream_t other = t.backend->create_stream();
  for (std::size_t n : {std::size_t{4096}, 3 * MiB, 64 * MiB}) {
    void* p = t.allocator->allocate(n, s);
    t.backend->submit(s);  // work that uses p, queued on s, not completed
    t.allocator->deallocate(p, n, s);
    void* q = t.allocator->allocate(n, other);
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    const auto b = reinterpret_cast<std::uintptr_t>(q);
    EXPECT_TRUE(b + n <= a || a + n <= b)
        << "a block freed on one stream went to another before the first stream's work completed";
    t.allocator->deallocate(q, n, other);
    t.backend->complete_all();
    // Once the work completed, memory may move between streams; all of it is usable.
    void* r = t.allocator->allocate(n, other);
    EXPECT_NE(r, nullptr);
    t.allocator->deallocate(r, n, other);
  }
  t.allocator->release_cached();
  t.allocator.reset();
  t.backend->destroy_stream(s);
  t.backend->destroy_stream(other);
}

// A block freed on another stream than the one it was allocated on (the
// freeing stream used it last, as after record_stream) is not handed out
// again, not even on its own stream, before the work queued on the freeing
// stream has completed. The control: freed on its own stream, the same
// allocator hands the same block out again at once.
TYPED_TEST_P(conformance, block_freed_on_another_stream_waits_for_that_stream) {
  constexpr bool in_place = [] {
    if constexpr (requires { TypeParam::reuses_in_place; }) return TypeParam::reuses_in_place;
    return true;
  }();
  fragctl::sim_options options = this->accounting();
  options.manual_completion = true;
  for (std::size_t n : {std::size_t{4096}, 3 * MiB, 64 * MiB}) {
    auto t = this->make(options);
    fragctl::stream_t a = t.backend->create_stream();
    fragctl::stream_t b = t.backend->create_stream();
    void* p = t.allocator->allocate(n, a);
    t.allocator->deallocate(p, n, a);
    void* again = t.allocator->allocate(n, a);
    if (in_place) {
      EXPECT_EQ(again, p) << n << " bytes: a block freed on its own stream is reused there at once";
    }

    t.backend->submit(b);  // work on b that uses the block, not completed
    t.allocator->deallocate(again, n, b);
    void* q = t.allocator->allocate(n, a);
    const auto x = reinterpret_cast<std::uintptr_t>(again);
    const auto y = reinterpret_cast<std::uintptr_t>(q);
    EXPECT_TRUE(y + n <= x || x + n <= y)
        << n << " bytes: a block freed on stream b went back to stream a before b's work completed";
    t.backend->complete_all();
    t.allocator->deallocate(q, n, a);
    t.allocator->release_cached();
    t.allocator.reset();
    t.backend->destroy_stream(a);
    t.backend->destroy_stream(b);
  }
}

// A stream its owner destroys: the allocator met it every way a policy
// can (blocks cached on it, a live block allocated on it, a block of the
// default stream freed on it, a block of it freed on another stream, in
// small, medium and large sizes). stream_ending(s) waits for its work, and
// from then on nothing the allocator does (frees, reuse on other streams,
// release_cached, destruction) names the destroyed handle, which on CUDA
// may end the process. The control runs the same program without the call:
// the sim sees the allocator name the destroyed stream.
TYPED_TEST_P(conformance, a_stream_that_ends_is_never_named_again) {
  this->end_a_stream_the_allocator_met(/*announce=*/true);
  this->end_a_stream_the_allocator_met(/*announce=*/false);
}

TYPED_TEST_P(conformance, same_stream_reuse_needs_no_backend_memory_call) {
  auto t = this->make(this->accounting());
  fragctl::stream_t s = t.backend->create_stream();
  void* warm = t.allocator->allocate(6 * MiB, s);
  t.allocator->deallocate(warm, 6 * MiB, s);
  const std::uint64_t before = t.backend->counters().memory_calls();
  for (int i = 0; i < 100; ++i) {
    void* p = t.allocator->allocate(6 * MiB, s);
    t.allocator->deallocate(p, 6 * MiB, s);
  }
  EXPECT_EQ(t.backend->counters().memory_calls(), before);
  t.allocator.reset();
  t.backend->destroy_stream(s);
}

TYPED_TEST_P(conformance, out_of_memory_is_reported_and_leaves_allocator_usable) {
  auto t = this->make(this->accounting(256 * MiB));
  std::vector<void*> live;
  bool threw = false;
  for (int i = 0; i < 64 && !threw; ++i) {
    try {
      live.push_back(t.allocator->allocate(16 * MiB));
    } catch (const fragctl::out_of_memory& e) {
      threw = true;
      const std::string what = e.what();
      EXPECT_NE(what.find("out of memory"), std::string::npos) << what;
      EXPECT_NE(what.find("reserved"), std::string::npos) << what;
      EXPECT_NE(what.find("largest free block"), std::string::npos) << what;
      EXPECT_EQ(e.details().requested, 16 * MiB);
    }
  }
  ASSERT_TRUE(threw) << "256 MiB device held 64 blocks of 16 MiB";
  EXPECT_THROW((void)t.allocator->allocate(GiB), std::bad_alloc);
  for (void* p : live) t.allocator->deallocate(p, 16 * MiB);
  if constexpr (requires { TypeParam::holds_memory; }) {
    // The freed blocks stay in the pool, reusable there.
    void* again = t.allocator->allocate(16 * MiB);
    EXPECT_NE(again, nullptr);
    t.allocator->deallocate(again, 16 * MiB);
  } else {
    // Everything came back: the whole device can be used again.
    void* big = t.allocator->allocate(128 * MiB);
    EXPECT_NE(big, nullptr);
    t.allocator->deallocate(big, 128 * MiB);
  }
  t.allocator.reset();
  const auto live_objects = t.backend->live();
  EXPECT_EQ(live_objects.allocations + live_objects.physical + live_objects.mappings, 0U);
}

TYPED_TEST_P(conformance, injected_backend_failures_never_corrupt) {
  for (auto target : {fragctl::sim_fault_target::allocate, fragctl::sim_fault_target::create_physical,
                      fragctl::sim_fault_target::map, fragctl::sim_fault_target::set_access}) {
    for (std::uint64_t nth = 1; nth <= 4; ++nth) {
      auto t = this->make(this->backed(1 * GiB));
      t.backend->fail_nth(target, nth);
      std::vector<std::pair<void*, std::size_t>> live;
      std::mt19937_64 rng(nth);
      int failures = 0;
      for (int i = 0; i < 200; ++i) {
        const std::size_t n = fragctl::testing::log_uniform(rng, 512, 12 * MiB);
        try {
          void* p = t.allocator->allocate(n);
          fragctl::testing::stamp(p, n, static_cast<std::uint8_t>(live.size() % 250 + 1));
          live.emplace_back(p, n);
        } catch (const std::bad_alloc&) {
          ++failures;
        }
        if (live.size() > 12) {
          const auto [p, m] = live.front();
          t.allocator->deallocate(p, m);
          live.erase(live.begin());
        }
      }
      EXPECT_LE(failures, 1) << "one injected failure made several allocations fail";
      for (const auto& [p, m] : live) t.allocator->deallocate(p, m);
      EXPECT_EQ(t.allocator->state().allocated, 0U);
      t.allocator.reset();
      const auto objects = t.backend->live();
      EXPECT_EQ(objects.allocations + objects.physical + objects.mappings + objects.reservations, 0U)
          << "leak after an injected failure";
    }
  }
}

TYPED_TEST_P(conformance, misuse_is_reported_without_corruption) {
  auto t = this->make(this->backed());
  void* a = t.allocator->allocate(4096);
  void* b = t.allocator->allocate(3 * MiB);
  fragctl::testing::stamp(b, 3 * MiB, 7);
  int local = 0;
  EXPECT_EQ(t.allocator->try_deallocate(&local, 4096).status, fragctl::free_status::not_owned);
  EXPECT_EQ(t.allocator->try_deallocate(static_cast<char*>(b) + 512, 4096).status,
            fragctl::free_status::not_owned);
  EXPECT_EQ(t.allocator->try_deallocate(a, 4096).status, fragctl::free_status::ok);
  EXPECT_EQ(t.allocator->try_deallocate(a, 4096).status, fragctl::free_status::not_owned);
  t.allocator->deallocate(a, 4096);  // double free through the reporting path
  EXPECT_EQ(t.allocator->misuse().not_owned, 1U);
  EXPECT_TRUE(fragctl::testing::stamped(b, 3 * MiB, 7));
  const fragctl::free_result wrong = t.allocator->try_deallocate(b, 5 * MiB);
  EXPECT_EQ(wrong.status, fragctl::free_status::size_mismatch);
  EXPECT_EQ(wrong.bytes, 3 * MiB);
  EXPECT_EQ(t.allocator->state().allocated, 0U);
  EXPECT_EQ(t.allocator->try_deallocate(b, 3 * MiB).status, fragctl::free_status::not_owned);
}

// check_free answers what the free will find: for every free of a random
// sequence (a wrong size one time in five), an interior pointer, a freed
// pointer and a foreign one, the answer equals the free's own result.
TYPED_TEST_P(conformance, check_free_answers_what_the_free_finds) {
  auto t = this->make(this->accounting());
  std::mt19937_64 rng(5);
  struct block {
    void* p;
    std::size_t n;
  };
  std::vector<block> live;
  std::vector<void*> freed;
  std::size_t wrong_sizes = 0;
  const auto same = [](const std::optional<fragctl::free_result>& a, const fragctl::free_result& b) {
    return a && a->status == b.status && a->bytes == b.bytes;
  };
  for (int step = 0; step < 4000; ++step) {
    if (live.empty() || (live.size() < 200 && rng() % 100 < 55)) {
      const std::size_t n = fragctl::testing::log_uniform(rng, 1, 16 * MiB);
      live.push_back({t.allocator->allocate(n), n});
      continue;
    }
    const std::size_t i = rng() % live.size();
    const block b = live[i];
    live[i] = live.back();
    live.pop_back();
    const std::optional<fragctl::free_result> interior = t.allocator->check_free(static_cast<char*>(b.p) + 1, b.n);
    ASSERT_TRUE(interior && interior->status == fragctl::free_status::not_owned) << "interior pointer at step " << step;
    std::size_t n = b.n;
    if (rng() % 5 == 0) {
      n = fragctl::testing::log_uniform(rng, 1, 16 * MiB);
      ++wrong_sizes;
    }
    const std::optional<fragctl::free_result> judged = t.allocator->check_free(b.p, n);
    const fragctl::free_result result = t.allocator->try_deallocate(b.p, n);
    ASSERT_TRUE(same(judged, result)) << "step " << step << ": check_free answered "
                                      << (judged ? static_cast<int>(judged->status) : -1) << " for a free that found "
                                      << static_cast<int>(result.status);
    ASSERT_NE(result.status, fragctl::free_status::not_owned);
    freed.push_back(b.p);
  }
  ASSERT_GT(wrong_sizes, 100U);
  // Freed pointers whose address no live block took again, and a foreign one.
  std::size_t checked = 0;
  for (void* p : freed) {
    if (std::any_of(live.begin(), live.end(), [&](const block& b) { return b.p == p; })) continue;
    const std::optional<fragctl::free_result> judged = t.allocator->check_free(p, 4096);
    ASSERT_TRUE(judged && judged->status == fragctl::free_status::not_owned);
    ++checked;
  }
  EXPECT_GT(checked, 100U);
  int local = 0;
  const std::optional<fragctl::free_result> foreign = t.allocator->check_free(&local, 4096);
  EXPECT_TRUE(foreign && foreign->status == fragctl::free_status::not_owned);
  for (const block& b : live) t.allocator->deallocate(b.p, b.n);
  EXPECT_EQ(t.allocator->state().allocated, 0U);
}

TYPED_TEST_P(conformance, release_cached_keeps_live_blocks) {
  auto t = this->make(this->backed());
  void* keep = t.allocator->allocate(5 * MiB);
  fragctl::testing::stamp(keep, 5 * MiB, 42);
  std::vector<void*> drop;
  for (int i = 0; i < 16; ++i) drop.push_back(t.allocator->allocate(3 * MiB));
  for (void* p : drop) t.allocator->deallocate(p, 3 * MiB);
  const std::size_t before = t.allocator->state().reserved;
  t.allocator->release_cached();
  const fragctl::pool_state after = t.allocator->state();
  EXPECT_LE(after.reserved, before);
  EXPECT_GE(after.reserved, t.allocator->allocation_size(5 * MiB));
  if constexpr (requires { TypeParam::holds_memory; }) {
    EXPECT_EQ(after.reserved, before) << "a pool that holds its memory gave some back";
  } else if constexpr (!requires { TypeParam::fixed_reservation; }) {
    EXPECT_LT(after.reserved, before) << "release_cached returned nothing of 48 MiB of free blocks";
  }
  EXPECT_TRUE(fragctl::testing::stamped(keep, 5 * MiB, 42));
  t.allocator->deallocate(keep, 5 * MiB);
}

TYPED_TEST_P(conformance, threads_share_one_allocator_through_the_lock) {
  fragctl::testing::policy_under_test t = this->make(this->accounting());
  fragctl::thread_safe_adaptor shared(std::move(t.allocator));
  fragctl::testing::interval_model model;
  std::mutex model_mutex;
  std::atomic<int> overlaps{0};
  std::vector<std::thread> threads;
  for (int id = 0; id < 8; ++id) {
    threads.emplace_back([&, id] {
      std::mt19937_64 rng(100 + id);
      std::vector<std::pair<void*, std::size_t>> mine;
      for (int i = 0; i < 3000; ++i) {
        if (mine.empty() || rng() % 2 == 0) {
          const std::size_t n = fragctl::testing::log_uniform(rng, 1, 4 * MiB);
          void* p = shared.allocate(n);
          {
            std::lock_guard lock(model_mutex);
            if (!model.insert(reinterpret_cast<std::uintptr_t>(p), n)) ++overlaps;
          }
          mine.emplace_back(p, n);
        } else {
          const auto [p, n] = mine.back();
          mine.pop_back();
          {
            std::lock_guard lock(model_mutex);
            model.erase(reinterpret_cast<std::uintptr_t>(p));
          }
          shared.deallocate(p, n);
        }
      }
      for (const auto& [p, n] : mine) {
        {
          std::lock_guard lock(model_mutex);
          model.erase(reinterpret_cast<std::uintptr_t>(p));
        }
        shared.deallocate(p, n);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(shared.state().allocated, 0U);
  EXPECT_EQ(shared.misuse().not_owned, 0U);
}

REGISTER_TYPED_TEST_SUITE_P(conformance, zero_bytes_gives_null_and_freeing_null_is_a_no_op,
                            pointers_are_aligned_and_sizes_rounded,
                            oversized_requests_are_invalid_not_out_of_memory,
                            random_sequence_matches_interval_model, live_blocks_keep_their_data,
                            stream_order_rule_holds_across_streams,
                            block_freed_on_another_stream_waits_for_that_stream,
                            same_stream_reuse_needs_no_backend_memory_call,
                            a_stream_that_ends_is_never_named_again,
                            out_of_memory_is_reported_and_leaves_allocator_usable,
                            injected_backend_failures_never_corrupt,
                            misuse_is_reported_without_corruption, check_free_answers_what_the_free_finds,
                            release_cached_keeps_live_blocks,
                            threads_share_one_allocator_through_the_lock);
