// The process lifecycle shared by reports and traces (fragctl/process_hooks.hpp).
//
// The hooks' state is created on first use and never destroyed, so the exit
// hook, the writer thread and late destructors never meet a destroyed object.
// Lock order: the hooks' mutex, then each client's locks in layer order, then
// the output claims' mutex, then the leaf locks (util/fork_safe_mutex.hpp),
// then the logger's (fork_prepare, with the handlers registered before these,
// takes them all in that order).
#include "fragctl/process_hooks.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "core/output_paths.hpp"
#include "fragctl/log.hpp"
#include "util/fork_safe_mutex.hpp"

namespace fragctl {
namespace {

struct handled_signal {
  int signo;
  bool terminates;       // fragctl ends the process with it after the flush (unless a handler was there)
  bool only_if_default;  // caught only where its action is the default, never chained
  // Taken with the first client that writes outputs, not when the library
  // loads: a program that installs its own handler only where the action is
  // still the default (CPython's SIGINT, which raises KeyboardInterrupt) must
  // find the default when it starts, and fragctl then chains to its handler.
  bool with_first_client;
};

constexpr std::array<handled_signal, 8> handled_signals{{{SIGUSR1, false, false, false},
                                                         {SIGTERM, true, false, false},
                                                         {SIGINT, true, false, true},
                                                         {SIGHUP, true, true, false},
                                                         {SIGQUIT, true, true, false},
                                                         {SIGABRT, true, true, false},
                                                         {SIGALRM, true, true, false},
                                                         {SIGUSR2, true, true, false}}};

constexpr std::size_t signal_index(int signo) noexcept {
  for (std::size_t i = 0; i < handled_signals.size(); ++i)
    if (handled_signals[i].signo == signo) return i;
  return 0;
}

// What the signal handler reads: plain atomics and arrays written before the
// handler is installed.
struct signal_state {
  std::atomic<int> pipe_write{-1};
  std::atomic<pid_t> writer_pid{0};        // the process whose writer thread reads the pipe
  std::atomic<pid_t> writer_tid{0};        // that thread (gettid)
  std::atomic<bool> terminating{false};    // a terminating signal is being written
  std::array<struct sigaction, handled_signals.size()> previous{};
  std::array<bool, handled_signals.size()> installed{};
};
signal_state signals;  // constant-initialized: usable before any constructor runs

std::atomic<bool> forked_child{false};
std::atomic<std::uint64_t> failed_outputs{0};
thread_local bool frozen_here = false;  // outputs_frozen_by_this_thread()

pid_t this_thread_id() noexcept { return static_cast<pid_t>(::syscall(SYS_gettid)); }

bool is_handler(const struct sigaction& a) noexcept {
  if ((a.sa_flags & SA_SIGINFO) != 0) return a.sa_sigaction != nullptr;
  return a.sa_handler != SIG_DFL && a.sa_handler != SIG_IGN && a.sa_handler != nullptr;
}

// Whether fragctl ends the process with `signo` after writing the outputs:
// a terminating signal whose earlier handler, if any, fragctl does not call.
bool ends_process(int signo) noexcept {
  const std::size_t i = signal_index(signo);
  return handled_signals[i].terminates && !is_handler(signals.previous[i]);
}

// Ends the process with `signo`'s default action. Async-signal-safe.
void die_of(int signo) noexcept {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(signo, &dfl, nullptr);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, signo);
  ::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  ::raise(signo);
}

// A signal this very thread sent itself (raise, abort): the thread would not
// have gone on without fragctl.
bool sent_by_this_thread(const siginfo_t* info) noexcept {
  return info != nullptr && info->si_code == SI_TKILL && info->si_pid == ::getpid();
}

// Keeps the thread in the handler while the writer writes and ends the
// process; ends it after self_signal_wait_s if the writer has not (it waits
// for a lock this thread holds). Async-signal-safe.
void wait_for_the_writer(int signo) noexcept {
  timespec start{};
  ::clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    const timespec step{0, 10'000'000};
    ::nanosleep(&step, nullptr);
    timespec now{};
    ::clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - start.tv_sec >= self_signal_wait_s) die_of(signo);
  }
}

