// The checkpoint store on a Llama-like layer stack (docs/checkpoint.md,
// "Measured"): forward puts one checkpoint per layer and spins for the
// layer's compute, backward gets, checks and drops them, under device budgets
// given as percentages of the checkpoints' total.
//
// Per budget it reports, over --iterations timed iterations after one
// warm-up:
//   d2h_GBps, h2d_GBps   bandwidth of the store's copy path, from a pass
//                        without compute (bytes copied / pass time)
//   d2h_vs_plain, h2d_vs_plain   those over a plain pinned memcpy_async of
//                        one checkpoint, measured in the same run
//   hidden_pct           share of that copy time hidden behind compute:
//                        1 - (iteration - iteration at 100%) / copy-only pass
//   fwd_stall_ms, bwd_stall_ms   forward and backward time over the 100% run
//   errors               pattern words that came back wrong (must be 0)
//   pins_steady          pinned allocations during the timed iterations (0)
// Benchmark flags go to Google Benchmark; ours: --layers=24
// --layer_mib=256 --forward_ms=8 --backward_ms=16 --budgets=100,50,10
// --iterations=3 --prefetch_depth=2 --policy=caching. The backend comes from
// FRAGCTL_BACKEND (sim: add FRAGCTL_CONF=sim_backed:true).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "device_work.hpp"
#include "fragctl/checkpoint/store.hpp"
#include "fragctl/config.hpp"
#include "fragctl/policy.hpp"
#include "util/strings.hpp"

namespace fragctl::bench {
namespace {

using clock = std::chrono::steady_clock;
using checkpoint::store;
using checkpoint::store_options;

struct settings {
  int layers = 24;
  std::size_t layer_bytes = 256 * MiB;
  double forward_ms = 8;
  double backward_ms = 16;
  std::vector<int> budgets{100, 50, 10};
  int iterations = 3;
  std::size_t prefetch_depth = 2;
  std::string policy = "caching";  ///< of the allocator the region comes from (one block)
};

struct pass_times {
  double forward = 0;
  double backward = 0;
  [[nodiscard]] double total() const { return forward + backward; }
};

double seconds_since(clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); }

/// The device, the allocator the store's region comes from, and results
/// shared between benchmarks (plain copy bandwidth, the 100% reference).
class bench_context {
 public:
  explicit bench_context(settings s) : s_(std::move(s)) {
    absl::StatusOr<config> cfg = config_from_environment();
    if (!cfg.ok()) throw std::runtime_error(std::string(cfg.status().message()));
    backend_ = make_backend(*cfg);
    allocator_ = make_policy(s_.policy, *cfg, *backend_);
    work_ = make_device_work(*backend_, *allocator_);
    compute_ = backend_->create_stream();
  }
  ~bench_context() {
    // Everything that may still wait on the compute stream goes first: the
    // allocator synchronizes the streams of its pending frees when destroyed.
    work_.reset();
    allocator_.reset();
    backend_->destroy_stream(compute_);
  }

  const settings& setup() const { return s_; }
  device_backend& backend() { return *backend_; }
  device_allocator& allocator() { return *allocator_; }
  device_work& work() { return *work_; }
  stream_t compute() const { return compute_; }
  std::size_t total_bytes() const { return s_.layer_bytes * static_cast<std::size_t>(s_.layers); }

  /// One training iteration on `st`; with `compute`, fill, spin and check.
  pass_times iterate(store& st, int iteration, bool compute) {
    pass_times t;
    const clock::time_point start = clock::now();
    for (int l = 0; l < s_.layers; ++l) {
      void* p = st.put(l, s_.layer_bytes, compute_);
      if (compute) {
        work_->fill(p, s_.layer_bytes, seed(l, iteration), compute_);
        work_->spin(s_.forward_ms, compute_);
      }
    }
    backend_->synchronize_stream(compute_);
    st.synchronize();
    t.forward = seconds_since(start);
    const clock::time_point middle = clock::now();
    for (int l = s_.layers - 1; l >= 0; --l) {
      const void* p = st.get(l, compute_);
      if (compute) {
        work_->check(p, s_.layer_bytes, seed(l, iteration), compute_);
        work_->spin(s_.backward_ms, compute_);
      }
      st.drop(l);
    }
    backend_->synchronize_stream(compute_);
    st.synchronize();
    t.backward = seconds_since(middle);
    st.reset();
    return t;
  }

