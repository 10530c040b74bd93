// bench_vmm: what the virtual-memory calls cost by the size of one physical
// handle (docs/benchmarks-guide.md, "Virtual-memory call costs").
//
//   bench_vmm [--backend=cuda|sim] [--total=4GiB] [--chunks=2MiB,4MiB,...] [--repeat=3]
//             [--threads=1,2,4,8]
//
// For each chunk size C, --total bytes are brought in and given back as
// total/C handles of C bytes, the way the arena grows and shrinks, every
// phase timed on its own:
//   create   create_physical(C), total/C times
//   map      map each handle at consecutive addresses of one reserved range
//   access   set_access once per handle (a run of one handle)
//   access1  set_access once over the whole range (handles mapped again)
//   unmap    unmap each handle
//   release  release_physical each handle
// and, as the anchor, the same bytes as total/C raw allocations (allocate,
// then free: cudaMalloc/cudaFree on cuda, the "allocate" and "free"
// columns). Times are the median of --repeat
// rounds; one table row per thread count and chunk size: microseconds per
// call and milliseconds per GiB for each phase. Progress goes to stderr.
//
// Threads. With --threads=T every phase but access1 is shared among T host
// threads (call i made by thread i mod T, each bound to the device), all
// started together and timed from the first start to the last end, so a
// row's us/call is wall time over calls: whether a growing arena could make
// its calls faster from several threads (on an H200 it could not: the
// driver makes them one at a time; docs/benchmarks.md, "The three unmet
// targets examined").
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bench_options.hpp"
#include "fmt/format.h"
#include "fragctl/backend.hpp"
#include "fragctl/error.hpp"
#include "util/strings.hpp"

namespace fragctl::bench {

namespace {

struct vmm_options {
  bench_options common;
  std::size_t total = 4 * GiB;
  std::vector<std::size_t> chunks;
  std::vector<unsigned> threads;
  int repeat = 3;
};

vmm_options parse(int argc, char** argv) {
  config base;
  base.backend = backend_kind::cuda;
  auto common = parse_bench_options(argc, argv, {"total", "chunks", "repeat", "threads"}, {}, base);
  if (!common.ok()) throw std::invalid_argument(std::string(util::to_std(common.status().message())));
  vmm_options o;
  o.common = *std::move(common);
  const auto total = parse_size(extra_flag(o.common, "total", "4GiB"));
  if (!total.ok() || *total == 0) throw std::invalid_argument("--total: expected a size such as 4GiB");
  o.total = *total;
  const std::string chunks = extra_flag(o.common, "chunks", "2MiB,4MiB,8MiB,16MiB,32MiB,64MiB,256MiB");
  for (const std::string_view s : util::split(chunks, ',')) {
    const auto c = parse_size(util::trim(s));
    if (!c.ok() || *c == 0) throw std::invalid_argument(fmt::format("--chunks: '{}' is not a size", s));
    o.chunks.push_back(*c);
  }
  std::uint64_t repeat = 0;
  if (!util::parse_u64(extra_flag(o.common, "repeat", "3"), repeat) || repeat == 0 || repeat > 100)
    throw std::invalid_argument("--repeat: expected a count from 1 to 100");
  o.repeat = static_cast<int>(repeat);
  const std::string threads = extra_flag(o.common, "threads", "1");  // split's views point into it
  for (const std::string_view s : util::split(threads, ',')) {
    std::uint64_t t = 0;
    if (!util::parse_u64(util::trim(s), t) || t == 0 || t > 256)
      throw std::invalid_argument(fmt::format("--threads: '{}' is not a thread count from 1 to 256", s));
    o.threads.push_back(static_cast<unsigned>(t));
  }
  return o;
}

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

enum phase { create, map, access, access1, unmap, release, alloc, free_raw, phases };
constexpr const char* phase_names[phases] = {"create", "map", "access", "access1",
                                             "unmap", "release", "allocate", "free"};

// Runs call(i) for every i in [0, n), call i on thread i mod `threads`
// (each bound to b's device); returns the wall seconds from the first start
// to the last end. A call that throws ends its thread's share; the first
// exception is rethrown once every thread has ended.
template <class Call>
double shared(device_backend& b, unsigned threads, std::size_t n, Call call) {
  const auto start = clock_type::now();
  if (threads == 1) {
    for (std::size_t i = 0; i < n; ++i) call(i);
    return seconds_since(start);
  }
  std::vector<std::exception_ptr> errors(threads);
  std::vector<std::thread> pool;
  pool.reserve(threads);
  const auto join_all = [&] {
    for (std::thread& th : pool) th.join();
  };
  try {
    for (unsigned t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        try {
          const device_binding bound = b.bind_device();
          for (std::size_t i = t; i < n; i += threads) call(i);
        } catch (...) {
          errors[t] = std::current_exception();
        }
      });
    }
  } catch (...) {  // no thread to be had: the ones started finish first
    join_all();
    throw;
  }
  join_all();
  const double seconds = seconds_since(start);
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  return seconds;
}

