// The process lifecycle of reports and traces (fragctl/process_hooks.hpp,
// docs/reliability.md): fork, exit(), SIGTERM, explicit flush, and how the
// report files are created. Each scenario that ends a process runs in a
// forked child, so the test program itself keeps running.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "core/passthrough_allocator.hpp"
#include "fmt/format.h"
#include "fragctl/adaptors.hpp"
#include "fragctl/allocator_stack.hpp"
#include "fragctl/fragctl.h"
#include "fragctl/log.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/process_hooks.hpp"
#include "fragctl/sim_backend.hpp"
#include "fragctl/stats_export.hpp"
#include "fragctl/trace.hpp"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "support/log_capture.hpp"
#include "support/stats_export_support.hpp"
#include "support/test_support.hpp"

// Children forked while other threads run inherit memory reachable only
// from those threads' stacks, which the child does not have: LeakSanitizer's
// check at the child's exit would report it as leaked and fail the child.
// A child that sets this flag skips that check (LSan asks this function).
// Every child of this program is forked through fork_child(), which sets it.
namespace {
std::atomic<bool> skip_leak_check_at_exit{false};
}  // namespace
extern "C" int __lsan_is_turned_off() { return skip_leak_check_at_exit.load() ? 1 : 0; }

namespace fragctl {
namespace {

namespace fs = std::filesystem;
using fragctl::testing::export_entries;
using fragctl::testing::occurrences;
using fragctl::testing::read_file;
using fragctl::testing::scoped_environment;

fs::path fresh_dir(std::string_view name) { return testing::fresh_dir("lifecycle", name); }

// Starts the lifecycle worker on `dir` with `blocks` per device on `devices`
// devices (and `mode` when given), in a process of its own; its pid, or 0
// with the test failed when it could not be started.
pid_t spawn_worker(const fs::path& dir, std::size_t blocks, std::size_t devices, const char* mode = nullptr) {
  std::string program = FRAGCTL_LIFECYCLE_WORKER;
  std::string dir_arg = dir.string();
  std::string n_arg = std::to_string(blocks);
  std::string devices_arg = std::to_string(devices);
  std::string mode_arg = mode == nullptr ? "" : mode;
  std::vector<char*> argv{program.data(), dir_arg.data(), n_arg.data(), devices_arg.data()};
  if (mode != nullptr) argv.push_back(mode_arg.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, program.c_str(), nullptr, nullptr, argv.data(), environ);
  EXPECT_EQ(rc, 0) << program;
  return rc == 0 ? pid : 0;
}

config sim_config() {
  config cfg;
  cfg.policy = "caching";
  cfg.sim_capacity = 1 * GiB;
  return cfg;
}

std::unique_ptr<allocator_stack> sim_stack(const config& cfg) {
  return std::make_unique<allocator_stack>(std::make_unique<sim_backend>(sim_options{.capacity = cfg.sim_capacity}),
                                           cfg);
}

// fork(), the child skipping LeakSanitizer's check at its exit.
pid_t fork_child() {
  const pid_t pid = ::fork();
  if (pid == 0) skip_leak_check_at_exit = true;
  return pid;
}

// Waits for `child` at most `bound`; a child still running then is killed and
// reported as hung (-1). Otherwise returns the raw wait status.
int wait_bounded(pid_t child, std::chrono::seconds bound) {
  const auto give_up = std::chrono::steady_clock::now() + bound;
  int status = 0;
  while (std::chrono::steady_clock::now() < give_up) {
    const pid_t done = ::waitpid(child, &status, WNOHANG);
    if (done == child) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ::kill(child, SIGKILL);
  ::waitpid(child, &status, 0);
  return -1;
}

std::size_t allocations_in_report(const fs::path& path) {
  auto report = stats_export_from_json(read_file(path));
  if (!report.ok() || report->empty()) return 0;
  std::size_t n = 0;
  for (const allocator_stats& s : *report) n += s.allocations;
  return n;
}

// True when no file is at `path` or this process wrote it. (An interval
// writer started by an earlier test of this program may write the parent's
// report at any time.)
bool written_by_this_process(const fs::path& path) {
  if (!fs::exists(path)) return true;
  const nlohmann::json doc = nlohmann::json::parse(read_file(path), nullptr, false);
  return !doc.is_discarded() && doc.value("pid", -1) == ::getpid();
}

// Regression (issue 18): with the interval writer and a second thread
// allocating, every child that forked and called exit() hung on a lock its
// parent's threads held at fork time (40 of 40).
TEST(process_lifecycle, fork_under_load_never_hangs_a_child) {
  const fs::path dir = fresh_dir("fork_load");
  config cfg = sim_config();
  cfg.report_path = (dir / "report.json").string();
  cfg.report_interval_ms = 1;
  auto stack = sim_stack(cfg);
  device_allocator& a = stack->allocator();

  std::atomic<bool> stop{false};
  std::thread load([&] {
    while (!stop.load()) a.deallocate(a.allocate(4096), 4096);
  });
  int hung = 0;
  int failed = 0;
  for (int i = 0; i < 200; ++i) {
    const pid_t child = fork_child();
    ASSERT_GE(child, 0);
    if (child == 0) {
      // The inherited allocator is consistent and unlocked in the child.
      a.deallocate(a.allocate(1 * MiB), 1 * MiB);
      std::exit(0);
    }
    const int status = wait_bounded(child, std::chrono::seconds(20));
    if (status == -1) ++hung;
    else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  stop = true;
  load.join();
  EXPECT_EQ(hung, 0) << "children that did not exit";
  EXPECT_EQ(failed, 0);
  // Children write no report of their own: only the parent's file is there.
  // (Listed once the parent's interval writer is gone: while it runs, its
  // temporary file may be in the directory.)
  stack.reset();
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) files.push_back(entry.path().filename().string());
  EXPECT_EQ(files, std::vector<std::string>{"report.json"});
}

// Regression (issue 18): a child's exit hook wrote its stale copy of the
// parent's report (the child's pid, 1 allocation where the parent made 501).
TEST(process_lifecycle, forked_child_never_writes_its_parents_report) {
  const fs::path dir = fresh_dir("fork_report");
  config cfg = sim_config();
  cfg.report_path = (dir / "report.json").string();
  auto stack = sim_stack(cfg);
  device_allocator& a = stack->allocator();
  void* first = a.allocate(1 * MiB);

  const pid_t child = fork_child();
  ASSERT_GE(child, 0);
  if (child == 0) std::exit(0);
  ASSERT_NE(wait_bounded(child, std::chrono::seconds(20)), -1);
  EXPECT_TRUE(written_by_this_process(dir / "report.json")) << "the child wrote its parent's report";

  for (int i = 0; i < 500; ++i) a.deallocate(a.allocate(4096), 4096);
  a.deallocate(first, 1 * MiB);
  stack.reset();
  const std::string text = read_file(dir / "report.json");
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(nlohmann::json::parse(text)["pid"], ::getpid());
  EXPECT_EQ(allocations_in_report(dir / "report.json"), 501u);
}

// A forked child's own allocators report under its pid: "%p" in the path, or
// ".<pid>" appended to a path without it.
TEST(process_lifecycle, forked_child_reports_under_its_own_pid) {
  const fs::path dir = fresh_dir("fork_pid");
  config parent_cfg = sim_config();
  parent_cfg.report_path = (dir / "plain.json").string();
  auto parent_stack = sim_stack(parent_cfg);  // the parent has loaded and used the hooks

  const pid_t child = fork_child();
  ASSERT_GE(child, 0);
  if (child == 0) {
    config with_pid = sim_config();
    with_pid.report_path = (dir / "r.%p.json").string();
    config plain = sim_config();
    plain.report_path = (dir / "plain.json").string();
    auto a = sim_stack(with_pid);
    auto b = sim_stack(plain);
    a->allocator().deallocate(a->allocator().allocate(1 * MiB), 1 * MiB);
    b->allocator().deallocate(b->allocator().allocate(1 * MiB), 1 * MiB);
    std::exit(0);
  }
  const int status = wait_bounded(child, std::chrono::seconds(20));
  ASSERT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(allocations_in_report(dir / fmt::format("r.{}.json", child)), 1u);
  EXPECT_EQ(allocations_in_report(dir / fmt::format("plain.json.{}", child)), 1u);
  EXPECT_TRUE(written_by_this_process(dir / "plain.json"));
  EXPECT_EQ(expand_output_path("a%%b.%p"), fmt::format("a%b.{}", ::getpid()));
  parent_stack.reset();
}

// Regression (issue 18): a path planted at the temporary name was written
// through (a plain fopen of "<path>.tmp.<pid>").
TEST(process_lifecycle, report_write_never_follows_a_planted_symlink) {
  const fs::path dir = fresh_dir("symlink");
  const fs::path outside = fresh_dir("symlink_outside");
  const fs::path victim = outside / "victim.txt";
  { std::ofstream(victim) << "keep"; }
  const fs::path target = dir / "report.json";
  fs::create_symlink(victim, fs::path(target.string() + fmt::format(".tmp.{}", ::getpid())));
  fs::create_symlink(victim, dir / ".report.json.tmp");

  allocator_stats s;
  s.allocator = "caching";
  s.allocations = 7;
  ASSERT_TRUE(write_stats_export_file(target.string(), export_entries({s}), "request").ok());
  EXPECT_EQ(read_file(victim), "keep");
  EXPECT_EQ(allocations_in_report(target), 7u);
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(outside)) ++entries;
  EXPECT_EQ(entries, 1u) << "a file outside the report's directory was created";
  std::size_t temporaries = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos && !e.is_symlink()) ++temporaries;
  EXPECT_EQ(temporaries, 0u) << "a temporary file was left behind";
}

// Regression (issue 18): an allocator with only a JSON report logged
// `prometheus: cannot rename ".tmp.<pid>" to ""` at every destroy.
TEST(process_lifecycle, empty_output_path_is_dropped) {
  const fs::path dir = fresh_dir("empty_path");
  config cfg = sim_config();
  cfg.report_path = (dir / "report.json").string();
  const fragctl::testing::log_capture log;
  const std::uint64_t failures = output_failures();
  sim_stack(cfg).reset();
  EXPECT_EQ(log.text().find("cannot"), std::string::npos) << log.text();
  EXPECT_EQ(output_failures(), failures);
  EXPECT_EQ(allocations_in_report(dir / "report.json"), 0u);
  EXPECT_TRUE(fs::exists(dir / "report.json"));
  EXPECT_FALSE(write_stats_export_file("", {}, "request").ok());
}

// Regression (issue 18): the registry kept every destroyed allocator, and
// each destroy rewrote them all (2,000 cycles: 148 s, 20 MiB).
TEST(process_lifecycle, registry_forgets_old_destroyed_allocators) {
  const fs::path dir = fresh_dir("forget");
  config cfg = sim_config();
  cfg.report_path = (dir / "report.json").string();
  for (std::size_t i = 0; i < 3 * stats_export_retired_kept; ++i) sim_stack(cfg).reset();
  auto report = stats_export_from_json(read_file(dir / "report.json"));
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->size(), stats_export_retired_kept);
}

