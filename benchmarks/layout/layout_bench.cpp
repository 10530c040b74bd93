// bench_layout: what the arena's step plan costs to lay a step out
// (allocator_policies/arena/layout.hpp), on steps of the lifetime shapes
// training and inference jobs make (docs/benchmarks.md, "The plan's layout
// indexed by time").
//
//   bench_layout [Google Benchmark options, e.g. --benchmark_filter=short]
//
// One benchmark per shape and step length (3,201 blocks: the declm model's
// step; 37,329: kvgen's), each block one allocation of the step, sizes of
// seven 512-byte multiples, two bins:
//   short   lives of 1-50 allocations (a generation step's)
//   mirror  the first half's blocks live to their mirror in the second half
//           (activations kept by the forward for the backward), the rest
//           a step or two
//   tail    every block lives to the step's end
//   mixed   a ninth live to the step's end, the rest 1-50 allocations
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include "allocator_policies/arena/layout.hpp"

namespace {

using fragctl::arena_detail::greedy_layout;
using fragctl::arena_detail::layout_item;
using fragctl::arena_detail::layout_place;

std::vector<layout_item> step(const std::string& shape, std::uint32_t n) {
  std::vector<layout_item> items;
  items.reserve(n);
  for (std::uint32_t t = 0; t < n; ++t) {
    const std::uint64_t bytes = 512u * (1 + t % 7);
    std::uint32_t due = t + 1 + t % 50;
    if (shape == "mirror") due = t < n / 2 ? n - t : t + 2;
    if (shape == "tail") due = n;
    if (shape == "mixed" && t % 9 == 0) due = n;
    items.push_back({t, due, bytes});
  }
  return items;
}

void lay_out(benchmark::State& state, const std::string& shape) {
  const std::vector<layout_item> items = step(shape, static_cast<std::uint32_t>(state.range(0)));
  const std::vector<std::uint64_t> bins{1 << 20, 1 << 22};
  std::vector<layout_place> places;
  std::vector<std::uint64_t> used;
  for (auto _ : state) {
    benchmark::DoNotOptimize(greedy_layout(items, bins, places, used));
  }
  state.counters["blocks"] = static_cast<double>(items.size());
}

}  // namespace

int main(int argc, char** argv) {
  for (const char* shape : {"short", "mirror", "tail", "mixed"}) {
    benchmark::RegisterBenchmark((std::string("layout/") + shape).c_str(),
                                 [shape](benchmark::State& s) { lay_out(s, shape); })
        ->Arg(3201)
        ->Arg(37329)
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