void on_signal(int signo, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  const struct sigaction& previous = signals.previous[signal_index(signo)];
  const bool chained = is_handler(previous);
  const bool terminate = ends_process(signo);
  const bool writer = signals.writer_pid.load(std::memory_order_acquire) == ::getpid();
  // The writer thread itself (abort() during a flush) cannot wait for itself.
  const bool on_writer = signals.writer_tid.load(std::memory_order_acquire) == this_thread_id();
  if (terminate && (!writer || on_writer || signals.terminating.exchange(true))) die_of(signo);
  const int fd = signals.pipe_write.load(std::memory_order_acquire);
  if (terminate && fd < 0) die_of(signo);  // no pipe: nothing would ever end the process
  if (writer && fd >= 0) {
    const auto byte = static_cast<unsigned char>(signo);
    // A full pipe means writes are pending already: dropping the byte is right,
    // except for a terminating signal, which must reach the writer.
    if (::write(fd, &byte, 1) != 1 && terminate) die_of(signo);
  }
  errno = saved_errno;
  if (terminate && sent_by_this_thread(info)) wait_for_the_writer(signo);
  if (!chained) return;
  if ((previous.sa_flags & SA_SIGINFO) != 0) {
    previous.sa_sigaction(signo, info, context);
  } else {
    previous.sa_handler(signo);
  }
}

// The lowest descriptor of the signal pipe, where the descriptor limit is
// at least twice it (the usual soft limit is 1,024).
constexpr int pipe_fd_floor = 512;

struct client_slot {
  process_client* client;
  int layer;
};

class process_hooks {
 public:
  static process_hooks& instance() {
    static process_hooks* const hooks = new process_hooks();  // never destroyed, see top
    return *hooks;
  }

  void install() { std::call_once(installed_, [this] { install_once(); }); }

  // The fork handlers alone; registered when the library loads.
  void install_fork() {
    std::call_once(fork_installed_, [] {
      // Their handlers first, so that their locks are taken after the clients'
      // (fragctl/log.hpp, util/fork_safe_mutex.hpp).
      (void)logger();
      util::install_fork_safe_mutexes();
      ::pthread_atfork([] { instance().fork_prepare(); }, [] { instance().fork_parent(); },
                       [] { instance().fork_child(); });
    });
  }

  // `writes`: a client with outputs, which needs the exit hook, the signal
  // handlers and the writer thread.
  void add(process_client& client, int layer, bool writes) {
    if (writes) {
      install();
      std::call_once(client_signals_installed_, [] { take_signals(/*with_first_client=*/true); });
    } else {
      install_fork();
    }
    const std::lock_guard lock(mutex_);
    if (writes) start_writer_locked();
    const auto same = [&](const client_slot& s) { return s.client == &client; };
    if (std::find_if(clients_.begin(), clients_.end(), same) != clients_.end()) return;
    // Newest first within a layer (process_hooks.hpp).
    const auto from = [&](const client_slot& s) { return s.layer >= layer; };
    clients_.insert(std::find_if(clients_.begin(), clients_.end(), from), client_slot{&client, layer});
  }

  void remove(process_client& client) noexcept {
    const std::lock_guard lock(mutex_);
    std::erase_if(clients_, [&](const client_slot& s) { return s.client == &client; });
  }

  std::size_t flush(std::string_view reason) noexcept {
    const std::lock_guard lock(mutex_);
    std::size_t files = 0;
    for (const client_slot& s : clients_) files += s.client->flush(reason);
    return files;
  }

  // The last flush, before a signal ends the process: every client frozen
  // first, so that the report and the traces describe one moment. The locks
  // are never released.
  void flush_frozen(std::string_view reason) noexcept {
    mutex_.lock();
    frozen_here = true;
    for (const client_slot& s : clients_) s.client->freeze();
    for (const client_slot& s : clients_) s.client->flush(reason);
  }

 private:
  process_hooks() = default;