// The allocations and frees a report counts and those its trace recorded.
struct counted {
  std::size_t report_allocations = 0;
  std::size_t report_frees = 0;
  std::size_t trace_allocs = 0;
  std::size_t trace_frees = 0;
  bool operator==(const counted&) const = default;
  friend std::ostream& operator<<(std::ostream& out, const counted& c) {
    return out << fmt::format("report {} allocations, {} frees; trace {} alloc, {} free_requested rows",
                              c.report_allocations, c.report_frees, c.trace_allocs, c.trace_frees);
  }
};

void count_report(const fs::path& path, counted& c) {
  auto report = stats_export_from_json(read_file(path));
  if (!report.ok()) return;
  for (const allocator_stats& s : *report) {
    c.report_allocations += s.allocations;
    c.report_frees += s.frees;
  }
}

void count_trace(const fs::path& path, counted& c) {
  const std::string text = read_file(path);
  c.trace_allocs = occurrences(text, "\nalloc,");
  c.trace_frees = occurrences(text, "\nfree_requested,");
}

// Outputs written by a child that ends as `end` says, after it allocated
// `n` blocks from two threads through an allocator it never destroys.
struct ended_child : counted {
  int status = -1;
};

ended_child run_child(const fs::path& dir, std::size_t n, const std::function<void()>& end) {
  const pid_t child = fork_child();
  if (child == 0) {
    config cfg = sim_config();
    cfg.report_path = (dir / "report.%p.json").string();
    cfg.trace_path = (dir / "trace.%p.csv").string();
    device_allocator& a = sim_stack(cfg).release()->allocator();  // never destroyed, as defaults are
    const auto work = [&a, n] {
      for (std::size_t i = 0; i < n / 2; ++i) a.deallocate(a.allocate(4096 + i), 4096 + i);
    };
    std::thread other(work);
    work();
    other.join();
    end();
    std::_Exit(3);  // not reached
  }
  ended_child out;
  out.status = wait_bounded(child, std::chrono::seconds(20));
  count_report(dir / fmt::format("report.{}.json", child), out);
  count_trace(dir / fmt::format("trace.{}.csv", child), out);
  return out;
}

