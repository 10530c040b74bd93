// Harnesses of the parsers that read what users and files give fragctl:
// FRAGCTL_CONF and FRAGCTL_POLICY, the three trace formats, the pickles
// PyTorch snapshots are saved as, statistics reports, and the report reader
// of `fragctl report`. Each takes any byte string; a parser must answer it with a value
// or an error status, never crash, hang or leak, and what it accepts must
// survive a round trip through the matching writer. Violations throw
// invariant_violation.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fragctl/config.hpp"
#include "fragctl/error.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/run_report.hpp"
#include "fragctl/sim_backend.hpp"
#include "fragctl/stats.hpp"
#include "fragctl/stats_export.hpp"
#include "fragctl/trace.hpp"
#include "fuzz/harness/alloc_sequence.hpp"
#include "fuzz/harness/block_model.hpp"
#include "fuzz/harness/byte_reader.hpp"
#include "nlohmann/json.hpp"
#include "trace/pickle_reader.hpp"

namespace fragctl::fuzz {

inline std::string_view as_text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

/// The option values a fuzzed configuration may use to build a policy:
/// files are neither read nor written, and sizes stay within what one run
/// may take in time and memory (a huge but valid size is a slow run, not a bug).
inline config bounded(config cfg) {
  cfg.sim_backed = false;
  cfg.sim_capacity = std::min(cfg.sim_capacity, 64 * GiB);
  cfg.sim_granularity = std::max(cfg.sim_granularity, 64 * KiB);
  cfg.arena_size = std::min(cfg.arena_size, 4 * cfg.sim_capacity);
  cfg.warmup_bytes = std::min(cfg.warmup_bytes, GiB);
  cfg.warmup_profile.clear();
  cfg.report_path.clear();
  cfg.trace_path.clear();
  cfg.slab_reserve = std::min<std::size_t>(cfg.slab_reserve, 64);
  return cfg;
}

/// FRAGCTL_POLICY and FRAGCTL_CONF: input is "<policy>\n<conf>". Parses both;
/// when both are valid, builds the policy on a sim device and serves a few
/// requests. A bad value must be an error status naming the key (or
/// invalid_argument from a constructor), never a crash.
inline void run_config(const std::uint8_t* data, std::size_t size) {
  const std::string_view text = as_text(data, size);
  const std::size_t newline = text.find('\n');
  const std::string_view policy = text.substr(0, newline);
  const std::string_view conf = newline == std::string_view::npos ? std::string_view() : text.substr(newline + 1);

  if (auto bytes = parse_size(conf); bytes.ok()) {
    auto again = parse_size(std::to_string(*bytes));
    check(again.ok() && *again == *bytes, "parse_size(\"{}\") = {} does not read back", conf, *bytes);
  }
  (void)parse_backend_kind(policy);
  const absl::Status valid = validate_policy(policy);
  auto cfg = parse_config(conf);
  if (!cfg.ok()) {
    const std::string message(cfg.status().message());
    check(message.starts_with("FRAGCTL_CONF: "), "error without its variable: {}", message);
    return;
  }
  if (!valid.ok()) return;

  sim_options options;
  const config c = bounded(*cfg);
  options.capacity = c.sim_capacity;
  options.granularity = c.sim_granularity;
  options.virtual_memory = c.sim_virtual_memory;
  sim_backend sim(options);
  {
    std::unique_ptr<device_allocator> a;
    try {
      a = make_policy(policy, c, sim);
    } catch (const invalid_argument&) {
      check_device_empty(sim, "after a constructor refused its configuration");
      return;
    } catch (const std::bad_alloc&) {
      check_device_empty(sim, "after a constructor ran out of memory");
      return;
    } catch (const backend_error& e) {
      throw invariant_violation(fmt::format("policy \"{}\" with \"{}\": backend_error: {}", policy, conf, e.what()));
    }
    block_model model;
    for (const std::size_t n : {std::size_t{1}, std::size_t{4096}, MiB + 1, 3 * MiB, 64 * MiB}) {
      try {
        void* p = a->allocate(n);
        model.insert(p, n, a->allocation_size(n), nullptr);
      } catch (const std::bad_alloc&) {
      } catch (const backend_error& e) {
        throw invariant_violation(fmt::format("policy \"{}\" with \"{}\": allocate({}): backend_error: {}", policy,
                                              conf, n, e.what()));
      }
    }
    check(a->state().allocated == model.rounded(), "allocated {} != {} for policy \"{}\" with \"{}\"",
          a->state().allocated, model.rounded(), policy, conf);
    while (!model.empty()) {
      const auto [p, b] = model.at(0);
      check(a->try_deallocate(p, b.bytes).status == free_status::ok, "free failed");
      model.erase(p);
    }
  }
  check_device_empty(sim, "after the policy was destroyed");
}

/// A path for round trips through a writer, unique to this process.
inline const std::string& scratch_path(std::string_view suffix) {
  static const std::string path = fmt::format("/tmp/fragctl-fuzz-{}{}", ::getpid(), suffix);
  return path;
}

/// Trace readers (the format is detected from the content, so one target
/// covers all three). A trace read must summarize consistently and read back
/// event for event after write_trace_csv.
inline void run_trace(const std::uint8_t* data, std::size_t size) {
  auto t = parse_trace(as_text(data, size), "fuzz");
  if (!t.ok()) {
    check(!t.status().message().empty(), "an error without a message");
    return;
  }
  const trace_summary s = summarize(*t);
  check(s.allocs + s.frees == t->events.size(), "summary counts {} + {} events of {}", s.allocs, s.frees,
        t->events.size());
  check(s.unmatched_frees <= s.frees && s.live_at_end <= s.allocs, "summary is inconsistent");

  const std::string& path = scratch_path(".trace.csv");
  const absl::Status written = write_trace_csv(*t, path);
  check(written.ok(), "write_trace_csv: {}", std::string(written.message()));
  auto back = read_trace(path);
  std::remove(path.c_str());
  check(back.ok(), "a trace fragctl wrote does not read back: {}", std::string(back.status().message()));
  check(back->events == t->events, "{} events written, {} read back differently", t->events.size(),
        back->events.size());
}

/// Nesting depth of a JSON value (a scalar is 0), without recursion.
inline std::size_t json_depth(const nlohmann::json& root) {
  std::size_t deepest = 0;
  std::vector<std::pair<const nlohmann::json*, std::size_t>> todo = {{&root, 0}};
  while (!todo.empty()) {
    const auto [j, depth] = todo.back();
    todo.pop_back();
    if (!j->is_structured()) continue;
    deepest = std::max(deepest, depth + 1);
    for (const auto& child : *j) todo.emplace_back(&child, depth + 1);
  }
  return deepest;
}

/// The pickle reader (PyTorch snapshots saved by _dump_snapshot): any bytes
/// give a JSON value within the depth limit or an error naming the file,
/// never run an opcode that constructs an object, and a pickle read through
/// parse_trace is a trace or an error too.
inline void run_pickle(const std::uint8_t* data, std::size_t size) {
  const std::string_view text = as_text(data, size);
  trace_detail::pickle_options options;
  options.max_depth = 64;
  options.max_output_bytes = 1u << 24;
  auto j = trace_detail::read_pickle(text, "fuzz", options);
  if (!j.ok()) {
    const std::string message(j.status().message());
    check(message.starts_with("fuzz: pickle"), "an error that does not name the file: {}", message);
  } else {
    check(json_depth(*j) <= options.max_depth, "a value nested deeper than the limit {}", options.max_depth);
  }
  if (trace_detail::looks_like_pickle(text)) {
    auto t = parse_trace(text, "fuzz");
    const std::string message(t.status().message());
    check(t.ok() || message.starts_with("fuzz"), "a trace error that does not name the file: {}", message);
  }
}

/// Statistics and report JSON: what is accepted must read back the same
/// after to_json / stats_export_to_json, and export to Prometheus text.
inline void run_stats_json(const std::uint8_t* data, std::size_t size) {
  const std::string_view text = as_text(data, size);
  if (auto s = stats_from_json(text); s.ok()) {
    auto back = stats_from_json(to_json(*s));
    check(back.ok(), "to_json output does not read back: {}", std::string(back.status().message()));
    check(back->allocator == s->allocator && back->requested.peak == s->requested.peak &&
              back->reserved.peak == s->reserved.peak && back->allocations == s->allocations &&
              back->size_histogram == s->size_histogram && back->backend_calls.calls == s->backend_calls.calls,
          "statistics changed across to_json and stats_from_json");
    check(!to_prometheus(*s).empty(), "empty Prometheus text");
  }
  if (auto r = stats_export_from_json(text); r.ok()) {
    std::vector<stats_export_entry> entries;
    for (const allocator_stats& s : *r) entries.push_back({s, std::nullopt});
    auto back = stats_export_from_json(stats_export_to_json(entries, "request"));
    check(back.ok() && back->size() == r->size(), "stats_export_to_json output does not read back");
  }
}

/// The reader of `fragctl report` (run_reports_from_json: a report document,
/// one statistics object, or `fragctl replay --json` output): a value or an
/// error naming the file, never an exception; what it accepts has at least
/// one allocator and renders as text and as a comparison.
inline void run_report_json(const std::uint8_t* data, std::size_t size) {
  auto runs = run_reports_from_json(as_text(data, size), "fuzz.json");
  if (!runs.ok()) {
    check(std::string_view(runs.status().message().data(), runs.status().message().size()).starts_with("fuzz.json"),
          "an error without the file: {}",
          std::string(runs.status().message()));
    return;
  }
  check(!runs->empty(), "a report of no allocators was accepted");
  for (const run_report& r : *runs) check(!render_text(r).empty(), "empty text for \"{}\"", r.name);
  check(!render_comparison(*runs).empty(), "empty comparison");
}

}  // namespace fragctl::fuzz
