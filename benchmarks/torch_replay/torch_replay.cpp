// torch_replay: the incumbent's side of the benchmarks. Replays fragctl
// traces, and the stress workloads of benchmarks/stress, through PyTorch's
// own CUDA caching allocator (c10::cuda::CUDACachingAllocator), measured the
// way fragctl measures its policies (docs/benchmarks-guide.md).
//
//   torch_replay replay TRACE... [--label NAME] [--cap BYTES]
//   torch_replay stress [--mode all|largest|smallest] [--scenario NAME,...]
//                       [--cap BYTES] [--scale X] [--steps N] [--label NAME]
//
// The allocator's settings come from PYTORCH_CUDA_ALLOC_CONF as in any
// PyTorch process (run once with it unset for native, once with
// "expandable_segments:True"); the label defaults to torch-native or
// torch-expandable accordingly. A cap is set with setMemoryFraction, which
// PyTorch applies to its reserved bytes (what fragctl's stress cap counts too).
//
// replay prints one JSON array in the shape of `fragctl replay --json`; stress
// prints {"largest": [...], "smallest": [...]} in the shape of bench_stress.
// Every malloc and free is timed alone with fragctl's replay clock
// (src/util/op_clock.hpp: the CPU's time-stamp counter where it is invariant,
// else steady_clock); peaks come from
// the allocator's own statistics (reserved_bytes, requested_bytes).
//
// Built by tools/gpu/bench.sh against the installed torch (its own CMake
// project; not part of fragctl's build). Links libc10 and libc10_cuda only;
// the device's total memory is read from the driver (dlopen libcuda.so.1).
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "../stress/search.hpp"
#include "../stress/stress_result.hpp"
#include "../stress/workload_generators.hpp"
#include "trace_csv.hpp"
#include "../../src/util/op_clock.hpp"

namespace torch_replay {

namespace alloc = c10::cuda::CUDACachingAllocator;
using clock_type = std::chrono::steady_clock;
using fragctl::bench::json_number;
using json = nlohmann::ordered_json;

constexpr c10::DeviceIndex device = 0;

// Set when a run's reserved bytes exceeded its cap: PyTorch did not apply the
// memory fraction (reported as "cap_enforced": false).
bool cap_ignored = false;

std::int64_t elapsed_ns(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
}

// Total device memory as the driver reports it (what setMemoryFraction's
// fraction is of).
std::size_t device_total_bytes() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) throw std::runtime_error("libcuda.so.1 not found");
  using init_fn = int (*)(unsigned);
  using get_fn = int (*)(int*, int);
  using total_fn = int (*)(std::size_t*, int);
  auto init = reinterpret_cast<init_fn>(dlsym(lib, "cuInit"));
  auto get = reinterpret_cast<get_fn>(dlsym(lib, "cuDeviceGet"));
  auto total = reinterpret_cast<total_fn>(dlsym(lib, "cuDeviceTotalMem_v2"));
  int dev = 0;
  std::size_t bytes = 0;
  if (init == nullptr || get == nullptr || total == nullptr || init(0) != 0 || get(&dev, device) != 0 ||
      total(&bytes, dev) != 0)
    throw std::runtime_error("cannot read the device's total memory from the driver");
  return bytes;
}