// Every way a process ends with its outputs written: the trace's rows equal
// the report's counts (issue 16 item 4).
const counted all_of_2000{2000, 2000, 2000, 2000};

TEST(process_lifecycle, exit_writes_every_trace_row_and_the_report) {
  const ended_child c = run_child(fresh_dir("exit"), 2000, [] { std::exit(0); });
  ASSERT_TRUE(c.status != -1 && WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0);
  EXPECT_EQ(static_cast<const counted&>(c), all_of_2000);
}

TEST(process_lifecycle, sigterm_writes_outputs_then_ends_the_process_by_the_signal) {
  const ended_child c = run_child(fresh_dir("sigterm"), 2000, [] {
    ::raise(SIGTERM);
    for (;;) ::pause();
  });
  ASSERT_NE(c.status, -1) << "the child did not end on SIGTERM";
  EXPECT_TRUE(WIFSIGNALED(c.status) && WTERMSIG(c.status) == SIGTERM);
  EXPECT_EQ(static_cast<const counted&>(c), all_of_2000);
}

// No core file from a child that a signal ends with one (SIGQUIT, SIGABRT).
void no_core_dump() {
  const rlimit none{0, 0};
  ::setrlimit(RLIMIT_CORE, &none);
}

// Regression (issue 27 M3): SIGHUP, SIGQUIT, SIGABRT, SIGALRM and SIGUSR2
// (default action: the process ends) ended the process with no report, and a
// trace without its end row or the rows still buffered. Now each is caught
// as SIGTERM is: every output written, then the default action, so the
// process still ends by the signal. raise() and abort() are signals a thread
// sends itself (it waits in the handler for the writer); alarm() comes from
// the kernel (the handler returns).
TEST(process_lifecycle, caught_signals_write_every_output_then_end_the_process_by_the_signal) {
  for (const int signo : {SIGHUP, SIGQUIT, SIGABRT, SIGALRM, SIGUSR2}) {
    SCOPED_TRACE(::strsignal(signo));
    const fs::path dir = fresh_dir(fmt::format("signal_{}", signo));
    const ended_child c = run_child(dir, 2000, [signo] {
      no_core_dump();
      if (signo == SIGABRT) std::abort();
      if (signo == SIGALRM)
        ::alarm(1);
      else
        ::raise(signo);
      for (;;) ::pause();
    });
    ASSERT_NE(c.status, -1) << "the child did not end";
    EXPECT_TRUE(WIFSIGNALED(c.status) && WTERMSIG(c.status) == signo) << c.status;
    EXPECT_EQ(static_cast<const counted&>(c), all_of_2000);
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.path().extension() != ".csv") continue;
      auto t = read_trace(entry.path().string());
      ASSERT_TRUE(t.ok()) << t.status();
      EXPECT_EQ(t->completeness, trace_completeness::complete) << completeness_note(*t);
    }
  }
}