  store_options options(int percent) const {
    store_options o;
    o.device_budget = std::max(s_.layer_bytes, total_bytes() / 100 * static_cast<std::size_t>(percent));
    o.prefetch_depth = s_.prefetch_depth;
    return o;
  }

  /// Forward and backward times with compute and every checkpoint on the device.
  const pass_times& reference() {
    if (!reference_) {
      store st(*allocator_, options(100));
      iterate(st, 0, true);
      pass_times sum;
      for (int i = 1; i <= s_.iterations; ++i) {
        const pass_times t = iterate(st, i, true);
        sum.forward += t.forward / s_.iterations;
        sum.backward += t.backward / s_.iterations;
      }
      reference_ = sum;
    }
    return *reference_;
  }

  /// Bytes per second of a plain memcpy_async of one checkpoint between
  /// device memory and pinned host memory.
  double plain_bandwidth(bool to_host) {
    auto& cached = to_host ? plain_d2h_ : plain_h2d_;
    if (cached > 0) return cached;
    void* dev = allocator_->allocate(s_.layer_bytes, compute_);
    void* host = backend_->allocate_host(s_.layer_bytes);
    if (host == nullptr) throw std::bad_alloc();
    const auto copy = [&] {
      if (to_host) {
        backend_->memcpy_async(host, dev, s_.layer_bytes, compute_);
      } else {
        backend_->memcpy_async(dev, host, s_.layer_bytes, compute_);
      }
    };
    copy();
    backend_->synchronize_stream(compute_);
    constexpr int copies = 8;
    const clock::time_point start = clock::now();
    for (int i = 0; i < copies; ++i) copy();
    backend_->synchronize_stream(compute_);
    cached = static_cast<double>(copies * s_.layer_bytes) / seconds_since(start);
    backend_->free_host(host, s_.layer_bytes);
    allocator_->deallocate(dev, s_.layer_bytes, compute_);
    return cached;
  }

 private:
  static std::uint32_t seed(int layer, int iteration) {
    return static_cast<std::uint32_t>(layer * 7919 + iteration * 104729 + 1);
  }

