// A separately started process for process_lifecycle_test: several of these,
// given one FRAGCTL_TRACE and FRAGCTL_REPORT (and FRAGCTL_BACKEND=sim), stand
// for the ranks of a job started by a launcher.
//
//   lifecycle_worker DIR N DEVICES [own-handlers | like-python]
//
// Builds the process-default allocator of devices 0..DEVICES-1 through the C
// API, creates DIR/ready.<pid>, waits (at most 60 s) for DIR/go, so that every
// worker holds its outputs before any ends, then allocates and frees N blocks
// on each device and returns from main: a normal exit. Exit status 0, or 2 for
// bad arguments, 3 for a failed C API call, 4 when DIR/go never came.
//
// With own-handlers, the program first installs a handler of its own for
// SIGUSR2 and ignores SIGHUP, as a program that uses them does, and sends
// itself both after the allocations: fragctl must leave them to it (exit
// status 5 when its handler did not run once).
//
// With like-python, the program starts as CPython and a shell do: it takes
// SIGINT for a handler of its own only where SIGINT's action is still the
// default (CPython's KeyboardInterrupt), and puts a file of its own on
// descriptors 3 and 4 with dup2 (a shell's `exec 3>file`). After the
// allocations it sends itself SIGUSR1 (a report request) and SIGINT. Exit
// status 0, or 16 + the sum of what went wrong: 1, SIGINT was not at its
// default when main began (fragctl took it as the library loaded); 2, its
// SIGINT handler did not run once; 4, its file on 3 and 4 changed.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "fragctl/fragctl.h"

namespace {
std::atomic<int> own_handler_calls{0};
}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) return 2;
  const std::filesystem::path dir = argv[1];
  const long n = std::strtol(argv[2], nullptr, 10);
  const int devices = static_cast<int>(std::strtol(argv[3], nullptr, 10));
  const std::string mode = argc == 5 ? argv[4] : "";
  const bool own_handlers = mode == "own-handlers";
  const bool like_python = mode == "like-python";
  if (n <= 0 || devices <= 0 || (argc == 5 && !own_handlers && !like_python)) return 2;
  if (own_handlers) {
    std::signal(SIGUSR2, [](int) { ++own_handler_calls; });
    std::signal(SIGHUP, SIG_IGN);
  }
  int wrong = 0;
  const std::filesystem::path own_file = dir / ("own." + std::to_string(::getpid()));
  const std::string own_text = "the program's own file\n";
  if (like_python) {
    struct sigaction current {};
    ::sigaction(SIGINT, nullptr, &current);
    if ((current.sa_flags & SA_SIGINFO) != 0 || current.sa_handler != SIG_DFL) {
      wrong |= 1;
    } else {
      std::signal(SIGINT, [](int) { ++own_handler_calls; });
    }
    std::ofstream(own_file) << own_text;
    const int fd = ::open(own_file.c_str(), O_WRONLY | O_APPEND);
    if (fd < 0 || ::dup2(fd, 3) != 3 || ::dup2(fd, 4) != 4) return 3;
    ::close(fd);
  }

  std::vector<fragctl_allocator*> allocators;
  for (int d = 0; d < devices; ++d) {
    fragctl_allocator* a = nullptr;
    if (fragctl_default_allocator(d, 1, &a) != FRAGCTL_OK) {
      std::fprintf(stderr, "lifecycle_worker: device %d: %s\n", d, fragctl_last_error());
      return 3;
    }
    allocators.push_back(a);
  }
  std::ofstream(dir / ("ready." + std::to_string(::getpid()))).put('\n');
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!std::filesystem::exists(dir / "go")) {
    if (std::chrono::steady_clock::now() > give_up) return 4;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (long i = 0; i < n; ++i) {
    for (fragctl_allocator* a : allocators) {
      const auto bytes = static_cast<std::size_t>(4096 + i);
      void* p = nullptr;
      if (fragctl_malloc(a, &p, bytes, nullptr) != FRAGCTL_OK || fragctl_free(a, p, bytes, nullptr) != FRAGCTL_OK)
        return 3;
    }
  }
  if (own_handlers) {
    std::raise(SIGUSR2);
    std::raise(SIGHUP);
    if (own_handler_calls.load() != 1) return 5;
  }
  if (like_python) {
    std::raise(SIGUSR1);
    std::raise(SIGINT);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the report writer reads its pipe
    if (own_handler_calls.load() != 1) wrong |= 2;
    std::ifstream in(own_file);
    const std::string now((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (now != own_text) wrong |= 4;
    if (wrong != 0) return 16 + wrong;
  }
  return 0;
}
