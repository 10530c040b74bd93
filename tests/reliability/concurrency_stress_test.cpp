// Concurrency stress: 16 threads on 4 streams hammer each policy through
// thread_safe_adaptor, with a checker that sees every block (docs/
// reliability.md, "Concurrency stress").
//
// Each thread allocates on its stream, frees on its stream or another one,
// and hands some blocks to another thread, which frees them (a cross-thread,
// often cross-stream free). Work is queued on the streams and a completer
// thread finishes it now and then, so stream-ordered frees really wait. The
// checker holds every live block's range: a block handed out twice, or
// overlapping a live one, is a duplicated block. At the end every block was
// freed exactly once: nothing is allocated, no misuse was counted, and once
// the policy is gone the device holds nothing (no lost block). In the backed
// run each thread writes its id into its blocks and checks it before the
// free, which catches two owners of the same memory. The operation count
// (allocations plus frees) is at least 10^6 over all policies; under
// ThreadSanitizer a quarter of that, to keep the run short
// (FRAGCTL_STRESS_OPS sets it per policy).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fragctl/adaptors.hpp"
#include "fragctl/log.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/sim_backend.hpp"
#include "fuzz/harness/alloc_sequence.hpp"
#include "fuzz/harness/policy_cases.hpp"

#if defined(__SANITIZE_THREAD__)
#define FRAGCTL_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FRAGCTL_UNDER_TSAN 1
#endif
#endif

namespace fragctl::fuzz {
namespace {

constexpr int thread_count = 16;
constexpr int stream_count = 4;

std::size_t operations_per_policy() {
  if (const char* v = std::getenv("FRAGCTL_STRESS_OPS")) return std::strtoull(v, nullptr, 10);
#ifdef FRAGCTL_UNDER_TSAN
  return std::size_t{1} << 15;
#else
  return std::size_t{1} << 17;  // 9 policies: 1.18 million operations
#endif
}

// Live ranges of every thread's blocks.
class checker {
 public:
  void acquired(void* p, std::size_t n) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    const std::lock_guard lock(mutex_);
    auto next = live_.lower_bound(a);
    const bool overlaps = (next != live_.end() && next->first < a + n) ||
                          (next != live_.begin() && std::prev(next)->second > a);
    if (overlaps) {
      ++duplicates_;
      return;
    }
    live_.emplace(a, a + n);
  }
  void released(void* p) {
    const std::lock_guard lock(mutex_);
    if (live_.erase(reinterpret_cast<std::uintptr_t>(p)) == 0) ++unknown_;
  }
  [[nodiscard]] std::size_t duplicates() const { return duplicates_; }
  [[nodiscard]] std::size_t unknown() const { return unknown_; }
  [[nodiscard]] std::size_t live() const { return live_.size(); }

 private:
  std::mutex mutex_;
  std::map<std::uintptr_t, std::uintptr_t> live_;
  std::size_t duplicates_ = 0;
  std::size_t unknown_ = 0;
};

struct block {
  void* p = nullptr;
  std::size_t n = 0;
  std::uint64_t tag = 0;  // owner id written into the block (backed)
};

// Blocks one thread hands to another, which frees them.
class mailbox {
 public:
  void put(const block& b) {
    const std::lock_guard lock(mutex_);
    blocks_.push_back(b);
  }
  bool take(block& b) {
    const std::lock_guard lock(mutex_);
    if (blocks_.empty()) return false;
    b = blocks_.back();
    blocks_.pop_back();
    return true;
  }

