// bench_stress: fragmentation stress under a fixed capacity
// (docs/benchmarks-guide.md, "Fragmentation stress").
//
//   bench_stress [--mode=all|largest|smallest|traces] [--scenario=NAME[,NAME...]|all]
//                [--policy=NAME[,NAME...]|all] [--backend=sim|cuda] [--conf=key:value,...]
//                [--cap=24GiB] [--scale=1] [--steps=N] [--timing-backend=none|sim|cuda]
//                [--json=PATH] [--out=DIR]
//
// A cap is on reserved bytes (capped_backend), the bytes a device runs out of.
//  * largest: for each scenario and policy, the largest scale (tokens per
//    step) that completes without out-of-memory under --cap, by doubling and
//    bisection to 1%.
//  * smallest: for each scenario and policy at --scale, the smallest cap (to
//    2 MiB) at which the workload completes, and the per-step series of
//    reserved and requested bytes of the uncapped run. With
//    --timing-backend, the workload is then run there uncapped and at that
//    cap, timing every malloc and free: allocator time per step, and what
//    the cap costs.
//  * traces: writes each scenario at --scale as fragctl CSV into --out
//    (stress_<scenario>.trace.csv.gz), for `fragctl replay`.
// Searches run on --backend (default sim: the byte figures of sim and cuda
// agree, and sim is fast). Results are one JSON object on stdout or --json:
// {"largest": [...], "smallest": [...]}; progress goes to stderr.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "bench_options.hpp"
#include "fmt/format.h"
#include "fragctl/trace.hpp"
#include "nlohmann/json.hpp"
#include "runner.hpp"
#include "search.hpp"
#include "util/strings.hpp"