  settings s_;
  std::unique_ptr<device_backend> backend_;
  std::unique_ptr<device_allocator> allocator_;
  std::unique_ptr<device_work> work_;
  stream_t compute_ = nullptr;
  std::optional<pass_times> reference_;
  double plain_d2h_ = 0, plain_h2d_ = 0;
};

bench_context* context = nullptr;

void plain_copy(benchmark::State& state, bool to_host) {
  double bw = 0;
  for (auto _ : state) {
    bw = context->plain_bandwidth(to_host);
    state.SetIterationTime(static_cast<double>(context->setup().layer_bytes) / bw);
  }
  state.counters["GBps"] = bw / 1e9;
}

void budget_run(benchmark::State& state, int percent) {
  bench_context& c = *context;
  const pass_times ref = c.reference();
  store st(c.allocator(), c.options(percent));

  // Copy path alone: no compute, so each pass lasts as long as its copies.
  c.iterate(st, 0, false);  // warm-up: pins the host tier, learns the sequence
  checkpoint::store_stats before = st.stats();
  const pass_times copy_only = c.iterate(st, 0, false);
  checkpoint::store_stats after = st.stats();
  const auto to_host = static_cast<double>(after.bytes_to_host - before.bytes_to_host);
  const auto to_device = static_cast<double>(after.bytes_to_device - before.bytes_to_device);

  c.iterate(st, 0, true);
  const std::uint64_t pins_before = st.stats().host_arena.pin_calls;
  pass_times sum;
  int iteration = 1;
  for (auto _ : state) {
    const pass_times t = c.iterate(st, iteration++, true);
    sum.forward += t.forward;
    sum.backward += t.backward;
    state.SetIterationTime(t.total());
  }
  const double n = std::max(1, iteration - 1);
  const std::uint64_t errors = c.work().errors();
  const checkpoint::store_stats end = st.stats();

  state.counters["budget_GiB"] = static_cast<double>(end.device_budget) / static_cast<double>(GiB);
  state.counters["offloaded_GiB"] = to_host / static_cast<double>(GiB);
  state.counters["fwd_ms"] = sum.forward / n * 1e3;
  state.counters["bwd_ms"] = sum.backward / n * 1e3;
  state.counters["fwd_stall_ms"] = (sum.forward / n - ref.forward) * 1e3;
  state.counters["bwd_stall_ms"] = (sum.backward / n - ref.backward) * 1e3;
  if (to_host > 0) {
    const double d2h = to_host / copy_only.forward;
    const double h2d = to_device / copy_only.backward;
    state.counters["d2h_GBps"] = d2h / 1e9;
    state.counters["h2d_GBps"] = h2d / 1e9;
    state.counters["d2h_vs_plain"] = d2h / c.plain_bandwidth(true);
    state.counters["h2d_vs_plain"] = h2d / c.plain_bandwidth(false);
    const double exposed = (sum.total() / n - ref.total()) / copy_only.total();
    state.counters["hidden_pct"] = 100.0 * std::clamp(1.0 - exposed, 0.0, 1.0);
  }
  state.counters["on_demand_gets"] = static_cast<double>(end.gets_on_demand);
  state.counters["pins_steady"] = static_cast<double>(end.host_arena.pin_calls - pins_before);
  state.counters["errors"] = static_cast<double>(errors);
  state.SetLabel(std::string(end.host_provider) + ", " + std::string(c.work().kind()));
  if (errors != 0) state.SkipWithError("checkpoint data came back wrong");
  std::fprintf(stderr, "checkpoint store stats (budget %d%%): %s\n", percent, checkpoint::to_json(end).c_str());
}

/// Reads our flags (--name=value) and leaves the rest.
settings parse_flags(int& argc, char** argv) {
  settings s;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const auto value = [&](std::string_view name) -> std::optional<std::string_view> {
      const std::string prefix = "--" + std::string(name) + "=";
      if (!arg.starts_with(prefix)) return std::nullopt;
      return arg.substr(prefix.size());
    };
    const auto number = [](std::string_view v) {
      double d = 0;
      if (!util::parse_double(v, d)) throw std::runtime_error("bad number: " + std::string(v));
      return d;
    };
    if (auto v = value("layers")) {
      s.layers = static_cast<int>(number(*v));
    } else if (auto v2 = value("layer_mib")) {
      s.layer_bytes = static_cast<std::size_t>(number(*v2) * static_cast<double>(MiB));
    } else if (auto v3 = value("forward_ms")) {
      s.forward_ms = number(*v3);
    } else if (auto v4 = value("backward_ms")) {
      s.backward_ms = number(*v4);
    } else if (auto v5 = value("iterations")) {
      s.iterations = static_cast<int>(number(*v5));
    } else if (auto v6 = value("prefetch_depth")) {
      s.prefetch_depth = static_cast<std::size_t>(number(*v6));
    } else if (auto v7 = value("policy")) {
      s.policy = std::string(*v7);
    } else if (auto v8 = value("budgets")) {
      s.budgets.clear();
      for (std::string_view part : util::split(*v8, ',')) s.budgets.push_back(static_cast<int>(number(part)));
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  return s;
}

}  // namespace
}  // namespace fragctl::bench

int main(int argc, char** argv) {
  using namespace fragctl::bench;
  try {
    const settings s = parse_flags(argc, argv);
    benchmark::Initialize(&argc, argv);
    bench_context ctx(s);
    context = &ctx;
    benchmark::RegisterBenchmark("plain_copy/d2h", plain_copy, true)->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("plain_copy/h2d", plain_copy, false)->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
    for (int percent : s.budgets) {
      benchmark::RegisterBenchmark(("checkpoint/budget_pct:" + std::to_string(percent)).c_str(), budget_run, percent)
          ->UseManualTime()
          ->Iterations(s.iterations)
          ->Unit(benchmark::kMillisecond);
    }
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    context = nullptr;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_checkpoint: %s\n", e.what());
    return 1;
  }
  return 0;
}
