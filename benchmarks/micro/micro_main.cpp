// bench_micro: the cost of one malloc or free, per policy, against the CUDA
// runtime's allocators (docs/benchmarks-guide.md).
//
//   bench_micro [--policy=NAME[,NAME...]|all] [--backend=sim|cuda] [--conf=key:value,...]
//               [Google Benchmark flags: --benchmark_min_time=0.05 --benchmark_format=json ...]
//
// Scenarios, each with 1 and 4 streams and with 1 and 8 threads sharing one
// allocator (make_allocator, thread_safe on):
//  * pairs/large: allocate then free at once, sizes log-uniform in 512 B..1 GiB;
//  * working_set/large: 16 blocks live per thread; each iteration frees a
//    random one and allocates a new size in its place;
//  * pairs/small, working_set/small: the same with 512 B..64 KiB sizes and
//    256 live blocks per thread (the size-class path of `buckets`); the
//    figure is the median of 3 runs.
// Sizes and slots are drawn before the timed loop. One iteration is two
// operations (a malloc and a free); times are wall time per iteration over
// all threads together (UseRealTime: total iterations / elapsed time).
//
// Policies: every documented composition, plus on cuda the pseudo-policies
// cudaMalloc and cudaMallocAsync (runtime loaded with dlopen; skipped with a
// message where libcudart is not found). The sim device is sized like an
// H200 (141 GiB) unless --conf sets sim_capacity.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "bench_options.hpp"
#include "cuda_runtime.hpp"
#include "fmt/format.h"
#include "subject.hpp"
#include "util/strings.hpp"