std::string default_label() {
  const char* conf = std::getenv("PYTORCH_CUDA_ALLOC_CONF");
  if (conf == nullptr) conf = std::getenv("PYTORCH_ALLOC_CONF");
  std::string c = conf == nullptr ? "" : conf;
  std::transform(c.begin(), c.end(), c.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return c.find("expandable_segments:true") != std::string::npos ? "torch-expandable" : "torch-native";
}

template <class S>
std::uint64_t device_memory_calls(const S& s) {
  if constexpr (requires { s.num_device_alloc; s.num_device_free; }) {
    return static_cast<std::uint64_t>(s.num_device_alloc + s.num_device_free);
  } else {
    return static_cast<std::uint64_t>(s.segment[0].allocated + s.segment[0].freed);
  }
}

// Bytes callers asked for (PyTorch 2.0 and later); older versions only have
// the rounded allocated bytes.
template <class S>
const auto& requested_stat(const S& s) {
  if constexpr (requires { s.requested_bytes; }) {
    return s.requested_bytes[0];
  } else {
    return s.allocated_bytes[0];
  }
}

// Everything the allocator holds goes back; statistics restart.
void reset_allocator(std::size_t total, std::size_t cap) {
  alloc::emptyCache();
  alloc::resetPeakStats(device);
  alloc::resetAccumulatedStats(device);
  const double fraction = cap == 0 ? 1.0 : std::min(1.0, (static_cast<double>(cap) + 0.5) / static_cast<double>(total));
  alloc::setMemoryFraction(fraction, device);
}

// --- replay -----------------------------------------------------------------------

std::string replay_json(const trace& t, const std::string& label, std::size_t total, std::size_t cap) {
  reset_allocator(total, cap);
  struct live_block {
    void* ptr;
    bool failed;
  };
  std::unordered_map<std::uint64_t, live_block> live;
  std::map<std::uint64_t, cudaStream_t> streams;
  for (const event& e : t.events) {
    if (e.stream != 0 && !streams.contains(e.stream))
      streams.emplace(e.stream, c10::cuda::getStreamFromPool(false, device).stream());
  }
  const fragctl::util::op_clock clock;  // as fragctl's replay times its operations
  std::vector<std::int64_t> samples;
  samples.reserve(t.events.size());
  std::uint64_t ooms = 0, unknown = 0, skipped = 0, lost = 0;
  const auto timed_free = [&](void* p) {
    const fragctl::util::op_clock::ticks t0 = clock.start();
    alloc::raw_delete(p);
    samples.push_back(clock.stop() - t0);
  };
  for (const event& e : t.events) {
    if (e.alloc) {
      if (const auto old = live.find(e.addr); old != live.end()) {
        ++lost;
        if (!old->second.failed) timed_free(old->second.ptr);
        live.erase(old);
      }
      const cudaStream_t stream = e.stream == 0 ? nullptr : streams.at(e.stream);
      const fragctl::util::op_clock::ticks t0 = clock.start();
      void* p = nullptr;
      try {
        p = alloc::raw_alloc_with_stream(e.size, stream);
      } catch (const c10::OutOfMemoryError&) {
        ++ooms;
        live.emplace(e.addr, live_block{nullptr, true});
        continue;
      }
      samples.push_back(clock.stop() - t0);
      live.emplace(e.addr, live_block{p, false});
    } else {
      const auto it = live.find(e.addr);
      if (it == live.end()) {
        ++unknown;
        continue;
      }
      if (it->second.failed) {
        ++skipped;
      } else {
        timed_free(it->second.ptr);
      }
      live.erase(it);
    }
  }
  const auto s = alloc::getDeviceStats(device);
  const auto requested = static_cast<std::size_t>(requested_stat(s).peak);
  const auto reserved = static_cast<std::size_t>(s.reserved_bytes[0].peak);
  const std::uint64_t calls = device_memory_calls(s);
  for (const auto& [addr, b] : live) {
    if (!b.failed) alloc::raw_delete(b.ptr);
  }
  const std::uint64_t operations = samples.size();
  std::vector<std::int64_t> copy = samples;
  const double median = clock.to_ns(fragctl::bench::median_of(samples));
  const double p99 = clock.to_ns(fragctl::bench::percentile_of(copy, 0.99));
  std::int64_t timed = 0;
  for (const std::int64_t ticks : samples) timed += ticks;
  const double ratio = requested == 0 ? 0.0 : static_cast<double>(reserved) / static_cast<double>(requested);
  return json{
      {"trace", t.name},
      {"policy", label},
      {"backend", "cuda"},
      {"peak_requested", requested},
      {"peak_reserved", reserved},
      {"reserved_over_requested", json_number(ratio)},
      {"backend_memory_calls", calls},
      {"backend_calls", calls},
      {"ooms", ooms},
      {"unknown_frees", unknown},
      {"skipped_frees", skipped},
      {"lost_frees", lost},
      {"operations", operations},
      {"median_ns", json_number(median)},
      {"p99_ns", json_number(p99)},
      {"total_ms", json_number(clock.to_ns(static_cast<double>(timed)) / 1e6)},
      {"clock_overhead_ns", json_number(clock.overhead_ns())},
      {"clock", clock.source()},
      {"cap", cap},
      {"torch_stats", {{"num_alloc_retries", s.num_alloc_retries}, {"num_ooms", s.num_ooms}}},
  }.dump();
}

// --- stress -----------------------------------------------------------------------

fragctl::bench::run_result run_plan(const fragctl::bench::gen::plan& plan, const std::string& scenario, double scale,
                                    const std::string& label, std::size_t total, std::size_t cap, bool series) {
  using fragctl::bench::step_sample;
  reset_allocator(total, cap);
  fragctl::bench::run_result r;
  r.scenario = scenario;
  r.allocator = label;
  r.backend = "cuda";
  r.scale = scale;
  r.cap = cap;
  r.peak_live = plan.peak_live;
  r.completed = true;

  std::unordered_map<std::uint64_t, void*> live;
  std::vector<std::int64_t> samples;
  samples.reserve(plan.events.size());
  std::size_t requested_peak = 0, reserved_peak = 0;
  step_sample step;
  std::size_t next_end = 0;
  // Peaks within a step come from the allocator's own peak statistics,
  // reset at each step's start.
  const auto close_step = [&] {
    const auto s = alloc::getDeviceStats(device);
    step.requested_peak = static_cast<std::size_t>(requested_stat(s).peak);
    step.reserved_peak = static_cast<std::size_t>(s.reserved_bytes[0].peak);
    step.requested_end = static_cast<std::size_t>(requested_stat(s).current);
    step.reserved_end = static_cast<std::size_t>(s.reserved_bytes[0].current);
    requested_peak = std::max(requested_peak, step.requested_peak);
    reserved_peak = std::max(reserved_peak, step.reserved_peak);
    r.series.push_back(step);
    step = {};
    step.step = r.series.size();
    alloc::resetPeakStats(device);
  };
  // A cap PyTorch does not apply (reserved bytes above it at a step's end
  // check) ends the run as a failure: the run needed more than the cap.
  bool over_cap = false;
  for (std::size_t i = 0; i < plan.events.size() && !over_cap; ++i) {
    const auto& e = plan.events[i];
    const bool in_step = e.step < plan.step_end.size();
    if (e.alloc) {
      const auto t0 = clock_type::now();
      void* p = nullptr;
      try {
        p = alloc::raw_alloc_with_stream(e.bytes, nullptr);
      } catch (const c10::OutOfMemoryError& oom) {
        r.completed = false;
        r.failed_step = static_cast<long>(e.step);
        r.failure = oom.what_without_backtrace();
        break;
      }
      samples.push_back(elapsed_ns(t0, clock_type::now()));
      if (in_step) step.alloc_ns += samples.back();
      live.emplace(e.id, p);
    } else {
      const auto it = live.find(e.id);
      const auto t0 = clock_type::now();
      alloc::raw_delete(it->second);
      samples.push_back(elapsed_ns(t0, clock_type::now()));
      if (in_step) step.alloc_ns += samples.back();
      live.erase(it);
    }
    if (next_end < plan.step_end.size() && i + 1 == plan.step_end[next_end]) {
      close_step();
      ++next_end;
      if (cap != 0 && r.series.back().reserved_peak > cap) {
        over_cap = true;
        cap_ignored = true;
        r.completed = false;
        r.failed_step = static_cast<long>(e.step);
        r.failure = "the allocator held " + std::to_string(r.series.back().reserved_peak) +
                    " reserved bytes, above the cap of " + std::to_string(cap) + " (cap not enforced)";
      }
    }
  }
  const auto s = alloc::getDeviceStats(device);
  r.peak_requested = std::max(requested_peak, static_cast<std::size_t>(requested_stat(s).peak));
  r.peak_reserved = std::max(reserved_peak, static_cast<std::size_t>(s.reserved_bytes[0].peak));
  r.reserved_over_requested =
      r.peak_requested == 0 ? 0 : static_cast<double>(r.peak_reserved) / static_cast<double>(r.peak_requested);
  r.backend_memory_calls = device_memory_calls(s);
  r.retries = static_cast<std::uint64_t>(s.num_alloc_retries);
  r.operations = samples.size();
  std::vector<std::int64_t> copy = samples;
  r.median_ns = fragctl::bench::median_of(samples);
  r.p99_ns = fragctl::bench::percentile_of(copy, 0.99);
  fragctl::bench::summarize_steps(r);
  if (!series) r.series.clear();
  for (const auto& [id, p] : live) alloc::raw_delete(p);
  return r;
}

struct stress_options {
  std::string mode = "all";
  std::vector<std::string> scenarios = fragctl::bench::gen::scenario_names();
  std::size_t cap = std::size_t{24} << 30;
  double scale = 1;
  std::size_t steps = 0;
};

std::string largest_json(const stress_options& o, const std::string& scenario, const std::string& label,
                         std::size_t total) {
  cap_ignored = false;
  fragctl::bench::run_result at;
  const auto found = fragctl::bench::search::largest_scale(
      [&](double scale) {
        auto r = run_plan(fragctl::bench::gen::generate(scenario, scale, o.steps), scenario, scale, label, total,
                          o.cap, false);
        const bool ok = r.completed;
        if (ok) at = std::move(r);
        return ok;
      },
      1.0, 1.0 / 64, 64.0);
  std::fprintf(stderr, "largest  %-16s %-18s: scale %.3f (%d probes)\n", scenario.c_str(), label.c_str(), found.scale,
               found.probes);
  if (found.found && at.scale != found.scale)
    at = run_plan(fragctl::bench::gen::generate(scenario, found.scale, o.steps), scenario, found.scale, label, total,
                  o.cap, false);
  return json{
      {"scenario", scenario},
      {"allocator", label},
      {"backend", "cuda"},
      {"cap", o.cap},
      {"found", found.found},
      {"largest_scale", json_number(found.scale)},
      {"probes", found.probes},
      {"cap_enforced", !cap_ignored},
      {"run", found.found ? fragctl::bench::to_json_value(at, false) : json(nullptr)},
  }.dump();
}

std::string smallest_json(const stress_options& o, const std::string& scenario, const std::string& label,
                          std::size_t total) {
  cap_ignored = false;
  const auto plan = fragctl::bench::gen::generate(scenario, o.scale, o.steps);
  const auto uncapped = run_plan(plan, scenario, o.scale, label, total, 0, true);
  fragctl::bench::search::cap_result found;
  if (uncapped.completed) {
    found = fragctl::bench::search::smallest_cap(
        [&](std::size_t cap) { return run_plan(plan, scenario, o.scale, label, total, cap, false).completed; },
        plan.peak_live - 1, uncapped.peak_reserved, std::size_t{2} << 20);
  }
  const double over = found.found ? static_cast<double>(found.cap) / static_cast<double>(plan.peak_live) : 0;
  std::fprintf(stderr, "smallest %-16s %-18s: cap %.2f GiB = %.3f x peak live (%d probes)\n", scenario.c_str(),
               label.c_str(), static_cast<double>(found.cap) / (1 << 30), over, found.probes);
  json timing = nullptr;
  if (found.found) {
    const auto capped = run_plan(plan, scenario, o.scale, label, total, found.cap, true);
    timing = {{"backend", "cuda"},
              {"uncapped", fragctl::bench::to_json_value(uncapped, true)},
              {"capped", fragctl::bench::to_json_value(capped, true)}};
  }
  return json{
      {"scenario", scenario},
      {"allocator", label},
      {"backend", "cuda"},
      {"scale", json_number(o.scale)},
      {"peak_live", plan.peak_live},
      {"found", found.found},
      {"smallest_cap", found.cap},
      {"cap_over_peak_live", json_number(over)},
      {"probes", found.probes},
      {"cap_enforced", !cap_ignored},
      {"uncapped", fragctl::bench::to_json_value(uncapped, true)},
      {"timing", std::move(timing)},
  }.dump();
}

// --- command line -------------------------------------------------------------------

std::size_t parse_bytes(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  const std::string unit = end;
  double mult = 1;
  if (unit == "KiB" || unit == "K") mult = 1024.0;
  else if (unit == "MiB" || unit == "M") mult = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "G") mult = 1024.0 * 1024 * 1024;
  else if (!unit.empty() && unit != "B") throw std::invalid_argument("bad size '" + text + "'");
  if (!(v > 0)) throw std::invalid_argument("bad size '" + text + "'");
  return static_cast<std::size_t>(v * mult);
}