namespace fragctl::bench {

namespace {

constexpr std::size_t cap_step = 2 * MiB;

struct stress_options {
  bench_options common;
  std::string mode = "all";
  std::vector<std::string> scenarios;
  std::size_t cap = 24 * GiB;
  double scale = 1;
  std::size_t steps = 0;
  std::string timing_backend = "none";
  std::string json_path;
  std::string out_dir = ".";
};

stress_options parse(int argc, char** argv) {
  config base;
  base.backend = backend_kind::sim;
  base.sim_capacity = 141 * GiB;
  base.log_level = "error";  // out-of-memory is an expected outcome of a probe
  auto common = parse_bench_options(
      argc, argv, {"mode", "scenario", "cap", "scale", "steps", "timing-backend", "json", "out"}, {}, base);
  if (!common.ok()) throw std::invalid_argument(std::string(util::to_std(common.status().message())));
  stress_options o;
  o.common = *std::move(common);
  o.mode = extra_flag(o.common, "mode", "all");
  if (o.mode != "all" && o.mode != "largest" && o.mode != "smallest" && o.mode != "traces")
    throw std::invalid_argument(fmt::format("--mode: expected all, largest, smallest or traces, got '{}'", o.mode));
  const std::string scenarios = extra_flag(o.common, "scenario", "all");
  if (scenarios == "all") {
    o.scenarios = gen::scenario_names();
  } else {
    for (const std::string_view s : util::split(scenarios, ',')) o.scenarios.emplace_back(util::trim(s));
  }
  for (const std::string& s : o.scenarios) {
    bool known = false;
    for (const std::string& n : gen::scenario_names()) known = known || n == s;
    if (!known) throw std::invalid_argument(fmt::format("--scenario: unknown scenario '{}'", s));
  }
  auto cap = parse_size(extra_flag(o.common, "cap", "24GiB"));
  if (!cap.ok() || *cap == 0) throw std::invalid_argument("--cap: expected a size such as 24GiB");
  o.cap = *cap;
  if (!util::parse_double(extra_flag(o.common, "scale", "1"), o.scale) || !(o.scale > 0))
    throw std::invalid_argument("--scale: expected a positive number");
  std::uint64_t steps = 0;
  if (!util::parse_u64(extra_flag(o.common, "steps", "0"), steps)) throw std::invalid_argument("--steps: expected a count");
  o.steps = steps;
  o.timing_backend = extra_flag(o.common, "timing-backend", "none");
  if (o.timing_backend != "none" && !parse_backend_kind(o.timing_backend).ok())
    throw std::invalid_argument("--timing-backend: expected none, sim or cuda");
  o.json_path = extra_flag(o.common, "json", "");
  o.out_dir = extra_flag(o.common, "out", ".");
  return o;
}

run_result run_once(const stress_options& o, const std::string& scenario, const std::string& policy, double scale,
                    std::size_t cap, const config& cfg, bool series) {
  const gen::plan plan = gen::generate(scenario, scale, o.steps);
  run_options ro;
  ro.scenario = scenario;
  ro.scale = scale;
  ro.policy = policy;
  ro.cfg = cfg;
  ro.cap = cap;
  ro.series = series;
  return run_plan(plan, ro);
}

std::string largest_json(const stress_options& o, const std::string& scenario, const std::string& policy) {
  run_result at_largest;
  const search::scale_result found = search::largest_scale(
      [&](double scale) {
        run_result r = run_once(o, scenario, policy, scale, o.cap, o.common.cfg, false);
        const bool ok = r.completed;
        if (ok) at_largest = std::move(r);
        return ok;
      },
      1.0, 1.0 / 64, 64.0);
  std::fprintf(stderr, "largest  %-16s %-22s cap %s: scale %.3f (%d probes)\n", scenario.c_str(), policy.c_str(),
               util::human_bytes(o.cap).c_str(), found.scale, found.probes);
  if (found.found && at_largest.scale != found.scale)  // the last success was not the answer's run
    at_largest = run_once(o, scenario, policy, found.scale, o.cap, o.common.cfg, false);
  return nlohmann::ordered_json{
      {"scenario", scenario},
      {"allocator", policy},
      {"backend", backend_kind_name(o.common.cfg.backend)},
      {"cap", o.cap},
      {"found", found.found},
      {"largest_scale", json_number(found.scale)},
      {"probes", found.probes},
      {"run", found.found ? to_json_value(at_largest, false) : nlohmann::ordered_json(nullptr)},
  }.dump();
}

std::string smallest_json(const stress_options& o, const std::string& scenario, const std::string& policy) {
  const run_result uncapped = run_once(o, scenario, policy, o.scale, 0, o.common.cfg, true);
  search::cap_result found;
  if (uncapped.completed) {
    found = search::smallest_cap(
        [&](std::size_t cap) { return run_once(o, scenario, policy, o.scale, cap, o.common.cfg, false).completed; },
        uncapped.peak_live - 1, uncapped.peak_reserved, cap_step);
  }
  const double over_live =
      found.found ? static_cast<double>(found.cap) / static_cast<double>(uncapped.peak_live) : 0;
  std::fprintf(stderr, "smallest %-16s %-22s scale %.2f: cap %s = %.3f x peak live (%d probes)\n",
               scenario.c_str(), policy.c_str(), o.scale, util::human_bytes(found.cap).c_str(), over_live,
               found.probes);
  nlohmann::ordered_json timing = nullptr;
  if (o.timing_backend != "none" && found.found) {
    config cfg = o.common.cfg;
    cfg.backend = *parse_backend_kind(o.timing_backend);
    timing = {{"backend", o.timing_backend}};
    for (const std::size_t cap : {std::size_t{0}, found.cap}) {
      nlohmann::ordered_json one;
      try {
        one = to_json_value(run_once(o, scenario, policy, o.scale, cap, cfg, true), true);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_stress: %s with %s on %s: %s\n", scenario.c_str(), policy.c_str(),
                     o.timing_backend.c_str(), e.what());
        one = {{"error", e.what()}};
      }
      timing[cap == 0 ? "uncapped" : "capped"] = std::move(one);
    }
  }
  return nlohmann::ordered_json{
      {"scenario", scenario},
      {"allocator", policy},
      {"backend", backend_kind_name(o.common.cfg.backend)},
      {"scale", json_number(o.scale)},
      {"peak_live", uncapped.peak_live},
      {"found", found.found},
      {"smallest_cap", found.cap},
      {"cap_over_peak_live", json_number(over_live)},
      {"probes", found.probes},
      {"uncapped", to_json_value(uncapped, true)},
      {"timing", std::move(timing)},
  }.dump();
}

int write_traces(const stress_options& o) {
  int status = 0;
  for (const std::string& scenario : o.scenarios) {
    const gen::plan plan = gen::generate(scenario, o.scale, o.steps);
    trace t;
    t.name = "stress_" + scenario;
    t.format = "fragctl-csv";
    std::vector<std::int64_t> index_in_step(plan.step_end.size() + 1, 0);
    for (const gen::event& e : plan.events) {
      trace_event te;
      te.kind = e.alloc ? trace_event::action::alloc : trace_event::action::free;
      te.addr = e.id * min_alignment;
      te.size = e.bytes;
      te.time_us = static_cast<std::int64_t>(e.step) * 1'000'000 + index_in_step[e.step]++;
      t.events.push_back(te);
    }
    const std::string path = fmt::format("{}/stress_{}.trace.csv.gz", o.out_dir, scenario);
    if (const absl::Status s = write_trace_csv(t, path); !s.ok()) {
      std::fprintf(stderr, "bench_stress: %s\n", std::string(util::to_std(s.message())).c_str());
      status = 1;
      continue;
    }
    std::fprintf(stderr, "wrote %s (%zu events, peak live %s)\n", path.c_str(), t.events.size(),
                 util::human_bytes(plan.peak_live).c_str());
  }
  return status;
}

int stress_main(int argc, char** argv) {
  stress_options o;
  try {
    o = parse(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "bench_stress: %s\nRun with no options for every scenario and policy; "
                 "see the comment at the top of stress_main.cpp or docs/benchmarks-guide.md.\n", e.what());
    return 2;
  }
  if (o.mode == "traces") return write_traces(o);

  // Each result is written as soon as it is known, so a run cut short by a
  // time limit still leaves the finished ones (bench_tables.py reads a
  // truncated document).
  std::FILE* out = o.json_path.empty() ? stdout : std::fopen(o.json_path.c_str(), "w");
  if (out == nullptr) {
    std::fprintf(stderr, "bench_stress: cannot write %s\n", o.json_path.c_str());
    return 1;
  }
  int status = 0;
  bool first_section = true;
  const auto section = [&](const char* name, auto&& fn) {
    std::fprintf(out, "%s\"%s\": [", first_section ? "{" : ",\n", name);
    first_section = false;
    bool first = true;
    for (const std::string& scenario : o.scenarios) {
      for (const std::string& policy : o.common.policies) {
        try {
          const std::string item = fn(scenario, policy);
          std::fprintf(out, "%s\n  %s", first ? "" : ",", item.c_str());
          std::fflush(out);
          first = false;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "bench_stress: %s with %s: %s\n", scenario.c_str(), policy.c_str(), e.what());
          status = 1;
        }
      }
    }
    std::fprintf(out, "\n]");
  };
  if (o.mode == "all" || o.mode == "largest")
    section("largest", [&](const std::string& s, const std::string& p) { return largest_json(o, s, p); });
  if (o.mode == "all" || o.mode == "smallest")
    section("smallest", [&](const std::string& s, const std::string& p) { return smallest_json(o, s, p); });
  std::fprintf(out, "}\n");
  if (out != stdout) std::fclose(out);
  return status;
}

}  // namespace

}  // namespace fragctl::bench

int main(int argc, char** argv) { return fragctl::bench::stress_main(argc, argv); }
