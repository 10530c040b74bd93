// jemalloc stays private (docs/checkpoint.md, "jemalloc, privately"): the
// process keeps glibc's malloc and libstdc++'s operator new while the private
// copy is loaded; libfragctl.so exports no allocator symbol and stays
// loadable with dlopen; libfragctl_jemalloc.so exports only its three names.
#include <dlfcn.h>
#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "fragctl/checkpoint/pinned_host_arena.hpp"
#include "fragctl/sim_backend.hpp"

namespace fragctl::checkpoint {
namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FRAGCTL_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define FRAGCTL_TEST_SANITIZED 1
#endif
#endif
#ifdef FRAGCTL_TEST_SANITIZED
constexpr bool sanitized = true;  // the sanitizer's malloc serves the process
#else
constexpr bool sanitized = false;
#endif

/// The build directory: tests live in <build>/tests.
std::filesystem::path build_dir() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path();
}

/// Standard output of `command`, or nullopt when it cannot run or fails.
std::optional<std::string> run(const std::string& command) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen((command + " 2>/dev/null").c_str(), "r"), pclose);
  if (!pipe) return std::nullopt;
  std::string out;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), static_cast<int>(buf.size()), pipe.get()) != nullptr) out += buf.data();
  if (pclose(pipe.release()) != 0) return std::nullopt;
  return out;
}

/// Names of the dynamic symbols `library` defines.
std::set<std::string> defined_dynamic_symbols(const std::filesystem::path& library) {
  std::set<std::string> names;
  const auto out = run("nm -D --defined-only '" + library.string() + "'");
  if (!out) return names;
  std::size_t pos = 0;
  while (pos < out->size()) {
    const std::size_t end = out->find('\n', pos);
    const std::string line = out->substr(pos, end - pos);
    if (const std::size_t sp = line.rfind(' '); sp != std::string::npos) names.insert(line.substr(sp + 1));
    pos = end == std::string::npos ? out->size() : end + 1;
  }
  return names;
}

bool is_allocator_symbol(const std::string& name) {
  static const std::set<std::string> names = {
      "malloc",  "free",    "calloc",  "realloc",      "posix_memalign",     "aligned_alloc", "memalign",
      "valloc",  "pvalloc", "mallocx", "dallocx",      "sdallocx",           "rallocx",       "xallocx",
      "nallocx", "sallocx", "mallctl", "mallctlbymib", "mallctlnametomib", "malloc_usable_size",
      "malloc_conf", "malloc_stats_print", "_Znwm", "_Znam", "_ZdlPv", "_ZdaPv", "_ZdlPvm"};
  return names.contains(name) || name.starts_with("je_") || name.starts_with("_rjem_");
}

bool is_fragctl_name(const std::string& name) {
  // The C API, and mangled C++ names that involve namespace fragctl: its
  // functions, vtables and type information, and templates instantiated
  // over its types (std::copy of fragctl::oom_event, say).
  return name.starts_with("fragctl_") || (name.starts_with("_Z") && name.find("7fragctl") != std::string::npos);
}

TEST(jemalloc_isolation, the_process_keeps_glibc_malloc_and_libstdcxx_new) {
  if (sanitized) GTEST_SKIP() << "a sanitizer's malloc serves this process";
  ASSERT_EQ(jemalloc_available(), "libfragctl_jemalloc") << "this test program links the private jemalloc";
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(libc, nullptr);
  EXPECT_EQ(dlsym(RTLD_DEFAULT, "malloc"), dlsym(libc, "malloc"));
  EXPECT_EQ(dlsym(RTLD_DEFAULT, "free"), dlsym(libc, "free"));
  EXPECT_EQ(dlsym(RTLD_DEFAULT, "mallocx"), nullptr) << "jemalloc's API is not in the global scope";
  dlclose(libc);

  // operator new is libstdc++'s: from libstdc++.so, or from the program
  // itself where the toolchain links libstdc++ statically (the GPU machine's
  // does); never jemalloc's, nor one exported by a fragctl library.
  Dl_info info{};
  ASSERT_NE(dladdr(dlsym(RTLD_DEFAULT, "_Znwm"), &info), 0);
  const std::string new_from = std::filesystem::path(info.dli_fname).filename().string();
  EXPECT_FALSE(new_from.starts_with("libjemalloc")) << info.dli_fname;
  EXPECT_FALSE(new_from.starts_with("libfragctl")) << info.dli_fname;

  // glibc serves the program: its statistics see a block below the mmap threshold.
  const std::size_t before = mallinfo2().uordblks;
  void* block = std::malloc(64 * KiB);
  ASSERT_NE(block, nullptr);
  EXPECT_GE(mallinfo2().uordblks, before + 64 * KiB);
  std::free(block);
}

