// fragctl replay: replays traces through policies and prints one row (or one
// JSON object) per trace and policy.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "command.hpp"
#include "fmt/format.h"
#include "fragctl/error.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/process_hooks.hpp"
#include "fragctl/progress_bar.hpp"
#include "fragctl/replay.hpp"
#include "util/strings.hpp"

namespace fragctl::cli {

namespace {

// The exit status of a replay that met a trace without events (and no worse).
constexpr int exit_empty_trace = 3;

std::string policy_lines() {
  std::string text;
  for (const policy_info& p : policies())
    text += fmt::format("  {:<10}  {}{}\n", p.name, p.help, p.wraps_upstream ? " (wrapper)" : "");
  return text;
}

struct column {
  std::string_view header;
  bool left;
  std::size_t width;
};

class result_table {
 public:
  result_table(std::size_t trace_width, std::size_t policy_width) {
    cols_ = {{"trace", true, trace_width},
             {"policy", true, policy_width},
             {"backend", true, 7},
             {"peak requested", false, 0},
             {"peak reserved", false, 0},
             {"reserved/requested", false, 0},
             {"backend memory calls", false, 0},
             {"OOMs", false, 0},
             {"unknown frees", false, 0},
             {"median ns/op", false, 0},
             {"p99 ns/op", false, 0},
             {"total ms", false, 0}};
    for (column& c : cols_) c.width = std::max(c.width, c.header.size());
  }

  void print_header() const {
    std::vector<std::string> cells;
    for (const column& c : cols_) cells.emplace_back(c.header);
    print(cells);
  }

  void print_row(const replay_result& r) const {
    print({util::printable(r.trace), r.policy, r.backend, util::human_bytes(r.peak_requested),
           util::human_bytes(r.peak_reserved), fmt::format("{:.3f}", r.reserved_over_requested),
           fmt::format("{}", r.backend_memory_calls), fmt::format("{}", r.ooms),
           fmt::format("{}", r.unknown_frees), fmt::format("{:.0f}", r.median_ns),
           fmt::format("{:.0f}", r.p99_ns), fmt::format("{:.1f}", r.total_ms)});
  }