// Runs one lifecycle worker in `mode` on `dir` (a separately started
// process, so that nothing of this program's hooks is inherited): 100 blocks
// on one sim device under the caching policy, a report per process and,
// where `trace`, a trace. Returns the counts of its report and trace; fails
// the test where the worker hung, was ended by a signal or exited with
// another status than 0 (`statuses` says what its statuses mean).
counted run_worker_with_outputs(const fs::path& dir, const char* mode, bool trace, std::string_view statuses) {
  scoped_environment env;
  env.set("FRAGCTL_BACKEND", "sim");
  env.set("FRAGCTL_POLICY", "caching");
  env.set("FRAGCTL_TRACE", trace ? (dir / "trace.%p.csv").c_str() : nullptr);
  env.set("FRAGCTL_REPORT", (dir / "report.%p.json").c_str());
  { std::ofstream(dir / "go").put('\n'); }
  counted c;
  const pid_t pid = spawn_worker(dir, 100, 1, mode);
  if (pid == 0) return c;  // spawn_worker failed the test
  const int status = wait_bounded(pid, std::chrono::seconds(60));
  EXPECT_TRUE(status != -1 && WIFEXITED(status)) << "the worker hung or was ended by a signal: " << status;
  if (status == -1 || !WIFEXITED(status)) return c;
  EXPECT_EQ(WEXITSTATUS(status), 0) << statuses;
  count_report(dir / fmt::format("report.{}.json", pid), c);
  if (trace) count_trace(dir / fmt::format("trace.{}.csv", pid), c);
  return c;
}

