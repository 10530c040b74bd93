// fork() while other threads use an allocator (docs/reliability.md, "Process
// lifecycle"; issue 27 M2): as malloc implementations keep the inherited heap
// usable, every lock an allocation takes is held across fork() by the forking
// thread, so a child inherits each allocator consistent and unlocked, whether
// or not it writes a report or a trace. Children only allocate and _Exit (no
// thread, no exit hook), so this program runs under ThreadSanitizer
// (tools/sanitize.sh thread), which also checks the order the fork handlers
// take the locks in against the order calls take them.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "core/passthrough_allocator.hpp"
#include "fragctl/adaptors.hpp"
#include "fragctl/allocator_stack.hpp"
#include "fragctl/sim_backend.hpp"
#include "gtest/gtest.h"
#include "util/fork_safe_mutex.hpp"

namespace fragctl {
namespace {

using namespace std::chrono_literals;

// Waits for `child` at most `bound`; a child still running then is killed and
// reported as hung (-1). Otherwise returns the raw wait status.
int wait_bounded(pid_t child, std::chrono::seconds bound) {
  const auto give_up = std::chrono::steady_clock::now() + bound;
  int status = 0;
  while (std::chrono::steady_clock::now() < give_up) {
    if (::waitpid(child, &status, WNOHANG) == child) return status;
    std::this_thread::sleep_for(1ms);
  }
  ::kill(child, SIGKILL);
  ::waitpid(child, &status, 0);
  return -1;
}

bool exited_zero(int status) { return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0; }

// Forks a child that runs `body` and _Exits with its result (0: success).
template <class Body>
int fork_and_wait(Body body) {
  const pid_t child = ::fork();
  if (child < 0) return -2;
  if (child == 0) std::_Exit(body());
  return wait_bounded(child, std::chrono::seconds(10));
}

// An adaptor whose first allocation stops inside the allocator (so inside
// the thread-safe adaptor's lock) until `release` is set.
class gate_adaptor final : public forwarding_adaptor {
 public:
  gate_adaptor(std::unique_ptr<device_allocator> upstream, std::atomic<bool>& inside, std::atomic<bool>& release)
      : forwarding_adaptor(std::move(upstream), "gate_adaptor"), inside_(inside), release_(release) {}

 private:
  void* do_allocate(std::size_t bytes, stream_t stream) override {
    if (!used_) {
      used_ = true;
      inside_ = true;
      while (!release_.load()) std::this_thread::sleep_for(1ms);
    }
    return upstream().allocate(bytes, stream);
  }