TEST(jemalloc_isolation, memory_crosses_freely_between_the_program_libc_and_fragctl) {
  sim_backend sim(sim_options{.backed = true});
  pinned_host_arena arena(sim);  // the private jemalloc is in use meanwhile
  void* pinned = arena.allocate(1 * MiB);
  char* copy = strdup("allocated by libc, freed by the program");
  std::free(copy);
  auto owned = std::make_unique<std::vector<int>>(1000, 7);  // operator new in the program
  auto* raw = static_cast<int*>(std::malloc(256));
  raw[0] = owned->back();
  EXPECT_EQ(raw[0], 7);
  std::free(raw);
  arena.deallocate(pinned, 1 * MiB);
  EXPECT_EQ(arena.stats().live_bytes, 0u);
}

TEST(jemalloc_isolation, libfragctl_so_exports_no_allocator_and_loads_with_dlopen) {
  if (sanitized) GTEST_SKIP() << "a sanitized library exports the sanitizer's names too";
  const std::filesystem::path lib = build_dir() / "libfragctl.so";
  ASSERT_TRUE(std::filesystem::exists(lib)) << lib << " is built with the tests";
  if (std::system("command -v nm >/dev/null 2>&1") != 0) GTEST_SKIP() << "nm is not available";
  const std::set<std::string> names = defined_dynamic_symbols(lib);
  ASSERT_FALSE(names.empty()) << "nm -D listed nothing for " << lib;
  for (const std::string& n : names) {
    EXPECT_FALSE(is_allocator_symbol(n)) << "libfragctl.so exports " << n;
    // Only fragctl's own names (cmake/fragctl.map): a C++ runtime linked in
    // statically must not leak out and capture other libraries' std:: calls.
    EXPECT_TRUE(is_fragctl_name(n)) << "libfragctl.so exports a name that is not fragctl's: " << n;
  }
  // ... and all of them: a consumer catches fragctl::out_of_memory and
  // dynamic_casts fragctl's classes through their exported type information.
  for (const char* needed : {"_ZTIN7fragctl13out_of_memoryE", "_ZTVN7fragctl11sim_backendE", "fragctl_malloc",
                             "_ZN7fragctl14make_allocatorERKNS_6configE"}) {
    EXPECT_TRUE(names.contains(needed)) << "libfragctl.so does not export " << needed;
  }

  // No static TLS (jemalloc's thread state would need it): a late dlopen works.
  const auto dynamic = run("readelf -d '" + lib.string() + "'");
  if (dynamic) {
    EXPECT_EQ(dynamic->find("STATIC_TLS"), std::string::npos);
  }
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) std::fprintf(stderr, "dlopen: %s\n", dlerror());
    _exit(h != nullptr ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "dlopen of libfragctl.so failed";
}

TEST(jemalloc_isolation, libfragctl_jemalloc_exports_only_its_three_names) {
  if (sanitized) GTEST_SKIP() << "a sanitized library exports the sanitizer's names too";
  const std::filesystem::path lib = build_dir() / "libfragctl_jemalloc.so";
  ASSERT_TRUE(std::filesystem::exists(lib)) << lib;
  const std::set<std::string> names = defined_dynamic_symbols(lib);
  if (names.empty()) GTEST_SKIP() << "nm is not available";
  EXPECT_EQ(names, (std::set<std::string>{"fragctl_jemalloc_dallocx", "fragctl_jemalloc_mallctl",
                                          "fragctl_jemalloc_mallocx"}));
}

}  // namespace
}  // namespace fragctl::checkpoint