// Those signals are caught only where their action is the default: a
// program's own handler (installed before fragctl's hooks) runs, and an
// ignored one stays ignored; the process goes on and ends normally, its
// outputs whole. A separately started process, so that nothing of this
// program's hooks is inherited.
TEST(process_lifecycle, a_programs_own_signal_handlers_are_left_to_it) {
  const counted c = run_worker_with_outputs(fresh_dir("own_handlers"), "own-handlers", /*trace=*/true,
                                            "5: its own SIGUSR2 handler did not run once");
  EXPECT_EQ(c, (counted{100, 100, 100, 100}));
}

// Regression: with outputs asked for, the library took SIGINT as it loaded,
// before the program's main; CPython installs its handler (KeyboardInterrupt)
// only where SIGINT's action is still the default, so under LD_PRELOAD
// Ctrl-C ended a Python job without its `except` or `finally`. And the
// signal pipe, opened as the library loads, sat on descriptors 3 and 4,
// where a program's dup2 put its own file: fragctl's signal byte went into
// it. Now SIGINT is taken with the first allocator that writes outputs
// (chained to the program's handler) and the pipe lies out of the way.
TEST(process_lifecycle, a_program_that_starts_like_python_keeps_sigint_and_its_descriptors) {
  const counted c = run_worker_with_outputs(fresh_dir("like_python"), "like-python", /*trace=*/false,
                                            "16 + 1: SIGINT was not at its default when main began; + 2: the "
                                            "program's SIGINT handler did not run once; + 4: its file on 3 and 4 "
                                            "changed");
  EXPECT_EQ(c.report_allocations, 100U);
}

// Regression (issue 27 M3): a trace whose process was killed (SIGKILL, the
// OOM killer) read as a whole run with its tail missing. Every trace now
// begins with an end row, so a cut one has rows after its last end row and
// reads as cut.
TEST(process_lifecycle, a_sigkilled_trace_reads_as_cut) {
  const fs::path dir = fresh_dir("sigkill");
  const ended_child c = run_child(dir, 40000, [] {
    ::raise(SIGKILL);
    for (;;) ::pause();
  });
  ASSERT_TRUE(c.status != -1 && WIFSIGNALED(c.status) && WTERMSIG(c.status) == SIGKILL) << c.status;
  EXPECT_GT(c.trace_allocs, 0u) << "no row reached the file: the test shows nothing";
  EXPECT_LT(c.trace_allocs, 40000u);
  fs::path trace_path;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".csv") trace_path = entry.path();
  auto t = read_trace(trace_path.string());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->completeness, trace_completeness::cut);
  EXPECT_GT(t->rows_after_end + (t->cut_row ? 1 : 0), 0u);
  EXPECT_THAT(completeness_note(*t), ::testing::HasSubstr("the trace is cut"));
}