  void install_once() {
    install_fork();
    outputs_installed_.store(true, std::memory_order_release);
    std::atexit([] { instance().flush("exit"); });
    open_pipe();
    take_signals(/*with_first_client=*/false);
  }

  // Installs on_signal for the handled signals whose with_first_client is
  // `with_first_client`, each as its rules say (handled_signal).
  static void take_signals(bool with_first_client) {
    struct sigaction action {};
    action.sa_sigaction = &on_signal;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    for (std::size_t i = 0; i < handled_signals.size(); ++i) {
      if (handled_signals[i].with_first_client != with_first_client) continue;
      const int signo = handled_signals[i].signo;
      struct sigaction current {};
      ::sigaction(signo, nullptr, &current);
      const bool is_default = (current.sa_flags & SA_SIGINFO) == 0 && current.sa_handler == SIG_DFL;
      const bool ignored = (current.sa_flags & SA_SIGINFO) == 0 && current.sa_handler == SIG_IGN;
      // A terminating signal the process ignores stays ignored; one of the
      // others with a handler of the program's keeps it.
      if (handled_signals[i].terminates && ignored) continue;
      if (handled_signals[i].only_if_default && !is_default) continue;
      signals.previous[i] = current;
      if (::sigaction(signo, &action, nullptr) != 0) {
        logger().warn("cannot install the handler of signal {} ({}); outputs are not written on it", signo,
                      std::strerror(errno));
        continue;
      }
      signals.installed[i] = true;
    }
  }

  // `fd` moved to a descriptor of pipe_fd_floor or above (closed, the copy
  // returned; `fd` itself where the limit leaves no room). The pipe opens as
  // the library loads, where the lowest free descriptors are 3 and 4, which
  // programs take with dup2 for their own files (a shell's `exec 3>file`):
  // fragctl's signal byte would go into the program's file.
  static int out_of_the_way(int fd) noexcept {
    rlimit limit{};
    if (fd >= pipe_fd_floor || ::getrlimit(RLIMIT_NOFILE, &limit) != 0 ||
        limit.rlim_cur < static_cast<rlim_t>(2 * pipe_fd_floor)) {
      return fd;
    }
    const int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, pipe_fd_floor);
    if (moved < 0) return fd;
    ::close(fd);
    return moved;
  }

  // Called at install and in a forked child: the child must not read its
  // parent's pipe.
  void open_pipe() noexcept {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      logger().warn("no pipe for signals ({}); outputs are not written on a signal", std::strerror(errno));
      return;
    }
    for (int& fd : fds) fd = out_of_the_way(fd);
    ::fcntl(fds[1], F_SETFL, ::fcntl(fds[1], F_GETFL) | O_NONBLOCK);
    pipe_read_ = fds[0];
    signals.pipe_write.store(fds[1], std::memory_order_release);
  }

  void start_writer_locked() {
    if (pipe_read_ < 0 || signals.writer_pid.load(std::memory_order_relaxed) == ::getpid()) return;
    std::thread([fd = pipe_read_] { instance().run_writer(fd); }).detach();
    signals.writer_pid.store(::getpid(), std::memory_order_release);
  }

  // The writer thread: one flush per batch of signals; a terminating signal
  // whose default action fragctl took over is re-raised after a frozen flush.
  void run_writer(int fd) noexcept {
    signals.writer_tid.store(this_thread_id(), std::memory_order_release);
    sigset_t set;
    sigemptyset(&set);
    for (const handled_signal& h : handled_signals) sigaddset(&set, h.signo);
    ::pthread_sigmask(SIG_BLOCK, &set, nullptr);  // the handler runs on the other threads
    std::array<unsigned char, 64> bytes{};
    for (;;) {
      const ssize_t n = ::read(fd, bytes.data(), bytes.size());
      if (n <= 0) {
        if (n < 0 && errno == EINTR) continue;
        return;
      }
      int ending = 0;
      for (ssize_t i = 0; i < n && ending == 0; ++i) {
        const int signo = bytes[static_cast<std::size_t>(i)];
        if (ends_process(signo)) ending = signo;
      }
      if (ending == 0) {
        flush("signal");
        continue;
      }
      flush_frozen("signal");
      die_of(ending);
    }
  }

  // The logger's lock comes last: its own fork handlers take it (registered
  // before these, so called after them before fork and before them after).
  void fork_prepare() noexcept {
    mutex_.lock();
    for (const client_slot& s : clients_) s.client->fork_prepare();
    detail::output_claims_fork_prepare();
  }

  void fork_parent() noexcept {
    detail::output_claims_fork_parent();
    for (auto it = clients_.rbegin(); it != clients_.rend(); ++it) it->client->fork_parent();
    mutex_.unlock();
  }

  // Only a parent that had outputs (install_once) makes a "forked child"
  // whose paths get ".<pid>" (expand_output_path).
  void fork_child() noexcept {
    const bool outputs = outputs_installed_.load(std::memory_order_acquire);
    if (outputs) forked_child.store(true, std::memory_order_release);
    detail::output_claims_fork_child();
    for (auto it = clients_.rbegin(); it != clients_.rend(); ++it) it->client->fork_child();
    if (outputs) {
      // The writer thread stayed in the parent: the child gets its own pipe,
      // and its own writer with its next client.
      signals.writer_pid.store(0, std::memory_order_release);
      signals.writer_tid.store(0, std::memory_order_release);
      signals.terminating.store(false, std::memory_order_release);
      const int old_write = signals.pipe_write.exchange(-1, std::memory_order_acq_rel);
      if (old_write >= 0) ::close(old_write);
      if (pipe_read_ >= 0) ::close(pipe_read_);
      pipe_read_ = -1;
      open_pipe();
    }
    mutex_.unlock();
  }

  std::mutex mutex_;
  std::vector<client_slot> clients_;  // ascending layer, the newest first within one
  std::once_flag installed_;
  std::once_flag client_signals_installed_;
  std::once_flag fork_installed_;
  std::atomic<bool> outputs_installed_{false};  // install_once ran
  int pipe_read_ = -1;
};

