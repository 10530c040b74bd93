// A mutex that fork() never leaves held in the child (docs/reliability.md,
// "Process lifecycle"), for fragctl's leaf locks: those taken last, inside
// the allocators' locks (the sim device's state, an allocator's OOM log, the
// preload layer's table of blocks).
//
// Every live fork_safe_mutex is on one list. pthread_atfork, as malloc
// implementations do it: before fork() the forking thread takes the list's
// lock and every mutex on it; the parent and the child release them, so the
// child inherits each one unlocked, the state it guards as no thread was
// changing it. The handlers are registered when the library loads, after the
// logger's and before the process hooks' (fragctl/process_hooks.hpp; they
// call install_fork_safe_mutexes() first), so at fork these mutexes are taken
// after every process client's locks and before the logger's.
//
// Contract, for that order to be deadlock-free: a thread holding a
// fork_safe_mutex takes no other fragctl lock but the logger's, and creates
// or destroys no fork_safe_mutex.
#pragma once

#include <mutex>

namespace fragctl::util {

/// std::mutex (BasicLockable, Lockable) kept consistent across fork().
/// Construction and destruction take the list's lock; lock and unlock cost
/// what std::mutex's do.
class fork_safe_mutex {
 public:
  fork_safe_mutex();
  ~fork_safe_mutex();
  fork_safe_mutex(const fork_safe_mutex&) = delete;
  fork_safe_mutex& operator=(const fork_safe_mutex&) = delete;

  void lock() { mutex_.lock(); }
  [[nodiscard]] bool try_lock() { return mutex_.try_lock(); }
  void unlock() noexcept { mutex_.unlock(); }

 private:
  friend struct fork_safe_list;
  std::mutex mutex_;
  fork_safe_mutex* prev_ = nullptr;  // the list: guarded by its lock
  fork_safe_mutex* next_ = nullptr;
};

/// Registers the fork handlers of every fork_safe_mutex if that is not done
/// yet (the library does it when it loads). Idempotent; thread-safe.
void install_fork_safe_mutexes();

}  // namespace fragctl::util
