// Helpers the test programs share: files, the test data directory, running
// the fragctl command, and the fragmenting trace of the report tests.
// Header-only (inline): tests/CMakeLists.txt compiles tests/support/*.cpp
// into every test program, a header costs only the programs that include it.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "fragctl/sim_backend.hpp"
#include "fragctl/trace.hpp"
#include "fragctl/types.hpp"
#include "gtest/gtest.h"

namespace fragctl::testing {

/// The whole file, byte for byte ("" when it cannot be read).
inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// How many times `what` occurs in `text`, overlaps included.
/// A fresh, empty directory for one test: <TempDir>/fragctl_<suite>_<pid>_<name>,
/// emptied first if an earlier run left it.
inline std::filesystem::path fresh_dir(std::string_view suite, std::string_view name) {
  std::string leaf = "fragctl_";
  leaf.append(suite).append("_").append(std::to_string(::getpid())).append("_").append(name);
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / leaf;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline std::size_t occurrences(std::string_view text, std::string_view what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string_view::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

/// A file of tests/data: CTest sets FRAGCTL_TEST_DATA; from the repository
/// root it is tests/data.
inline std::string test_data(const std::string& file) {
  const char* dir = std::getenv("FRAGCTL_TEST_DATA");
  return std::string(dir != nullptr ? dir : "tests/data") + "/" + file;
}

struct run_result {
  int status = -1;  ///< exit status; -1 when the command could not run or was killed
  std::string out;  ///< its standard output
};

/// Runs `command` with the shell and keeps its standard output.
inline run_result run_command(const std::string& command) {
  run_result r;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 65536> buffer{};
  std::size_t n = 0;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) r.out.append(buffer.data(), n);
  const int raw = ::pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return r;
}

/// Sim options of a backed device (real host memory: tests write and read
/// patterns) of `granules` granules of `granularity` bytes.
inline sim_options backed_device(std::size_t granules, std::size_t granularity) {
  sim_options o;
  o.capacity = granules * granularity;
  o.granularity = granularity;
  o.backed = true;
  return o;
}

/// Sim options whose work completes only when the test says so
/// (sim_backend::complete): stream-order tests hold frees pending with them.
inline sim_options manual_events() {
  sim_options o;
  o.manual_completion = true;
  return o;
}

/// The fragctl command of this build (<build>/tools/fragctl, beside <build>/tests).
inline std::filesystem::path fragctl_binary() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path() / "tools" / "fragctl";
}

/// Base of the tests that run the built fragctl command: each skips, naming
/// the target to build, where the command is not built.
class fragctl_command_test : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(fragctl_binary()))
      GTEST_SKIP() << "fragctl is not built at " << fragctl_binary() << " (build target fragctl_cli)";
  }
};

/// Runs fragctl with `args` (shell words); `redirect` picks which stream is kept.
inline run_result run_fragctl(const std::string& args, const std::string& redirect = "2>/dev/null") {
  return run_command("'" + fragctl_binary().string() + "' " + args + " " + redirect);
}

/// A trace that fragments the caching policy on a 64 MiB device: three
/// segments of 20 MiB, each with an 8 MiB hole once the holes are freed, then
/// a 16 MiB request that no hole holds (an OOM, event 9), then everything
/// freed.
inline trace fragmenting_trace() {
  trace t;
  t.name = "fragmenting";
  std::int64_t time = 0;
  const auto add = [&](trace_event::action a, std::uint64_t addr, std::size_t size) {
    t.events.push_back({a, addr, size, 0, time});
    time += 1000;
  };
  for (std::uint64_t i = 0; i < 3; ++i) {
    add(trace_event::action::alloc, 0x1000 + i, 8 * MiB);
    add(trace_event::action::alloc, 0x2000 + i, 12 * MiB);
  }
  for (std::uint64_t i = 0; i < 3; ++i) add(trace_event::action::free, 0x1000 + i, 8 * MiB);
  add(trace_event::action::alloc, 0x3000, 16 * MiB);  // event 9: OOM
  add(trace_event::action::alloc, 0x4000, 4 * KiB);
  for (std::uint64_t i = 0; i < 3; ++i) add(trace_event::action::free, 0x2000 + i, 12 * MiB);
  add(trace_event::action::free, 0x4000, 4 * KiB);
  return t;
}

/// Sets (or, with nullptr, unsets) environment variables for its lifetime
/// and restores what was there before. Not thread-safe (setenv).
class scoped_environment {
 public:
  scoped_environment() = default;
  scoped_environment(const scoped_environment&) = delete;
  scoped_environment& operator=(const scoped_environment&) = delete;
  ~scoped_environment() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->had) ::setenv(it->name.c_str(), it->value.c_str(), 1);
      else ::unsetenv(it->name.c_str());
    }
  }
  void set(const char* name, const char* value) {
    const char* old = std::getenv(name);
    saved_.push_back({name, old != nullptr, old != nullptr ? old : ""});
    if (value != nullptr) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }

 private:
  struct saved {
    std::string name;
    bool had;
    std::string value;
  };
  std::vector<saved> saved_;
};

/// The sim backend (FRAGCTL_BACKEND=sim) with `policy` and `conf` for its
/// lifetime, as the C API reads them when it creates an allocator; a member
/// of a test fixture scopes them to each test. Not thread-safe (setenv).
class sim_environment {
 public:
  sim_environment(const char* policy, const char* conf) {
    env_.set("FRAGCTL_BACKEND", "sim");
    env_.set("FRAGCTL_POLICY", policy);
    env_.set("FRAGCTL_CONF", conf);
  }

 private:
  scoped_environment env_;
};

}  // namespace fragctl::testing