// Regression (issue 27, low): report and trace disagreed after SIGTERM while
// threads allocated (7 of 12 runs): the report was read, then more rows were
// recorded before the trace's end row. The writer now freezes every
// allocator before it writes either. Signals come from outside here (the
// handler returns; the allocating threads run on).
TEST(process_lifecycle, report_and_trace_agree_when_a_signal_ends_allocating_threads) {
  for (int run = 0; run < 12; ++run) {
    const int signo = run % 2 == 0 ? SIGTERM : SIGHUP;
    SCOPED_TRACE(fmt::format("run {}, {}", run, ::strsignal(signo)));
    const fs::path dir = fresh_dir(fmt::format("agree_{}", run));
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    const pid_t child = fork_child();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::close(ready[0]);
      config cfg = sim_config();
      cfg.report_path = (dir / "report.%p.json").string();
      cfg.trace_path = (dir / "trace.%p.csv").string();
      device_allocator& a = sim_stack(cfg).release()->allocator();
      const auto work = [&a] {
        for (std::size_t i = 0;; ++i) a.deallocate(a.allocate(4096 + i % 8192), 4096 + i % 8192);
      };
      std::thread(work).detach();
      std::thread(work).detach();
      const char byte = 1;
      (void)!::write(ready[1], &byte, 1);
      for (;;) ::pause();
    }
    ::close(ready[1]);
    char byte = 0;
    ASSERT_EQ(::read(ready[0], &byte, 1), 1);
    ::close(ready[0]);
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + 5 * run));
    ::kill(child, signo);
    const int status = wait_bounded(child, std::chrono::seconds(20));
    ASSERT_TRUE(status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == signo) << status;
    counted c;
    count_report(dir / fmt::format("report.{}.json", child), c);
    count_trace(dir / fmt::format("trace.{}.csv", child), c);
    EXPECT_GT(c.report_allocations, 0u);
    EXPECT_EQ(c.trace_allocs, c.report_allocations) << c;
    EXPECT_EQ(c.trace_frees, c.report_frees) << c;
  }
}

TEST(process_lifecycle, flush_before_underscore_exit_keeps_every_row) {
  const ended_child c = run_child(fresh_dir("flush"), 2000, [] {
    std::_Exit(fragctl_flush() == FRAGCTL_OK ? 0 : 1);
  });
  ASSERT_TRUE(c.status != -1 && WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0);
  EXPECT_EQ(static_cast<const counted&>(c), all_of_2000);
  // Positive control: without the flush, _Exit loses the buffered rows.
  const ended_child lost = run_child(fresh_dir("no_flush"), 2000, [] { std::_Exit(0); });
  EXPECT_LT(lost.trace_allocs, 2000u);
}

// Regression (issues 16 and 18): ranks started separately (not forked) and
// given one FRAGCTL_TRACE and FRAGCTL_REPORT without "%p" truncated and
// replaced each other's files. The first to claim a path writes it, each
// other one "<path>.<pid>"; every process's trace rows equal its report's
// counts, over two devices each, and every process ends by returning from
// main.
TEST(process_lifecycle, separate_processes_given_one_path_each_keep_every_row) {
  const fs::path dir = fresh_dir("ranks");
  scoped_environment env;
  env.set("FRAGCTL_BACKEND", "sim");
  env.set("FRAGCTL_POLICY", "caching");
  env.set("FRAGCTL_TRACE", (dir / "trace.csv").c_str());
  env.set("FRAGCTL_REPORT", (dir / "report.json").c_str());
  constexpr int workers = 4;
  constexpr std::size_t blocks = 300;  // per device
  constexpr std::size_t devices = 2;
  std::vector<pid_t> pids;
  for (int i = 0; i < workers; ++i) {
    const pid_t pid = spawn_worker(dir, blocks, devices);
    ASSERT_NE(pid, 0);
    pids.push_back(pid);
  }
  // Every worker holds its outputs before any of them ends.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  const auto all_ready = [&] {
    for (const pid_t pid : pids)
      if (!fs::exists(dir / fmt::format("ready.{}", pid))) return false;
    return true;
  };
  while (!all_ready() && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  { std::ofstream(dir / "go").put('\n'); }
  for (const pid_t pid : pids) {
    const int status = wait_bounded(pid, std::chrono::seconds(60));
    ASSERT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << "worker " << pid << ": " << status;
  }

  // The plain path went to one worker, and its report says which.
  const nlohmann::json plain = nlohmann::json::parse(read_file(dir / "report.json"), nullptr, false);
  ASSERT_FALSE(plain.is_discarded());
  std::size_t plain_traces = 0;
  std::size_t plain_reports = 0;
  for (const pid_t pid : pids) {
    const fs::path own_trace = dir / fmt::format("trace.csv.{}", pid);
    const fs::path own_report = dir / fmt::format("report.json.{}", pid);
    const fs::path trace_path = fs::exists(own_trace) ? own_trace : dir / "trace.csv";
    const fs::path report_path = fs::exists(own_report) ? own_report : dir / "report.json";
    plain_traces += trace_path == dir / "trace.csv" ? 1 : 0;
    plain_reports += report_path == dir / "report.json" ? 1 : 0;
    EXPECT_EQ(nlohmann::json::parse(read_file(report_path), nullptr, false).value("pid", -1), pid);
    auto t = read_trace(trace_path.string());
    ASSERT_TRUE(t.ok()) << t.status();  // whole: its `end` row counts every row before it
    counted c;
    count_report(report_path, c);
    count_trace(trace_path, c);
    EXPECT_EQ(c, (counted{blocks * devices, blocks * devices, blocks * devices, blocks * devices})) << "worker "
                                                                                                   << pid;
    EXPECT_EQ(t->events.size(), 2 * blocks * devices);
  }
  EXPECT_EQ(plain_traces, 1u);
  EXPECT_EQ(plain_reports, 1u);
}