// When the library loads, before any thread of the program's: every
// thread-safe allocator relies on the fork handlers, and a fork() while
// another thread is inside a first initialization would leave the child's
// copy of its guard taken.
[[maybe_unused]] const bool fork_handlers_at_load = (process_hooks::instance().install_fork(), true);

}  // namespace

void add_process_client(process_client& client, int layer) { process_hooks::instance().add(client, layer, true); }

void add_fork_client(process_client& client, int layer) { process_hooks::instance().add(client, layer, false); }

void remove_process_client(process_client& client) noexcept { process_hooks::instance().remove(client); }

std::size_t flush_process_outputs(std::string_view reason) noexcept {
  return process_hooks::instance().flush(reason);
}

namespace {

// What the latest failed output said. Never destroyed, as the hooks are: the
// exit flush (an atexit function) and the writer thread may fail an output
// after static destructors ran. A leaf lock, kept consistent across fork().
struct failure_text {
  util::fork_safe_mutex lock;
  std::string text;  // under lock
};
failure_text& last_failure() {
  static failure_text* const last = new failure_text();
  return *last;
}
// Made as the library loads: its mutex is never created inside another lock.
[[maybe_unused]] const bool failure_text_at_load = (last_failure(), true);

}  // namespace

void note_output_failure(std::string_view what) noexcept {
  failed_outputs.fetch_add(1, std::memory_order_relaxed);
  try {
    failure_text& last = last_failure();
    const std::lock_guard lock(last.lock);
    last.text.assign(what);
  } catch (const std::exception&) {  // out of host memory: the count stands, the text is lost
  }
}

std::string last_output_failure() {
  failure_text& last = last_failure();
  const std::lock_guard lock(last.lock);
  return last.text;
}

std::uint64_t output_failures() noexcept { return failed_outputs.load(std::memory_order_relaxed); }

void install_process_hooks() { process_hooks::instance().install(); }

bool is_forked_child() noexcept { return forked_child.load(std::memory_order_acquire); }

bool outputs_frozen_by_this_thread() noexcept { return frozen_here; }

}  // namespace fragctl
