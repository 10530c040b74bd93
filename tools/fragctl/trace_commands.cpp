// fragctl convert, fragctl info, fragctl policies, and the trace loading the
// commands share.
#include <cstdio>

#include "command.hpp"
#include "core/json_io.hpp"
#include "fmt/format.h"
#include "fragctl/policy.hpp"
#include "nlohmann/json.hpp"
#include "util/strings.hpp"

namespace fragctl::cli {

const option_spec snapshot_device_option = {
    "snapshot-device", "N",
    "PyTorch snapshot: read the trace of device N (default: the first device with events)"};

trace load_trace(const std::string& path, const arguments& args) {
  trace_options options;
  if (const auto device = args.get("snapshot-device")) {
    std::int64_t d = 0;
    if (!util::parse_i64(*device, d) || d < 0 || d > 1024)
      throw usage_error(fmt::format("--snapshot-device: expected a device ordinal, got '{}'", *device));
    options.device = static_cast<int>(d);
  }
  auto t = read_trace(path, options);
  if (!t.ok()) throw std::runtime_error(std::string(t.status().message()));
  return *std::move(t);
}

const option_spec require_complete_option = {
    "require-complete", "",
    "fail (exit status 1) for a trace that does not show it is whole: cut (its writer was killed) or without "
    "an end row (docs/traces.md)"};

bool check_completeness(std::string_view command, const std::string& path, const trace& t, const arguments& args) {
  if (t.completeness == trace_completeness::complete) return true;
  const std::string note = completeness_note(t);
  if (args.has("require-complete")) {
    std::fprintf(stderr, "fragctl %s: %s: %s; refused (--require-complete)\n", std::string(command).c_str(),
                 util::printable(path).c_str(), note.c_str());
    return false;
  }
  if (t.completeness == trace_completeness::cut)
    std::fprintf(stderr, "fragctl %s: warning: %s: %s\n", std::string(command).c_str(), util::printable(path).c_str(),
                 note.c_str());
  return true;
}

nlohmann::ordered_json completeness_json(const trace& t) {
  if (t.completeness == trace_completeness::unknown) return nullptr;
  return t.completeness == trace_completeness::complete;
}

// --- convert ------------------------------------------------------------------

const command_spec& convert_spec() {
  static const command_spec spec = {
      "convert", "IN OUT",
      "Convert a trace in any readable format to fragctl CSV (gzip-compressed when OUT ends in .gz).",
      "IN may be fragctl CSV, a PyTorch snapshot (JSON or the pickle _dump_snapshot() writes) or\n"
      "an RMM logging_resource_adaptor CSV, plain or gzip-compressed. Only allocs and frees are\n"
      "written; the recording allocator's own rows (segment_*, free_completed, ...) are dropped.\n"
      "A cut IN (its writer was killed: docs/traces.md) is written cut too, with a warning, so\n"
      "that OUT does not read as whole.\n",
      {snapshot_device_option}};
  return spec;
}

int run_convert(const arguments& args) {
  if (args.positional.size() != 2)
    throw usage_error(fmt::format("expected IN and OUT, got {} argument(s)\nRun 'fragctl convert --help' for its options.",
                                  args.positional.size()));
  refuse_shared_outputs({{"OUT", args.positional[1]}}, {{"IN", args.positional[0]}});
  const trace t = load_trace(args.positional[0], args);
  (void)check_completeness("convert", args.positional[0], t, args);  // warns for a cut trace: written cut too
  if (const absl::Status s = write_trace_csv(t, args.positional[1]); !s.ok())
    throw std::runtime_error(std::string(s.message()));
  std::printf("%s: %zu events (%s) written to %s; %llu rows not replayable dropped\n",
              util::printable(args.positional[0]).c_str(), t.events.size(), t.format.c_str(),
              util::printable(args.positional[1]).c_str(),
              static_cast<unsigned long long>(t.ignored_rows));
  return 0;
}

// --- info ---------------------------------------------------------------------

const command_spec& info_spec() {
  static const command_spec spec = {
      "info",
      "TRACE...",
      "Summarize traces as the program ran them: events, peak live bytes, streams, duration.",
      "Peak live bytes is the most the program had allocated at once: the floor for the peak\n"
      "requested bytes of any replay, and the denominator of reserved/requested.\n"
      "Overlaps counts allocations whose bytes meet a block still live: memory the traced\n"
      "allocator handed out twice (never, for a correct one; a FRAGCTL_TRACE file checks fragctl).\n"
      "Complete says whether the file shows it is whole: yes (it ends with an end row that counts\n"
      "every row), no (cut: its writer was killed and its tail is missing; a warning on stderr) or\n"
      "unknown (no end marker: an RMM log, another tool's CSV). Exit status: 0, 1 for an unreadable\n"
      "trace, one with overlaps or, with --require-complete, one that is not complete, 2 usage error.\n",
      {snapshot_device_option, require_complete_option, {"json", "", "print one JSON array instead of text"}}};
  return spec;
}

int run_info(const arguments& args) {
  if (args.positional.empty())
    throw usage_error("no trace given\nRun 'fragctl info --help' for its options.");
  nlohmann::ordered_json all = nlohmann::ordered_json::array();
  int status = 0;
  for (const std::string& path : args.positional) {
    const trace t = load_trace(path, args);
    const trace_summary s = summarize(t);
    if (!check_completeness("info", path, t, args)) status = 1;
    if (s.overlapping_allocs != 0) status = 1;
    if (args.has("json")) {
      all.push_back({{"trace", t.name},
                     {"path", path},
                     {"format", t.format},
                     {"complete", completeness_json(t)},
                     {"events", t.events.size()},
                     {"allocs", s.allocs},
                     {"frees", s.frees},
                     {"ignored_rows", t.ignored_rows},
                     {"peak_live_bytes", s.peak_live_bytes},
                     {"largest_request", s.largest_request},
                     {"streams", s.streams},
                     {"live_at_end", s.live_at_end},
                     {"unmatched_frees", s.unmatched_frees},
                     {"lost_frees", s.lost_frees},
                     {"duration_us", s.duration_us},
                     {"overlapping_allocs", s.overlapping_allocs},
                     {"first_overlap_event", s.overlapping_allocs != 0
                                                 ? nlohmann::ordered_json(s.first_overlap_event)
                                                 : nlohmann::ordered_json()}});
      continue;
    }
    const char* complete = t.completeness == trace_completeness::complete ? "yes"
                           : t.completeness == trace_completeness::cut    ? "no: cut, its tail is missing"
                                                                          : "unknown: no end marker";
    std::printf(
        "%s (%s, %s)\n  complete        %s\n  events          %zu (%zu allocs, %zu frees; %llu other rows ignored)\n"
        "  peak live       %s (%zu bytes)\n  largest request %s\n  streams         %zu\n"
        "  live at end     %zu blocks\n  unmatched frees %zu\n  lost frees      %zu (allocations at a live "
        "address)\n  duration        %.3f s\n",
        util::printable(t.name).c_str(), util::printable(path).c_str(), t.format.c_str(), complete, t.events.size(),
        s.allocs, s.frees, static_cast<unsigned long long>(t.ignored_rows),
        util::human_bytes(s.peak_live_bytes).c_str(), s.peak_live_bytes, util::human_bytes(s.largest_request).c_str(),
        s.streams, s.live_at_end, s.unmatched_frees, s.lost_frees, static_cast<double>(s.duration_us) / 1e6);
    if (s.overlapping_allocs != 0) {
      // A correct allocator never hands out memory twice: the trace's own
      // allocator did (a fragctl run's trace records what it returned).
      std::printf("  OVERLAPS        %zu allocations meet a live block (the first is allocation or free %zu of the "
                  "trace, from 0): memory handed out twice\n",
                  s.overlapping_allocs, s.first_overlap_event);
    } else {
      std::printf("  overlaps        none\n");
    }
  }
  if (args.has("json")) std::printf("%s\n", detail::dump_json(all).c_str());
  return status;
}

// --- policies -----------------------------------------------------------------

const command_spec& policies_spec() {
  static const command_spec spec = {
      "policies", "",
      "List the allocation policies (FRAGCTL_POLICY, fragctl replay --policy).",
      "Wrappers (buckets, warmup) compose over a base: 'buckets:arena' is buckets with large\n"
      "sizes sent to arena; a wrapper alone runs over the default base.\n",
      {{"json", "", "print one JSON array ({name, kind, help} per policy) instead of text"}}};
  return spec;
}

int run_policies(const arguments& args) {
  if (!args.positional.empty()) throw usage_error("fragctl policies takes no arguments");
  nlohmann::ordered_json all = nlohmann::ordered_json::array();
  for (const policy_info& p : policies()) {
    const char* kind = p.wraps_upstream ? "wrapper" : "base";
    if (args.has("json"))
      all.push_back({{"name", p.name}, {"kind", kind}, {"help", p.help}});
    else
      std::printf("%-10s %-8s %s\n", std::string(p.name).c_str(), kind, std::string(p.help).c_str());
  }
  if (args.has("json")) std::printf("%s\n", detail::dump_json(all).c_str());
  return 0;
}

}  // namespace fragctl::cli
