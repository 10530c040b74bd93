// bench_vmm: what the virtual-memory calls cost by the size of one physical
// handle (docs/benchmarks-guide.md, "Virtual-memory call costs").
//
//   bench_vmm [--backend=cuda|sim] [--total=4GiB] [--chunks=2MiB,4MiB,...] [--repeat=3]
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
// rounds; one table row per chunk size: microseconds per call and
// milliseconds per GiB for each phase. Progress goes to stderr.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
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
  int repeat = 3;
};

vmm_options parse(int argc, char** argv) {
  config base;
  base.backend = backend_kind::cuda;
  auto common = parse_bench_options(argc, argv, {"total", "chunks", "repeat"}, {}, base);
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
  return o;
}

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

enum phase { create, map, access, access1, unmap, release, alloc, free_raw, phases };
constexpr const char* phase_names[phases] = {"create", "map", "access", "access1",
                                             "unmap", "release", "allocate", "free"};

// One round for chunk size c: seconds spent in each phase.
std::array<double, phases> round_once(device_backend& b, std::size_t total, std::size_t c) {
  std::array<double, phases> t{};
  const std::size_t n = total / c;
  void* base = b.reserve_address(total);
  auto* const at = static_cast<char*>(base);
  std::vector<physical_handle> handles;
  handles.reserve(n);
  const auto fail = [&](const char* what) -> std::runtime_error {
    for (std::size_t i = 0; i < handles.size(); ++i) b.release_physical(handles[i], c);
    b.release_address(base, total);
    return std::runtime_error(fmt::format("{} failed for {} bytes in chunks of {}", what, total, c));
  };

  auto start = clock_type::now();
  for (std::size_t i = 0; i < n; ++i) {
    const auto h = b.create_physical(c);
    if (!h) throw fail("create_physical");
    handles.push_back(*h);
  }
  t[create] = seconds_since(start);

  const auto map_all = [&] {
    for (std::size_t i = 0; i < n; ++i)
      if (!b.map(at + i * c, c, handles[i])) throw fail("map");
  };
  const auto unmap_all = [&] {
    for (std::size_t i = 0; i < n; ++i) b.unmap(at + i * c, c);
  };
  start = clock_type::now();
  map_all();
  t[map] = seconds_since(start);
  start = clock_type::now();
  for (std::size_t i = 0; i < n; ++i)
    if (!b.set_access(at + i * c, c)) throw fail("set_access");
  t[access] = seconds_since(start);
  start = clock_type::now();
  unmap_all();
  t[unmap] = seconds_since(start);

  map_all();
  start = clock_type::now();
  if (!b.set_access(base, total)) throw fail("set_access");
  t[access1] = seconds_since(start);
  unmap_all();

  start = clock_type::now();
  for (const physical_handle h : handles) b.release_physical(h, c);
  t[release] = seconds_since(start);
  handles.clear();
  b.release_address(base, total);

  std::vector<void*> raw;
  raw.reserve(n);
  start = clock_type::now();
  for (std::size_t i = 0; i < n; ++i) {
    void* p = b.allocate(c);
    if (p == nullptr) {
      for (void* q : raw) b.free(q, c);
      throw std::runtime_error(fmt::format("allocate failed for {} bytes in chunks of {}", total, c));
    }
    raw.push_back(p);
  }
  t[alloc] = seconds_since(start);
  start = clock_type::now();
  for (void* p : raw) b.free(p, c);
  t[free_raw] = seconds_since(start);
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
  std::printf("| chunk | handles |");
  for (const char* p : phase_names) std::printf(" %s us/call |", p);
  std::printf(" create+map+access ms/GiB | create+map+access1 ms/GiB | allocate ms/GiB |\n|---|---:|");
  for (int i = 0; i < phases + 3; ++i) std::printf("---:|");
  std::printf("\n");
  for (const std::size_t c : o.chunks) {
    if (c % g != 0 || o.total % c != 0) {
      std::fprintf(stderr, "bench_vmm: skipping chunk %s: not a multiple of the granularity or not dividing --total\n",
                   util::human_bytes(c).c_str());
      continue;
    }
    std::fprintf(stderr, "bench_vmm: chunk %s ...\n", util::human_bytes(c).c_str());
    std::vector<std::array<double, phases>> rounds;
    for (int r = 0; r < o.repeat; ++r) rounds.push_back(round_once(*b, o.total, c));
    std::array<double, phases> med{};
    for (int p = 0; p < phases; ++p) {
      std::vector<double> v;
      for (const auto& r : rounds) v.push_back(r[p]);
      std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
      med[p] = v[v.size() / 2];
    }
    const double n = static_cast<double>(o.total / c);
    const double gib = static_cast<double>(o.total) / static_cast<double>(GiB);
    std::printf("| %s | %.0f |", util::human_bytes(c).c_str(), n);
    for (int p = 0; p < phases; ++p) std::printf(" %.1f |", 1e6 * med[p] / (p == access1 ? 1.0 : n));
    std::printf(" %.1f | %.1f | %.1f |\n", 1e3 * (med[create] + med[map] + med[access]) / gib,
                1e3 * (med[create] + med[map] + med[access1]) / gib, 1e3 * med[alloc] / gib);
    std::fflush(stdout);
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