// One round for chunk size c made by `threads` threads: seconds spent in
// each phase.
std::array<double, phases> round_once(device_backend& b, std::size_t total, std::size_t c, unsigned threads) {
  std::array<double, phases> t{};
  const std::size_t n = total / c;
  void* base = b.reserve_address(total);
  auto* const at = static_cast<char*>(base);
  std::vector<std::optional<physical_handle>> handles(n);
  // What is mapped (by index), so that a failure gives back exactly that.
  std::vector<char> mapped(n, 0);
  const auto fail = [&](const char* what, const char* cause) -> std::runtime_error {
    for (std::size_t i = 0; i < n; ++i) {
      if (mapped[i] != 0) b.unmap(at + i * c, c);
      if (handles[i]) b.release_physical(*handles[i], c);
    }
    b.release_address(base, total);
    return std::runtime_error(
        fmt::format("{} failed for {} bytes in chunks of {}{}{}", what, total, c, *cause != 0 ? ": " : "", cause));
  };
  // Runs a phase; on a failed call (false, or a throw) gives everything back.
  const auto phase_of = [&](const char* what, auto call) {
    std::atomic<bool> ok = true;
    try {
      const double seconds = shared(b, threads, n, [&](std::size_t i) {
        if (!call(i)) ok.store(false, std::memory_order_relaxed);
      });
      if (ok.load()) return seconds;
    } catch (const std::exception& e) {
      throw fail(what, e.what());
    }
    throw fail(what, "");
  };

  t[create] =
      phase_of("create_physical", [&](std::size_t i) { return (handles[i] = b.create_physical(c)).has_value(); });
  const auto map_all = [&] {
    return phase_of("map", [&](std::size_t i) { return (mapped[i] = b.map(at + i * c, c, *handles[i]) ? 1 : 0) != 0; });
  };
  const auto unmap_all = [&] {
    return phase_of("unmap", [&](std::size_t i) {
      b.unmap(at + i * c, c);
      mapped[i] = 0;
      return true;
    });
  };
  t[map] = map_all();
  t[access] = phase_of("set_access", [&](std::size_t i) { return b.set_access(at + i * c, c); });
  t[unmap] = unmap_all();

  (void)map_all();
  const auto start = clock_type::now();
  if (!b.set_access(base, total)) throw fail("set_access", "");
  t[access1] = seconds_since(start);
  (void)unmap_all();

  t[release] = phase_of("release_physical", [&](std::size_t i) {
    b.release_physical(*handles[i], c);
    handles[i].reset();
    return true;
  });
  b.release_address(base, total);

  std::vector<void*> raw(n, nullptr);
  const auto free_raw_blocks = [&] {
    for (void* q : raw)
      if (q != nullptr) b.free(q, c);
  };
  std::atomic<bool> got_all = true;
  try {
    t[alloc] = shared(b, threads, n, [&](std::size_t i) {
      raw[i] = b.allocate(c);
      if (raw[i] == nullptr) got_all.store(false, std::memory_order_relaxed);
    });
  } catch (...) {
    free_raw_blocks();
    throw;
  }
  if (!got_all.load()) {
    free_raw_blocks();
    throw std::runtime_error(fmt::format("allocate failed for {} bytes in chunks of {}", total, c));
  }
  t[free_raw] = shared(b, threads, n, [&](std::size_t i) { b.free(raw[i], c); });
  return t;
}

int run(const vmm_options& o) {
  const std::unique_ptr<device_backend> b = make_backend(o.common.cfg);
  if (!b->supports_virtual_memory()) {
    std::fprintf(stderr, "bench_vmm: the %s backend has no virtual memory\n", std::string(b->name()).c_str());
    return 1;
  }
  const std::size_t g = b->granularity();
  std::printf("backend %s, device %d, granularity %zu bytes, total %s per round, median of %d rounds\n\n",
              std::string(b->name()).c_str(), b->device(), g, util::human_bytes(o.total).c_str(), o.repeat);
  std::printf("| threads | chunk | handles |");
  for (const char* p : phase_names) std::printf(" %s us/call |", p);
  std::printf(" create+map+access ms/GiB | create+map+access1 ms/GiB | allocate ms/GiB |\n|---:|---|---:|");
  for (int i = 0; i < phases + 3; ++i) std::printf("---:|");
  std::printf("\n");
  for (const unsigned threads : o.threads) {
    for (const std::size_t c : o.chunks) {
      if (c % g != 0 || o.total % c != 0) {
        std::fprintf(stderr,
                     "bench_vmm: skipping chunk %s: not a multiple of the granularity or not dividing --total\n",
                     util::human_bytes(c).c_str());
        continue;
      }
      std::fprintf(stderr, "bench_vmm: chunk %s, %u thread(s) ...\n", util::human_bytes(c).c_str(), threads);
      std::vector<std::array<double, phases>> rounds;
      for (int r = 0; r < o.repeat; ++r) rounds.push_back(round_once(*b, o.total, c, threads));
      std::array<double, phases> med{};
      for (int p = 0; p < phases; ++p) {
        std::vector<double> v;
        for (const auto& r : rounds) v.push_back(r[p]);
        std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
        med[p] = v[v.size() / 2];
      }
      const double n = static_cast<double>(o.total / c);
      const double gib = static_cast<double>(o.total) / static_cast<double>(GiB);
      std::printf("| %u | %s | %.0f |", threads, util::human_bytes(c).c_str(), n);
      for (int p = 0; p < phases; ++p) std::printf(" %.1f |", 1e6 * med[p] / (p == access1 ? 1.0 : n));
      std::printf(" %.1f | %.1f | %.1f |\n", 1e3 * (med[create] + med[map] + med[access]) / gib,
                  1e3 * (med[create] + med[map] + med[access1]) / gib, 1e3 * med[alloc] / gib);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

}  // namespace fragctl::bench

int main(int argc, char** argv) {
  try {
    return fragctl::bench::run(fragctl::bench::parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_vmm: %s\n", e.what());
    return 2;
  }
}
