// fragctl report: a fragmentation report of JSON reports and traces, as
// text, a side-by-side comparison, an HTML page or an SVG memory map.
#include <cstdio>
#include <set>
#include <string_view>

#include "command.hpp"
#include "core/atomic_file.hpp"
#include "core/json_io.hpp"
#include "fmt/format.h"
#include "fragctl/policy.hpp"
#include "fragctl/progress_bar.hpp"
#include "fragctl/run_report.hpp"
#include "fragctl/stats.hpp"
#include "nlohmann/json.hpp"
#include "util/strings.hpp"

namespace fragctl::cli {

namespace {

// As every output (core/atomic_file.hpp): a regular file is replaced whole,
// a device or FIFO (/dev/stdout) written into, anything else refused.
void write_file(const std::string& path, const std::string& content, std::string_view what) {
  if (const absl::Status s = detail::write_file_atomically(path, content, what); !s.ok())
    throw std::runtime_error(std::string(s.message()));
}

std::size_t top_rows(const arguments& args) {
  const auto top = args.get("top");
  if (!top) return text_options{}.top_regions;
  std::uint64_t n = 0;
  if (!util::parse_u64(*top, n) || n == 0 || n > 10000)
    throw usage_error(fmt::format("--top: expected a count from 1 to 10000, got '{}'", *top));
  return n;
}

// One report file of several devices (one process's allocators, one per
// device): these are not alternatives to compare but parts of one job, so
// each gets its own summary headed by its device.
bool one_report_of_several_devices(const std::vector<fragctl::run_report>& runs) {
  if (runs.size() < 2) return false;
  std::set<int> devices;
  for (const fragctl::run_report& r : runs) {
    if (r.kind != "report" || r.source != runs.front().source) return false;
    devices.insert(r.stats.device);
  }
  return devices.size() == runs.size();
}

// --json: one array, an object per run with its statistics (the JSON schema
// of docs/statistics.md).
std::string runs_json(const std::vector<fragctl::run_report>& runs) {
  nlohmann::ordered_json all = nlohmann::ordered_json::array();
  for (const fragctl::run_report& r : runs) {
    all.push_back({{"name", r.name},
                   {"source", r.source},
                   {"kind", r.kind},
                   {"device", r.stats.device},
                   {"stats", nlohmann::ordered_json::parse(to_json(r.stats))}});
  }
  return detail::dump_json(all) + "\n";
}

}  // namespace

const command_spec& report_spec() {
  static const command_spec spec = {
      "report",
      "FILE...",
      "Fragmentation report of JSON reports or traces: text summary, comparison, HTML page, SVG map.",
      "Each FILE is a JSON report (FRAGCTL_REPORT, the C API, Python), the output of\n"
      "`fragctl replay --json`, or a trace in any format `fragctl replay` reads, which is\n"
      "replayed first (on sim with the default policy unless --policy/--backend say otherwise;\n"
      "a comma-separated --policy replays it once per policy).\n\n"
      "One run prints its summary: current and peak requested and reserved bytes, their ratio,\n"
      "external fragmentation, the largest free block, the segments wasting the most bytes, a\n"
      "bar chart of request sizes, backend calls and every OOM with its diagnosis. Several runs\n"
      "(several files, or one report of several allocators) print a side-by-side comparison\n"
      "with the difference in peak reserved; --details adds each run's summary. One report\n"
      "of several devices (one job's allocators) prints a summary per device instead.\n"
      "Reports of several ranks of one job (FRAGCTL_REPORT=run.{rank}.json under torchrun,\n"
      "mpirun or srun) print one table, a row per rank, with the imbalance between ranks and\n"
      "the device memory that is not fragctl's.\n"
      "--json prints the runs' statistics as one JSON array instead of text (for ranks, one\n"
      "object: {ranks, imbalance}).\n\n"
      "--html writes one self-contained page (no network) with the memory maps and, for traces,\n"
      "the timeline of requested vs reserved bytes with OOMs marked. --svg writes the memory map\n"
      "of the first run as SVG. docs/reports.md shows both.\n\n"
      "Exit status: 0 success, 1 unreadable file or failed replay, 2 usage error.\n"
      "Examples:\n"
      "  fragctl report job.report.json\n"
      "  fragctl report gpt2m.trace.csv.gz --policy caching,arena --html gpt2m.html\n"
      "  fragctl report native.json arena.json\n"
      "  fragctl report run.*.json\n",
      {{"html", "OUT", "write the HTML page to OUT"},
       {"svg", "OUT", "write the memory map of the first run as SVG to OUT"},
       {"details", "", "with several runs, print each run's summary after the comparison"},
       {"json", "", "print JSON, not text: [{name, source, kind, device, stats}, ...]; ranks: {ranks, imbalance}"},
       {"top", "N", "rows of the top wasted regions (default 10)"},
       {"policy", "NAME", "traces: policy expression or comma-separated list (default: the backend's default)"},
       {"backend", "KIND", "traces: sim, cuda, hip or auto (default sim)"},
       {"capacity", "BYTES", "traces: simulated device size, e.g. 141GiB (default 80GiB)"},
       {"conf", "KEY:VALUE,...", "traces: options as in FRAGCTL_CONF (docs/configuration.md)"},
       snapshot_device_option}};
  return spec;
}

int run_report(const arguments& args) {
  if (args.positional.empty()) throw usage_error("no file given\nRun 'fragctl report --help' for its options.");
  report_options options;
  options.replay.cfg = replay_config(args);
  if (!args.has("backend")) options.replay.cfg.backend = backend_kind::sim;
  std::vector<named_path> outputs = config_outputs(options.replay.cfg);
  outputs.push_back({"--html", args.get("html").value_or("")});
  outputs.push_back({"--svg", args.get("svg").value_or("")});
  std::vector<named_path> inputs = positional_inputs(args, "FILE");
  for (named_path& in : config_inputs(options.replay.cfg)) inputs.push_back(std::move(in));
  refuse_shared_outputs(outputs, inputs);
  const std::vector<std::string> policies = policy_list(args);
  if (const auto device = args.get("snapshot-device")) {
    std::int64_t d = 0;
    if (!util::parse_i64(*device, d) || d < 0 || d > 1024)
      throw usage_error(fmt::format("--snapshot-device: expected a device ordinal, got '{}'", *device));
    options.trace.device = static_cast<int>(d);
  }
  text_options text;
  text.top_regions = top_rows(args);

  progress_bar progress;
  std::vector<fragctl::run_report> runs;
  for (const std::string& path : args.positional) {
    for (std::size_t i = 0; i < policies.size(); ++i) {
      options.replay.policy = policies[i];
      options.replay.progress = progress.callback(
          fmt::format("{} / {}", util::printable(trace_name_from_path(path)),
                      policies[i].empty() ? "default" : policies[i]));
      auto loaded = load_run_reports(path, options);
      progress.clear();
      if (!loaded.ok()) throw std::runtime_error(std::string(loaded.status().message()));
      const bool replayed = !loaded->empty() && loaded->front().kind == "replay";
      if (replayed && i == 0 && !loaded->front().cut_note.empty())  // as replay and info warn
        std::fprintf(stderr, "fragctl report: warning: %s: %s\n", util::printable(path).c_str(),
                     loaded->front().cut_note.c_str());
      for (fragctl::run_report& r : *loaded) runs.push_back(std::move(r));
      if (!replayed) break;  // a JSON file does not depend on --policy
    }
  }

  if (args.has("json")) {
    std::fputs((runs_are_ranks(runs) ? render_rank_json(runs) : runs_json(runs)).c_str(), stdout);
  } else if (runs.size() == 1) {
    std::fputs(render_text(runs.front(), text).c_str(), stdout);
  } else if (runs_are_ranks(runs)) {
    std::fputs(render_rank_table(runs).c_str(), stdout);
    if (args.has("details")) {
      for (const fragctl::run_report& r : runs) std::printf("\n%s", render_text(r, text).c_str());
    }
  } else if (one_report_of_several_devices(runs)) {
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const fragctl::run_report& r = runs[i];
      std::printf("%s== device %d: %s (%s) ==\n%s", i == 0 ? "" : "\n", r.stats.device,
                  util::printable(r.stats.allocator).c_str(), util::printable(r.source).c_str(),
                  render_text(r, text).c_str());
    }
  } else {
    std::fputs(render_comparison(runs).c_str(), stdout);
    if (args.has("details")) {
      for (const fragctl::run_report& r : runs) std::printf("\n%s", render_text(r, text).c_str());
    }
  }
  if (const auto html = args.get("html")) {
    write_file(*html, render_html(runs), "--html");
    std::fprintf(stderr, "fragctl report: wrote %s\n", util::printable(*html).c_str());
  }
  if (const auto svg = args.get("svg")) {
    const labelled_map* map = nullptr;
    for (const fragctl::run_report& r : runs) {
      for (const labelled_map& m : r.maps) {
        if (m.map.available) {
          map = &m;
          break;
        }
      }
      if (map != nullptr) break;
    }
    if (map == nullptr) throw std::runtime_error("--svg: no run has a memory map (see 'fragctl report --help')");
    write_file(*svg, render_map_svg(*map), "--svg");
    std::fprintf(stderr, "fragctl report: wrote %s\n", util::printable(*svg).c_str());
  }
  return 0;
}

}  // namespace fragctl::cli