 private:
  void print(const std::vector<std::string>& cells) const {
    std::string line;
    for (std::size_t i = 0; i < cols_.size(); ++i) {
      if (i > 0) line += "  ";
      line += cols_[i].left ? fmt::format("{:<{}}", cells[i], cols_[i].width)
                            : fmt::format("{:>{}}", cells[i], cols_[i].width);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }

  std::vector<column> cols_;
};

}  // namespace

std::vector<std::string> policy_list(const arguments& args) {
  const auto given = args.get("policy");
  if (!given) return {""};  // the default policy of the backend
  if (*given == "all") return replay_policy_set();
  std::vector<std::string> list;
  for (const std::string_view p : util::split(*given, ',')) {
    const std::string name(util::trim(p));
    if (const absl::Status s = validate_policy(name); !s.ok() || name.empty())
      throw usage_error(fmt::format("--policy: {}\nRun 'fragctl policies' for the policies.",
                                    name.empty() ? "empty policy name" : std::string(s.message())));
    list.push_back(name);
  }
  return list;
}

config replay_config(const arguments& args) {
  config cfg;
  if (const auto conf = args.get("conf")) {
    auto parsed = parse_config(*conf, cfg);
    if (!parsed.ok()) throw usage_error(fmt::format("--conf: {}", std::string(parsed.status().message())));
    cfg = *std::move(parsed);
  }
  if (const auto backend = args.get("backend")) {
    auto kind = parse_backend_kind(*backend);
    if (!kind.ok()) throw usage_error(fmt::format("--backend: {}", std::string(kind.status().message())));
    cfg.backend = *kind;
  }
  if (const auto capacity = args.get("capacity")) {
    // Parsed as the sim_capacity option, so that its limits (2^62 bytes) hold here too.
    auto parsed = parse_config(fmt::format("sim_capacity:{}", *capacity), cfg);
    if (!parsed.ok() || parsed->sim_capacity == 0 || capacity->find(',') != std::string::npos)
      throw usage_error(
          fmt::format("--capacity: expected a size such as 80GiB, at most 2^62 bytes, got '{}'", *capacity));
    if (cfg.backend == backend_kind::cuda || cfg.backend == backend_kind::hip)
      throw usage_error("--capacity sets the simulated device's size; it needs --backend sim or auto");
    cfg.sim_capacity = parsed->sim_capacity;
  }
  return cfg;
}

std::vector<named_path> config_outputs(const config& cfg) {
  return {{"--conf trace:", expand_output_path(cfg.trace_path)},
          {"--conf report:", expand_output_path(cfg.report_path)},
          {"--conf prometheus:", expand_output_path(cfg.prometheus_path)}};
}

std::vector<named_path> config_inputs(const config& cfg) {
  return {{"--conf warmup_profile:", cfg.warmup_profile}};
}

std::vector<named_path> positional_inputs(const arguments& args, std::string_view name) {
  std::vector<named_path> inputs;
  for (const std::string& path : args.positional) inputs.push_back({name, path});
  return inputs;
}

replay_lag replay_lag_option(const arguments& args, const config& cfg) {
  replay_lag lag;
  if (const auto us = args.get("gpu-lag-us"); us && (!util::parse_i64(*us, lag.us) || lag.us < 0))
    throw usage_error(fmt::format("--gpu-lag-us: expected microseconds (0 or more), got '{}'", *us));
  if (const auto n = args.get("gpu-lag-events"); n && !util::parse_u64(*n, lag.events))
    throw usage_error(fmt::format("--gpu-lag-events: expected a count of events, got '{}'", *n));
  if (lag.enabled() && (cfg.backend == backend_kind::cuda || cfg.backend == backend_kind::hip))
    throw usage_error("--gpu-lag-us and --gpu-lag-events model a GPU on the sim backend; they need --backend sim or auto");
  return lag;
}

const command_spec& replay_spec() {
  static const command_spec spec = {
      "replay",
      "TRACE...",
      "Replay allocation traces through policies: peak bytes held against live, cost per call.",
      "Each TRACE (fragctl CSV, PyTorch snapshot JSON or pickle, or RMM log CSV, plain or .gz) is replayed\n"
      "once per policy through a fresh allocator. Printed per trace and policy: peak requested\n"
      "(live) bytes, peak reserved bytes (held from the backend), their ratio (1.000 is ideal),\n"
      "backend memory calls, OOMs, frees of unknown addresses, the median and 99th\n"
      "percentile wall time of one allocate or deallocate, and all of them added up (total ms).\n"
      "docs/replay.md has the details.\n\n"
      "Policies:\n" +
          policy_lines() +
          "\nA cut trace (its writer was killed: rows after its last end row) replays what it holds, with a\n"
          "warning on stderr; JSON results say \"trace_complete\": true, false (cut) or null (no end row).\n"
          "\nExit status: 0 success, 1 unreadable trace, failed replay, or (with --require-complete) a trace\n"
          "that does not show it is whole (skipped), 2 usage error, 3 a trace with no allocation or free to\n"
          "replay (skipped; the others replay).\n"
          "Example: fragctl replay gpt2m.trace.csv.gz --policy caching,arena --backend sim\n",
      {{"policy", "NAME", "policy expression, a comma-separated list, or 'all' (default: the backend's default)"},
       {"backend", "KIND", "sim, cuda, hip or auto (default auto: a GPU when present, else sim)"},
       {"capacity", "BYTES", "simulated device size, e.g. 141GiB (default: sim_capacity, 80GiB)"},
       {"conf", "KEY:VALUE,...", "options as in FRAGCTL_CONF (docs/configuration.md)"},
       {"gpu-lag-us", "US",
        "model a GPU this many microseconds of trace time behind the CPU (sim only; docs/replay.md)"},
       {"gpu-lag-events", "N", "model a GPU this many trace events behind the CPU (sim only)"},
       snapshot_device_option,
       require_complete_option,
       {"json", "", "print one JSON array of results instead of the table"}}};
  return spec;
}

int run_replay(const arguments& args) {
  if (args.positional.empty())
    throw usage_error("no trace given\nRun 'fragctl replay --help' for its options.");
  const config cfg = replay_config(args);
  std::vector<named_path> inputs = positional_inputs(args, "TRACE");
  for (named_path& in : config_inputs(cfg)) inputs.push_back(std::move(in));
  refuse_shared_outputs(config_outputs(cfg), inputs);
  const std::vector<std::string> policy_names = policy_list(args);
  const bool json = args.has("json");
  const replay_lag lag = replay_lag_option(args, cfg);

  std::size_t trace_width = 5;
  for (const std::string& path : args.positional)
    trace_width = std::max(trace_width, util::printable(trace_name_from_path(path)).size());
  std::size_t policy_width = 8;
  for (const std::string& p : policy_names) policy_width = std::max(policy_width, p.size());
  const result_table table(trace_width, policy_width);
  bool header_printed = false;

  progress_bar progress;
  std::vector<replay_result> results;
  int status = 0;
  for (const std::string& path : args.positional) {
    trace t;
    try {
      t = load_trace(path, args);
    } catch (const usage_error&) {
      throw;
    } catch (const std::runtime_error& e) {  // unreadable: the other traces' results still count
      progress.clear();
      std::fprintf(stderr, "fragctl replay: %s\n", util::printable_lines(e.what()).c_str());
      status = 1;
      continue;
    }
    if (t.completeness != trace_completeness::complete) progress.clear();
    if (!check_completeness("replay", path, t, args)) {
      status = 1;
      continue;
    }
    if (t.events.empty()) {  // a peak of 0 B would read as a result
      progress.clear();
      std::fprintf(stderr, "fragctl replay: %s: %s; skipped\n", util::printable(path).c_str(), empty_trace_note(t).c_str());
      if (status == 0) status = exit_empty_trace;
      continue;
    }
    for (const std::string& policy : policy_names) {
      replay_options options{policy, cfg, progress.callback(fmt::format(
                                              "{} / {}", util::printable(t.name), policy.empty() ? "default" : policy))};
      options.lag = lag;
      try {
        replay_result r = replay(t, options);
        progress.clear();
        if (r.refused != 0) {
          std::fprintf(stderr,
                       "fragctl replay: %s with policy %s: %llu allocation(s) refused as larger than any device "
                       "(over 2^62 bytes); their frees skipped\n",
                       util::printable(t.name).c_str(), r.policy.c_str(), static_cast<unsigned long long>(r.refused));
        }
        if (!json) {
          if (!header_printed) table.print_header();
          header_printed = true;
          table.print_row(r);
        }
        results.push_back(std::move(r));
      } catch (const fragctl::error& e) {
        progress.clear();
        std::fprintf(stderr, "fragctl replay: %s with policy %s: %s\n", util::printable(t.name).c_str(),
                     policy.empty() ? "default" : policy.c_str(), util::printable_lines(e.what()).c_str());
        status = 1;
      }
    }
  }
  if (json) std::printf("%s\n", to_json(results).c_str());
  return status;
}

}  // namespace fragctl::cli