constexpr const char* usage =
    "usage: torch_replay replay TRACE... [--label NAME] [--cap BYTES]\n"
    "       torch_replay stress [--mode all|largest|smallest] [--scenario NAME,...] [--cap BYTES]\n"
    "                           [--scale X] [--steps N] [--label NAME]\n"
    "PYTORCH_CUDA_ALLOC_CONF configures the allocator (unset: native; expandable_segments:True).\n";

int run(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(usage, stderr);
    return 2;
  }
  const std::string command = argv[1];
  std::vector<std::string> positional;
  std::map<std::string, std::string> flags;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) == 0) {
      std::string value;
      if (const auto eq = a.find('='); eq != std::string::npos) {
        value = a.substr(eq + 1);
        a = a.substr(0, eq);
      } else if (i + 1 < argc) {
        value = argv[++i];
      }
      flags[a.substr(2)] = value;
    } else {
      positional.push_back(a);
    }
  }
  const std::string label = flags.contains("label") ? flags["label"] : default_label();
  const std::size_t total = device_total_bytes();
  alloc::init(c10::cuda::device_count());

  if (command == "replay") {
    if (positional.empty()) {
      std::fputs(usage, stderr);
      return 2;
    }
    const std::size_t cap = flags.contains("cap") ? parse_bytes(flags["cap"]) : 0;
    // Each result is printed as soon as it is known, so a run cut short by
    // a time limit still leaves the finished ones (bench_tables.py reads a
    // truncated array).
    std::printf("[");
    int status = 0;
    bool first = true;
    for (const std::string& path : positional) {
      try {
        const trace t = read_trace(path);
        std::printf("%s\n  %s", first ? "" : ",", replay_json(t, label, total, cap).c_str());
        std::fflush(stdout);
        first = false;
        std::fprintf(stderr, "torch_replay: %s with %s done\n", t.name.c_str(), label.c_str());
      } catch (const std::exception& e) {
        std::fprintf(stderr, "torch_replay: %s: %s\n", path.c_str(), e.what());
        status = 1;
      }
    }
    std::printf("\n]\n");
    return status;
  }
  if (command == "stress") {
    stress_options o;
    if (flags.contains("mode")) o.mode = flags["mode"];
    if (flags.contains("cap")) o.cap = parse_bytes(flags["cap"]);
    if (flags.contains("scale")) o.scale = std::stod(flags["scale"]);
    if (flags.contains("steps")) o.steps = std::stoul(flags["steps"]);
    if (flags.contains("scenario") && flags["scenario"] != "all") {
      o.scenarios.clear();
      std::string list = flags["scenario"];
      for (std::size_t start = 0;;) {
        const std::size_t comma = list.find(',', start);
        o.scenarios.push_back(list.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    }
    std::printf("{");
    bool first_section = true;
    for (const std::string section : {"largest", "smallest"}) {
      if (o.mode != "all" && o.mode != section) continue;
      std::printf("%s\"%s\": [", first_section ? "" : ",\n", section.c_str());
      first_section = false;
      bool first = true;
      for (const std::string& scenario : o.scenarios) {
        try {
          const std::string item = section == "largest" ? largest_json(o, scenario, label, total)
                                                        : smallest_json(o, scenario, label, total);
          std::printf("%s\n  %s", first ? "" : ",", item.c_str());
          std::fflush(stdout);
          first = false;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "torch_replay: %s: %s\n", scenario.c_str(), e.what());
        }
      }
      std::printf("\n]");
    }
    std::printf("}\n");
    return 0;
  }
  std::fputs(usage, stderr);
  return 2;
}

}  // namespace torch_replay

int main(int argc, char** argv) {
  try {
    return torch_replay::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_replay: %s\n", e.what());
    return 1;
  }
}