  std::atomic<bool>& inside_;
  std::atomic<bool>& release_;
  bool used_ = false;  // guarded by the thread-safe adaptor above
};

// Regression (issue 27 M2): a thread inside a thread-safe allocator that
// writes no report held its lock at fork, and the child's first allocation
// waited for ever. Deterministic: the parent thread is inside the allocator
// when fork() is called, and leaves it 200 ms later.
TEST(fork_safety, a_thread_inside_the_allocator_at_fork_leaves_the_child_a_usable_allocator) {
  sim_backend backend;
  std::atomic<bool> inside{false};
  std::atomic<bool> release{false};
  thread_safe_adaptor a(std::make_unique<gate_adaptor>(
      std::make_unique<fragctl::testing::passthrough_allocator>(backend), inside, release));
  std::thread holder([&] { a.deallocate(a.allocate(4096), 4096); });
  while (!inside.load()) std::this_thread::yield();
  std::thread releaser([&] {
    std::this_thread::sleep_for(200ms);
    release = true;
  });
  const int status = fork_and_wait([&] {
    void* p = a.allocate(1 * MiB);
    const bool ok = p != nullptr && a.try_deallocate(p, 1 * MiB).status == free_status::ok;
    return ok ? 0 : 1;
  });
  holder.join();
  releaser.join();
  EXPECT_NE(status, -1) << "the child hung on the allocator's lock, which a parent thread held at fork";
  EXPECT_TRUE(exited_zero(status)) << status;
  // Positive control: the parent's allocator works on.
  a.deallocate(a.allocate(4096), 4096);
}

// The leaf locks (the sim device's state, an allocator's OOM log) are
// util::fork_safe_mutex: one held by a parent thread at fork is free in the child.
TEST(fork_safety, a_leaf_lock_held_at_fork_is_free_in_the_child) {
  util::fork_safe_mutex m;
  std::atomic<bool> held{false};
  std::thread holder([&] {
    m.lock();
    held = true;
    std::this_thread::sleep_for(200ms);
    m.unlock();
  });
  while (!held.load()) std::this_thread::yield();
  const int status = fork_and_wait([&] {
    if (!m.try_lock()) return 1;
    m.unlock();
    return 0;
  });
  holder.join();
  EXPECT_TRUE(exited_zero(status)) << "the child found the lock taken (" << status << ")";
}

// The scenario, under load: a parent whose threads allocate, read
// statistics and query the sim device without pause forks 200 children;
// each allocates and frees through the inherited allocator (no report, no
// trace), reads its statistics and the device, and exits. Before: 9 to 14
// of 200 children hung.
TEST(fork_safety, children_of_a_parent_allocating_on_threads_all_allocate_and_exit) {
  config cfg;
  cfg.policy = "caching";
  cfg.sim_capacity = 1 * GiB;
  allocator_stack stack(std::make_unique<sim_backend>(sim_options{.capacity = cfg.sim_capacity}), cfg);
  device_allocator& a = stack.allocator();

  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (std::size_t i = 0; !stop.load(); ++i) {
        const std::size_t bytes = 512 * (1 + (i + static_cast<std::size_t>(t)) % 4096);
        a.deallocate(a.allocate(bytes), bytes);
      }
    });
  }
  threads.emplace_back([&] {
    while (!stop.load()) (void)stack.stats();
  });
  threads.emplace_back([&] {
    while (!stop.load()) (void)stack.backend().get_memory_info();
  });

  int hung = 0;
  int failed = 0;
  for (int i = 0; i < 200 && hung == 0; ++i) {
    const int status = fork_and_wait([&] {
      const std::uint64_t before = stack.stats().allocations;
      void* p = a.allocate(1 * MiB);
      const bool freed = a.try_deallocate(p, 1 * MiB).status == free_status::ok;
      const std::uint64_t after = stack.stats().allocations;
      const memory_info info = stack.backend().get_memory_info();
      return freed && after == before + 1 && info.total == 1 * GiB ? 0 : 1;
    });
    if (status == -1)
      ++hung;
    else if (!exited_zero(status))
      ++failed;
  }
  stop = true;
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(hung, 0) << "a child did not exit within 10 s (stopped forking there)";
  EXPECT_EQ(failed, 0);
}

// Nested thread-safe adaptors: before fork the outer lock is taken before
// the inner one, as every call takes them (newest first within the
// allocators' layer); the other order would deadlock fork() itself against a
// thread inside the outer adaptor. A watchdog turns such a deadlock into a
// failure instead of a hung test.
TEST(fork_safety, nested_thread_safe_adaptors_fork_while_used) {
  sim_backend backend;
  thread_safe_adaptor a(
      std::make_unique<thread_safe_adaptor>(std::make_unique<fragctl::testing::passthrough_allocator>(backend)));
  std::atomic<bool> stop{false};
  std::atomic<int> forks{0};
  std::thread user([&] {
    while (!stop.load()) a.deallocate(a.allocate(4096), 4096);
  });
  std::thread watchdog([&] {
    int last = -1;
    for (int quiet = 0; !stop.load(); std::this_thread::sleep_for(100ms)) {
      const int now = forks.load();
      quiet = now == last ? quiet + 1 : 0;
      last = now;
      if (quiet > 200) {  // 20 s without a fork returning
        std::fprintf(stderr, "fork() deadlocked against a thread inside nested adaptors\n");
        std::_Exit(1);
      }
    }
  });
  int failed = 0;
  for (int i = 0; i < 100; ++i) {
    const int status = fork_and_wait([&] {
      void* p = a.allocate(8192);
      return a.try_deallocate(p, 8192).status == free_status::ok ? 0 : 1;
    });
    ++forks;
    if (!exited_zero(status)) ++failed;
  }
  stop = true;
  user.join();
  watchdog.join();
  EXPECT_EQ(failed, 0);
}

}  // namespace
}  // namespace fragctl