namespace fragctl::bench {

namespace {

struct size_range {
  std::size_t lo;
  std::size_t hi;
  const char* name;
};

constexpr size_range large_sizes{512, GiB, "large"};
constexpr size_range small_sizes{512, 64 * KiB, "small"};

enum class pattern : std::uint8_t { pairs, working_set };

struct scenario {
  pattern kind;
  size_range sizes;
  unsigned streams;
  std::size_t live_per_thread;  // working_set only
};

constexpr std::size_t draw_count = 4096;  // a power of two: index with a mask

// Sizes and slot choices of one thread, drawn before timing.
struct draws {
  std::vector<std::size_t> sizes;
  std::vector<std::uint32_t> slots;
};

draws make_draws(const scenario& sc, int thread) {
  std::mt19937_64 rng(0x9E3779B97F4A7C15ULL * static_cast<std::uint64_t>(thread + 1) ^ sc.sizes.hi);
  std::uniform_real_distribution<double> log_size(std::log(static_cast<double>(sc.sizes.lo)),
                                                  std::log(static_cast<double>(sc.sizes.hi)));
  draws d;
  d.sizes.resize(draw_count);
  for (std::size_t& s : d.sizes) s = static_cast<std::size_t>(std::exp(log_size(rng)));
  if (sc.live_per_thread > 0) {
    std::uniform_int_distribution<std::uint32_t> slot(0, static_cast<std::uint32_t>(sc.live_per_thread - 1));
    d.slots.resize(draw_count);
    for (std::uint32_t& s : d.slots) s = slot(rng);
  }
  return d;
}

struct block {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  unsigned stream = 0;
};

void run_pairs(benchmark::State& state, subject& s, const scenario& sc, const draws& d) {
  const auto t = static_cast<unsigned>(state.thread_index());
  std::size_t i = 0;
  for (auto _ : state) {
    const std::size_t bytes = d.sizes[i & (draw_count - 1)];
    const unsigned stream = (t + static_cast<unsigned>(i)) % sc.streams;
    ++i;
    try {
      void* p = s.allocate(bytes, stream);
      benchmark::DoNotOptimize(p);
      s.deallocate(p, bytes, stream);
    } catch (const std::exception& e) {
      state.SkipWithError(fmt::format("allocate({}) failed: {}", bytes, e.what()).c_str());
      break;
    }
  }
}

void run_working_set(benchmark::State& state, subject& s, const scenario& sc, const draws& d) {
  const auto t = static_cast<unsigned>(state.thread_index());
  std::vector<block> live(sc.live_per_thread);
  const auto free_all = [&] {
    for (block& b : live) {
      if (b.ptr != nullptr) s.deallocate(b.ptr, b.bytes, b.stream);
      b.ptr = nullptr;
    }
  };
  try {
    for (std::size_t k = 0; k < live.size(); ++k) {
      live[k].bytes = d.sizes[(draw_count - 1 - k) & (draw_count - 1)];
      live[k].stream = (t + static_cast<unsigned>(k)) % sc.streams;
      live[k].ptr = s.allocate(live[k].bytes, live[k].stream);
    }
  } catch (const std::exception& e) {
    free_all();
    state.SkipWithError(fmt::format("filling the working set failed: {}", e.what()).c_str());
    return;
  }
  std::size_t i = 0;
  for (auto _ : state) {
    block& b = live[d.slots[i & (draw_count - 1)]];
    s.deallocate(b.ptr, b.bytes, b.stream);
    b.ptr = nullptr;
    b.bytes = d.sizes[i & (draw_count - 1)];
    b.stream = (t + static_cast<unsigned>(i)) % sc.streams;
    ++i;
    try {
      b.ptr = s.allocate(b.bytes, b.stream);
    } catch (const std::exception& e) {
      state.SkipWithError(fmt::format("allocate({}) failed: {}", b.bytes, e.what()).c_str());
      break;
    }
  }
  free_all();
}

void run(benchmark::State& state, const std::string& name, const config& cfg, const scenario& sc) {
  subject* s = nullptr;
  try {
    s = &acquire_subject(name, cfg);
  } catch (const std::exception& e) {
    state.SkipWithError(fmt::format("{} unavailable: {}", name, e.what()).c_str());
    return;
  }
  const draws d = make_draws(sc, state.thread_index());
  if (sc.kind == pattern::pairs) {
    run_pairs(state, *s, sc, d);
  } else {
    run_working_set(state, *s, sc, d);
  }
  try {
    s->quiesce();
  } catch (const std::exception& e) {
    state.SkipWithError(fmt::format("synchronizing failed: {}", e.what()).c_str());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * 2);
}

std::vector<scenario> scenarios() {
  std::vector<scenario> list;
  for (const size_range& sizes : {large_sizes, small_sizes}) {
    const std::size_t live = sizes.hi == large_sizes.hi ? 16 : 256;
    for (const pattern kind : {pattern::pairs, pattern::working_set}) {
      for (const unsigned streams : {1U, 4U}) {
        list.push_back({kind, sizes, streams, kind == pattern::working_set ? live : 0});
      }
    }
  }
  return list;
}

void register_benchmarks(const bench_options& options) {
  for (const std::string& name : options.policies) {
    for (const scenario& sc : scenarios()) {
      const std::string title = fmt::format("{}/{}/{}/streams:{}", name,
                                            sc.kind == pattern::pairs ? "pairs" : "working_set", sc.sizes.name,
                                            sc.streams);
      const config cfg = options.cfg;
      benchmark::internal::Benchmark* b = benchmark::RegisterBenchmark(
          title.c_str(), [name, cfg, sc](benchmark::State& state) { run(state, name, cfg, sc); });
      b->UseRealTime()->Threads(1)->Threads(8);
      if (sc.sizes.hi == small_sizes.hi) b->Repetitions(3)->ReportAggregatesOnly(true);
    }
  }
}

constexpr const char* usage_text =
    "usage: bench_micro [--policy=NAME[,NAME...]|all] [--backend=sim|cuda] [--conf=key:value,...]\n"
    "                   [Google Benchmark flags, e.g. --benchmark_min_time=0.05 --benchmark_format=json]\n"
    "NAME: a policy expression, or cudaMalloc / cudaMallocAsync (cuda only). Default: all.\n";

}  // namespace

int micro_main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  config base;
  base.backend = backend_kind::sim;
  base.sim_capacity = 141 * GiB;
  auto options = parse_bench_options(argc, argv, {}, cuda_runtime_subjects(), base);
  if (!options.ok()) {
    std::fprintf(stderr, "bench_micro: %s\n%s", std::string(util::to_std(options.status().message())).c_str(),
                 usage_text);
    return 2;
  }
  const bool cuda = options->cfg.backend == backend_kind::cuda;
  std::vector<std::string> chosen;
  for (const std::string& name : options->policies) {
    if (is_cuda_runtime_subject(name) && !cuda) {
      if (options->all_policies) continue;
      std::fprintf(stderr, "bench_micro: %s runs on the GPU only (--backend=cuda)\n", name.c_str());
      return 2;
    }
    chosen.push_back(name);
  }
  options->policies = chosen;
  if (cuda) {
    const std::string missing = cuda_runtime_unavailable_reason();
    if (!missing.empty()) std::fprintf(stderr, "bench_micro: cudaMalloc and cudaMallocAsync are skipped: %s\n", missing.c_str());
  }
  benchmark::AddCustomContext("fragctl_backend", std::string(backend_kind_name(options->cfg.backend)));
  register_benchmarks(*options);
  benchmark::RunSpecifiedBenchmarks();
  release_subject();
  benchmark::Shutdown();
  return 0;
}

}  // namespace fragctl::bench

int main(int argc, char** argv) { return fragctl::bench::micro_main(argc, argv); }