// Sends this process's stderr to /dev/null while alive.
class quiet_stderr {
 public:
  quiet_stderr() : saved_(::dup(2)) {
    const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    ::dup2(null, 2);
    ::close(null);
  }
  ~quiet_stderr() {
    ::dup2(saved_, 2);
    ::close(saved_);
  }
  quiet_stderr(const quiet_stderr&) = delete;
  quiet_stderr& operator=(const quiet_stderr&) = delete;

 private:
  int saved_;
};

// Regression (issue 18): the fork handlers took neither the logger's lock nor
// the table of open trace files: a child that logged, or opened a trace,
// while a thread of its parent held one waited forever.
TEST(process_lifecycle, fork_while_threads_log_and_open_traces_never_hangs_a_child) {
  const fs::path dir = fresh_dir("fork_log");
  const quiet_stderr quiet;  // the parent's threads log without pause
  sim_backend parent_backend;
  std::atomic<bool> stop{false};
  std::atomic<int> started{0};
  std::thread logging([&] {
    for (int i = 0; !stop.load(); ++i) {
      logger().warn("parent line {}", i);
      if (i == 0) ++started;
    }
  });
  std::thread tracing([&] {
    for (int i = 0; !stop.load(); ++i) {
      tracing_adaptor t(std::make_unique<fragctl::testing::passthrough_allocator>(parent_backend),
                        (dir / "parent.csv").string());
      t.deallocate(t.allocate(4096), 4096);
      if (i == 0) ++started;  // the hooks are installed: children are forked children
    }
  });
  while (started.load() < 2) std::this_thread::yield();
  int hung = 0;
  int failed = 0;
  std::vector<pid_t> children;
  for (int i = 0; i < 40 && hung == 0; ++i) {
    const pid_t child = fork_child();
    ASSERT_GE(child, 0);
    if (child == 0) {
      logger().warn("child line");
      sim_backend backend;
      tracing_adaptor t(std::make_unique<fragctl::testing::passthrough_allocator>(backend),
                        (dir / "child.csv").string());
      t.deallocate(t.allocate(4096), 4096);
      std::exit(0);
    }
    children.push_back(child);
    const int status = wait_bounded(child, std::chrono::seconds(10));
    if (status == -1) ++hung;
    else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  stop = true;
  logging.join();
  tracing.join();
  EXPECT_EQ(hung, 0) << "a child did not exit within 10 s (stopped forking there)";
  EXPECT_EQ(failed, 0);
  // Each child wrote its own trace, whole, with its one allocation.
  for (const pid_t child : children) {
    auto t = read_trace((dir / fmt::format("child.csv.{}", child)).string());
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->events.size(), 2u);
  }
}

// Regression (issue 18): SIGUSR1 before the first allocator ended the process.
TEST(process_lifecycle, sigusr1_before_any_allocator_is_harmless) {
  const pid_t child = fork_child();
  ASSERT_GE(child, 0);
  if (child == 0) {
    install_process_hooks();
    ::raise(SIGUSR1);
    std::_Exit(0);
  }
  const int status = wait_bounded(child, std::chrono::seconds(20));
  EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace fragctl
