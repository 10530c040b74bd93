// The list of fork_safe_mutex and its fork handlers (util/fork_safe_mutex.hpp).
#include "util/fork_safe_mutex.hpp"

#include <pthread.h>

#include "fragctl/log.hpp"

namespace fragctl::util {

// Created when the library loads and never destroyed: fork handlers and late
// destructors use it.
struct fork_safe_list {
  std::mutex mutex;
  fork_safe_mutex* head = nullptr;

  static fork_safe_list& instance() {
    static fork_safe_list* const list = new fork_safe_list;
    return *list;
  }

  void add(fork_safe_mutex& m) {
    const std::lock_guard lock(mutex);
    m.next_ = head;
    if (head != nullptr) head->prev_ = &m;
    head = &m;
  }

  void remove(fork_safe_mutex& m) noexcept {
    const std::lock_guard lock(mutex);
    if (m.prev_ != nullptr)
      m.prev_->next_ = m.next_;
    else
      head = m.next_;
    if (m.next_ != nullptr) m.next_->prev_ = m.prev_;
  }

  // The leaf contract (header) makes any order deadlock-free.
  void prepare() noexcept {
    mutex.lock();
    for (fork_safe_mutex* m = head; m != nullptr; m = m->next_) m->mutex_.lock();
  }

  void release() noexcept {
    for (fork_safe_mutex* m = head; m != nullptr; m = m->next_) m->mutex_.unlock();
    mutex.unlock();
  }
};

fork_safe_mutex::fork_safe_mutex() {
  install_fork_safe_mutexes();
  fork_safe_list::instance().add(*this);
}

fork_safe_mutex::~fork_safe_mutex() { fork_safe_list::instance().remove(*this); }

void install_fork_safe_mutexes() {
  static const bool installed = [] {
    (void)logger();  // its handlers first, so that its lock is taken after these (fragctl/log.hpp)
    (void)fork_safe_list::instance();
    ::pthread_atfork([] { fork_safe_list::instance().prepare(); }, [] { fork_safe_list::instance().release(); },
                     [] { fork_safe_list::instance().release(); });
    return true;
  }();
  (void)installed;
}

namespace {
// When the library loads, before any thread of the program's: a fork() while
// another thread is inside the first initialization of a static leaves the
// child's copy of its guard taken for ever.
[[maybe_unused]] const bool installed_at_load = (install_fork_safe_mutexes(), true);
}  // namespace

}  // namespace fragctl::util