 private:
  std::mutex mutex_;
  std::vector<block> blocks_;
};

std::size_t pick_size(std::mt19937_64& rng) {
  switch (rng() % 8) {
    case 0: return 1 + rng() % 512;
    case 1: case 2: case 3: return 512 + rng() % (64 * KiB);
    case 4: case 5: return 64 * KiB + rng() % MiB;
    case 6: return MiB + rng() % (4 * MiB);
    default: return 4 * MiB + rng() % (12 * MiB);
  }
}

struct stress_result {
  std::uint64_t operations = 0;
  std::size_t duplicates = 0;
  std::size_t unknown = 0;
  std::size_t corrupted = 0;
  std::size_t ooms = 0;
};

stress_result hammer(const policy_case& pc, bool backed, std::size_t operations) {
  sim_options options;
  options.backed = backed;
  options.capacity = backed ? 1 * GiB : 64 * GiB;
  options.virtual_memory = pc.virtual_memory;
  options.manual_completion = true;
  auto cfg = parse_config(pc.conf);
  EXPECT_TRUE(cfg.ok());
  sim_backend sim(options);
  std::vector<stream_t> streams{nullptr};
  for (int i = 1; i < stream_count; ++i) streams.push_back(sim.create_stream());

  stress_result result;
  {
    thread_safe_adaptor shared(make_policy(pc.expression, *cfg, sim));
    checker live;
    std::vector<mailbox> mail(thread_count);
    std::atomic<std::uint64_t> operations_done{0};
    std::atomic<std::size_t> corrupted{0};
    std::atomic<std::size_t> ooms{0};
    std::atomic<bool> done{false};
    std::atomic<int> finished{0};
    const std::uint64_t per_thread = operations / thread_count;
    // The "GPU": finishes queued work now and then.
    std::thread completer([&] {
      while (!done.load()) {
        sim.complete_all();
        std::this_thread::yield();
      }
    });

    std::vector<std::thread> threads;
    for (int id = 0; id < thread_count; ++id) {
      threads.emplace_back([&, id] {
        std::mt19937_64 rng(7919 * (id + 1));
        const stream_t mine = streams[id % stream_count];
        std::vector<block> held;
        std::uint64_t ops = 0;
        std::uint64_t serial = 0;
        block b_after;
        const auto release = [&](const block& b, stream_t on) {
          if (backed && b.n >= sizeof b.tag) {
            std::uint64_t seen = 0;
            std::memcpy(&seen, b.p, sizeof seen);
            if (seen != b.tag) corrupted.fetch_add(1);
          }
          live.released(b.p);
          shared.deallocate(b.p, b.n, on);
          ++ops;
        };
        while (ops < per_thread) {
          block b;
          if (mail[id].take(b)) {
            release(b, mine);  // freed by another thread than the one that allocated it
            continue;
          }
          const auto dice = rng() % 16;
          if (held.size() < 24 && (held.empty() || dice < 8)) {
            b.n = pick_size(rng);
            try {
              b.p = shared.allocate(b.n, mine);
            } catch (const std::bad_alloc&) {
              ooms.fetch_add(1);
              continue;
            }
            ++ops;
            live.acquired(b.p, b.n);
            b.tag = (std::uint64_t{static_cast<std::uint32_t>(id)} << 40) | ++serial;
            if (backed && b.n >= sizeof b.tag) std::memcpy(b.p, &b.tag, sizeof b.tag);
            if (dice % 4 == 0) sim.submit(mine);  // work that uses the block
            held.push_back(b);
          } else if (dice < 13 || held.size() >= 24) {
            const std::size_t i = rng() % held.size();
            b = held[i];
            held[i] = held.back();
            held.pop_back();
            release(b, dice == 12 ? streams[rng() % stream_count] : mine);
          } else {
            const std::size_t i = rng() % held.size();
            mail[(id + 1 + rng() % (thread_count - 1)) % thread_count].put(held[i]);
            held[i] = held.back();
            held.pop_back();
          }
        }
        for (const block& h : held) release(h, mine);
        // Keep freeing what others hand over until every thread is done:
        // blocks stranded in a finished thread's mailbox would otherwise
        // hold the device, and a thread still running with nothing to free
        // would retry its failing allocation for ever (seen under ASan, once).
        finished.fetch_add(1);
        while (finished.load() < thread_count) {
          if (mail[id].take(b_after)) {
            release(b_after, mine);
          } else {
            std::this_thread::yield();
          }
        }
        operations_done.fetch_add(ops);
      });
    }
    for (std::thread& t : threads) t.join();
    // Blocks still in a mailbox: their receivers stopped; free them here.
    for (mailbox& m : mail) {
      block b;
      while (m.take(b)) {
        live.released(b.p);
        shared.deallocate(b.p, b.n, streams[0]);
        operations_done.fetch_add(1);
      }
    }
    done.store(true);
    completer.join();

    result.operations = operations_done.load();
    result.duplicates = live.duplicates();
    result.unknown = live.unknown();
    result.corrupted = corrupted.load();
    result.ooms = ooms.load();
    EXPECT_EQ(live.live(), 0U);
    EXPECT_EQ(shared.state().allocated, 0U) << "allocated bytes left with every block freed";
    EXPECT_EQ(shared.misuse().not_owned, 0U) << "a block was freed twice or never handed out";
    EXPECT_EQ(shared.misuse().size_mismatch, 0U);
    shared.release_cached();
  }
  for (int i = 1; i < stream_count; ++i) sim.destroy_stream(streams[static_cast<std::size_t>(i)]);
  EXPECT_NO_THROW(check_device_empty(sim, "after the policy was destroyed")) << "a block or handle was lost";
  return result;
}

class concurrency_stress : public ::testing::TestWithParam<policy_case> {
 protected:
  void SetUp() override { set_log_level("error"); }
  void TearDown() override { set_log_level("warn"); }
};

TEST_P(concurrency_stress, sixteen_threads_four_streams_lose_and_duplicate_nothing) {
  const std::size_t operations = operations_per_policy();
  const stress_result r = hammer(GetParam(), /*backed=*/false, operations);
  EXPECT_GE(r.operations, operations);
  EXPECT_EQ(r.duplicates, 0U) << "a block was handed to two owners at once";
  EXPECT_EQ(r.unknown, 0U);
  EXPECT_EQ(r.ooms, 0U);
}

TEST_P(concurrency_stress, owners_data_survives_in_backed_memory) {
  const std::size_t operations = operations_per_policy() / 8;
  const stress_result r = hammer(GetParam(), /*backed=*/true, operations);
  EXPECT_GE(r.operations, operations);
  EXPECT_EQ(r.duplicates, 0U);
  EXPECT_EQ(r.corrupted, 0U) << "a block's data was overwritten while its owner held it";
}

INSTANTIATE_TEST_SUITE_P(policies, concurrency_stress, ::testing::ValuesIn(policy_cases),
                         [](const auto& test) { return std::string(test.param.name); });

}  // namespace
}  // namespace fragctl::fuzz
