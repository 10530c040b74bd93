// Harness of fuzz_report_render: hostile reports through the reader and
// every renderer of `fragctl report` (issue 27: H1, script in a pool name;
// H3, a report nested 100,000 levels deep).
//
// The input is a program (byte_reader): its first byte picks what is built.
//
// * 'J' then JSON text: read as `fragctl report` reads a file.
// * report: a report document, or `fragctl replay --json` output, whose every
//   string field (reason, allocator, backend, an OOM's verdict and advice,
//   the memory map's allocator, each segment's pool and each block's use; a
//   replay result's trace and policy) is a hostile payload or bytes of the
//   input, and one field, when the program asks, an array nested to a depth
//   around the limit or 100,000 levels.
// * runs: run_reports made directly, so strings need not be UTF-8: the name,
//   source, allocator, backend, advice, map labels and allocator, pools, the
//   replay's trace, policy and backend, the writer's host and launcher;
//   replays with timelines and OOMs; ranks of one job or clashing ones, with
//   any device memory figures.
// * snapshot: a PyTorch snapshot (JSON) with hostile strings and a hostile
//   trace name, replayed on sim, as `fragctl report snapshot.json` does.
//
// A document nested deeper than the limit must be refused naming the file
// and the limit; one within it must not be refused for its depth. Every run
// read is rendered as HTML (all runs), as a standalone SVG (each available
// map), as text, as a comparison and, for ranks, as the rank table and its
// JSON, and checked by markup_check.hpp against the same runs with every
// string made harmless.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/json_io.hpp"
#include "fragctl/run_report.hpp"
#include "fragctl/stats.hpp"
#include "fragctl/trace.hpp"
#include "fuzz/harness/block_model.hpp"
#include "fuzz/harness/byte_reader.hpp"
#include "fuzz/harness/markup_check.hpp"
#include "nlohmann/json.hpp"

namespace fragctl::fuzz {

/// Strings that broke, or could break, a renderer.
inline const std::vector<std::string>& hostile_payloads() {
  static const std::vector<std::string> payloads = {
      "</title></rect></g></svg><script>document.title=\"PWNED\"</script><svg><g><rect><title>",
      "<script>alert(1)</script>",
      "\"><svg onload=alert(1)>",
      "' onmouseover='alert(1)",
      "</style><script>x()</script>",
      "</script><script>x()</script>",
      "<!--",
      "-->",
      "<![CDATA[x]]>",
      "<?xml-stylesheet href=\"x\"?>",
      "&lt;script&gt;",
      "&",
      "&#60;",
      "javascript:alert(1)",
      "<a href=\"javascript:x()\">x</a>",
      "<img src=x onerror=alert(1)>",
      "{} {0} {:>999999}",
      "%s%n%x",
      "\x1b[2J\x1b[31mred\x1b[0m",
      "\x1b]8;;http://x\x07link\x1b]8;;\x07",
      "line\nfake line\r\n",
      std::string("nul\0byte", 8),
      "\x7f\x08\x08\x08",
      "\xc2\x9b"
      "31m",  // C1 CSI
      "\xe2\x80\xae"
      "evil",  // RIGHT-TO-LEFT OVERRIDE
      "\xe2\x81\xa6"
      "isolate",       // LEFT-TO-RIGHT ISOLATE
      "\xe2\x80\xa8",  // LINE SEPARATOR
      "\xef\xbf\xbe",  // U+FFFE
      "\xff\xfe\xfd",  // not UTF-8
      "\xed\xa0\x80",  // a surrogate
      "\xc0\xbc"
      "script",            // overlong '<'
      "\xf4\x90\x80\x80",  // above U+10FFFF
      "",
      "caching",
      std::string(300, '<'),
  };
  return payloads;
}

/// A string from the program: a payload, or up to 63 bytes of the input.
inline std::string next_string(byte_reader& in) {
  const std::uint8_t pick = in.byte();
  const auto& payloads = hostile_payloads();
  if (pick < 160) return payloads[pick % payloads.size()];
  const std::size_t length = pick % 64;
  std::string s;
  for (std::size_t i = 0; i < length; ++i) s.push_back(static_cast<char>(in.byte()));
  return s;
}

/// A byte count: small, a round size, or any 64-bit value.
inline std::uint64_t next_size(byte_reader& in) {
  switch (in.byte() % 4) {
    case 0: return in.integer(1);
    case 1: return std::uint64_t{1} << in.below(64);
    case 2: return in.integer(3) * 512;
    default: return in.integer(8);
  }
}

namespace report_render_detail {

using nlohmann::json;

inline std::string hex(std::uint64_t v) { return fmt::format("{:#x}", v); }

inline json gauge(byte_reader& in) { return json{{"current", next_size(in)}, {"peak", next_size(in)}}; }

inline json statistics(byte_reader& in) {
  json s{{"schema_version", 1 + in.below(stats_schema_version)},
         {"allocator", next_string(in)},
         {"backend", next_string(in)},
         {"device", in.below(8)},
         {"requested_bytes", gauge(in)},
         {"allocated_bytes", gauge(in)},
         {"reserved_bytes", gauge(in)},
         {"allocations", in.integer(2)},
         {"frees", in.integer(2)},
         {"ooms", in.below(4)},
         {"size_histogram", json::array({in.integer(1), in.integer(2), 0, in.integer(1)})}};
  json events = json::array();
  for (std::size_t i = in.below(3); i > 0; --i) {
    static constexpr const char* verdicts[] = {"fragmentation", "capacity", "other_process", "declined"};
    events.push_back({{"sequence", in.integer(2)},
                      {"requested", next_size(in)},
                      {"reserved", next_size(in)},
                      {"cached_free", next_size(in)},
                      {"largest_free_block", next_size(in)},
                      {"device_free", next_size(in)},
                      {"device_total", next_size(in)},
                      {"verdict", in.byte() < 128 ? std::string(verdicts[in.below(4)]) : next_string(in)},
                      {"advice", next_string(in)}});
  }
  s["oom_events"] = std::move(events);
  return s;
}

inline json memory_map(byte_reader& in) {
  static constexpr const char* uses[] = {"live", "free", "pending"};
  json segments = json::array();
  std::uint64_t address = 0x7f0000000000;
  for (std::size_t i = 1 + in.below(3); i > 0; --i) {
    const std::uint64_t size = in.byte() < 16 ? next_size(in) : (1 + in.below(64)) * 2 * MiB;
    json blocks = json::array();
    std::uint64_t at = address;
    for (std::size_t k = in.below(6); k > 0; --k) {
      const std::uint64_t bytes = in.byte() < 16 ? next_size(in) : (1 + in.integer(1)) * 4096;
      blocks.push_back({{"address", hex(at)},
                        {"size", bytes},
                        {"requested", bytes - std::min<std::uint64_t>(bytes, in.below(512))},
                        {"use", in.byte() < 252 ? std::string(uses[in.below(3)]) : next_string(in)},
                        {"stream", hex(in.below(3) * 0x1000)}});
      at += bytes;
    }
    segments.push_back({{"address", hex(address)},
                        {"size", size},
                        {"stream", hex(in.below(3) * 0x1000)},
                        {"pool", next_string(in)},
                        {"blocks", std::move(blocks)}});
    address += size + (std::uint64_t{1} << 30);
  }
  return json{{"available", in.byte() < 224}, {"allocator", next_string(in)}, {"segments", std::move(segments)}};
}

// The report document (or replay output), as text; `depth` > 0 puts an
// array nested that deep in a field of the first allocator.
inline std::string report_text(byte_reader& in, std::size_t& depth) {
  json doc;
  const bool replay_output = in.byte() < 48;
  if (replay_output) {
    doc = json::array();
    for (std::size_t i = 1 + in.below(2); i > 0; --i)
      doc.push_back({{"trace", next_string(in)}, {"policy", next_string(in)}, {"stats", statistics(in)}});
  } else {
    json allocators = json::array();
    for (std::size_t i = 1 + in.below(2); i > 0; --i) {
      json entry = statistics(in);
      if (in.byte() < 200) entry["memory_map"] = memory_map(in);
      allocators.push_back(std::move(entry));
    }
    doc = {{"schema_version", 1}, {"reason", next_string(in)}, {"allocators", std::move(allocators)}};
  }
  // Depths around the limit, counted for the whole document.
  const std::size_t outer = replay_output ? 2 : 3;  // the document, (its list,) the entry
  switch (in.byte() % 8) {
    case 0: depth = detail::json_max_depth - outer; break;      // exactly the limit
    case 1: depth = detail::json_max_depth - outer + 1; break;  // one too deep
    case 2: depth = 100000; break;
    case 3: depth = 1 + in.below(detail::json_max_depth); break;
    default: depth = 0;
  }
  json& first = replay_output ? doc[0] : doc["allocators"][0];
  if (depth > 0) first["nested"] = "@@NESTED@@";
  // json_io's dump: strings that are not UTF-8 become U+FFFD, as a file would hold them.
  std::string text = detail::dump_json(doc, in.byte() % 2 == 0 ? -1 : 1);
  if (depth > 0) {
    const std::size_t at = text.find("\"@@NESTED@@\"");
    text.replace(at, 12, std::string(depth, '[') + std::string(depth, ']'));
    depth += outer;
  }
  return text;
}

inline std::vector<run_report> direct_runs(byte_reader& in) {
  std::vector<run_report> runs;
  for (std::size_t n = 1 + in.below(2); n > 0; --n) {
    run_report r;
    r.name = next_string(in);
    r.source = next_string(in);
    r.kind = in.byte() < 128 ? "replay" : "report";
    allocator_stats& s = r.stats;
    s.allocator = next_string(in);
    s.backend = next_string(in);
    s.requested = {next_size(in), next_size(in)};
    s.allocated = {next_size(in), next_size(in)};
    s.reserved = {next_size(in), next_size(in)};
    s.pool.largest_free_block = next_size(in);
    s.size_histogram[in.below(size_histogram_buckets)] = in.integer(2);
    s.ooms = in.below(3);
    for (std::size_t i = 0; i < s.ooms; ++i) {
      oom_event e;
      e.sequence = in.integer(2);
      e.details.requested = next_size(in);
      e.details.reserved = next_size(in);
      e.verdict = static_cast<oom_verdict>(in.below(4));
      e.advice = next_string(in);
      s.oom_events.push_back(std::move(e));
    }
    for (std::size_t m = in.below(3); m > 0; --m) {
      labelled_map lm;
      lm.label = next_string(in);
      lm.map.available = in.byte() < 224;
      lm.map.allocator = next_string(in);
      std::uintptr_t address = 0x7f0000000000;
      for (std::size_t k = 1 + in.below(3); k > 0; --k) {
        memory_segment seg;
        seg.address = address;
        seg.size = (1 + in.below(16)) * 2 * MiB;
        seg.pool = next_string(in);
        seg.stream = reinterpret_cast<stream_t>(in.below(3) * 0x1000);
        std::uintptr_t at = address;
        for (std::size_t b = in.below(5); b > 0; --b) {
          memory_block block;
          block.address = at;
          block.size = (1 + in.integer(1)) * 4096;
          block.requested = block.size - in.below(512);
          block.use = static_cast<block_use>(in.below(3));
          block.stream = seg.stream;
          seg.blocks.push_back(block);
          at += block.size;
        }
        lm.map.segments.push_back(std::move(seg));
        address += 64 * MiB;
      }
      r.maps.push_back(std::move(lm));
    }
    if (r.kind == "replay") {
      r.replay.trace = next_string(in);
      r.replay.policy = next_string(in);
      r.replay.backend = next_string(in);
      r.replay.operations = in.integer(2);
      r.time.by_time = in.byte() < 128;
      for (std::size_t p = in.below(8); p > 0; --p)
        r.time.points.push_back(
            {r.time.points.size(), static_cast<double>(in.integer(2)), next_size(in) % GiB, next_size(in) % GiB});
      for (std::size_t o = in.below(3); o > 0; --o) r.time.ooms.push_back({in.integer(1), 1.0, 1, 2, 3});
    }
    runs.push_back(std::move(r));
  }
  // Read after every run, so that the runs an input made before ranks
  // existed stay the same: ranks (of one job, or clashing), hosts, launchers.
  for (std::size_t i = 0; i < runs.size(); ++i) {
    if (in.byte() >= 160) continue;
    // An input that ran out reads zeros: distinct ranks of one job of 4.
    runs[i].writer.rank = in.byte() >= 224 ? std::int64_t{0} : static_cast<std::int64_t>(i);
    runs[i].writer.world_size = in.byte() >= 224 ? std::int64_t{1} << in.below(63) : std::int64_t{4};
    runs[i].writer.host = next_string(in);
    runs[i].writer.launcher = next_string(in);
    runs[i].stats.device_memory = {in.byte() < 160, next_size(in), next_size(in), next_size(in), std::nullopt};
  }
  // Read after the ranks, for the same reason: the split of the device
  // memory that is not fragctl's (any figures, consistent or not).
  for (std::size_t i = 0; i < runs.size(); ++i) {
    if (in.byte() >= 128) continue;
    device_memory_split m;
    m.per_process = in.byte() < 128;
    for (std::size_t device_memory_split::*field :
         {&device_memory_split::used, &device_memory_split::this_process, &device_memory_split::fragctl,
          &device_memory_split::other_fragctl, &device_memory_split::graph_pools, &device_memory_split::context,
          &device_memory_split::nccl, &device_memory_split::other, &device_memory_split::other_processes})
      m.*field = next_size(in);
    runs[i].stats.device_memory.split = m;
  }
  return runs;
}

// A PyTorch snapshot of a few events; strings wherever the format has them.
inline std::string snapshot_text(byte_reader& in) {
  static constexpr const char* actions[] = {"alloc", "free_requested", "free_completed", "segment_alloc"};
  json events = json::array();
  std::vector<std::uint64_t> live;
  for (std::size_t i = 1 + in.below(12); i > 0; --i) {
    const bool free = !live.empty() && in.byte() < 100;
    const std::uint64_t addr = free ? live[in.below(live.size())] : 0x7f0000000000 + in.integer(2) * 4096;
    if (!free) live.push_back(addr);
    events.push_back(
        {{"action", in.byte() < 230 ? std::string(free ? actions[1 + in.below(2)] : actions[0]) : next_string(in)},
         {"addr", addr},
         {"size", (1 + in.integer(2)) * 512},
         {"stream", in.below(2)},
         {"time_us", 1000 + in.integer(2)},
         {"frames", json::array({{{"filename", next_string(in)}, {"name", next_string(in)}, {"line", 1}}})}});
  }
  const json doc{{"segments", json::array({{{"address", 0}, {"total_size", 0}, {"segment_type", next_string(in)}}})},
                 {"device_traces", json::array({std::move(events)})}};
  return detail::dump_json(doc, -1);
}

// Every string field a renderer may show, for `f` to read or replace.
template <class F>
void for_each_string(run_report& r, F&& f) {
  f(r.name);
  f(r.source);
  f(r.stats.allocator);
  f(r.stats.backend);
  for (oom_event& e : r.stats.oom_events) f(e.advice);
  for (labelled_map& m : r.maps) {
    f(m.label);
    f(m.map.allocator);
    for (memory_segment& s : m.map.segments) f(s.pool);
  }
  f(r.writer.host);
  f(r.writer.launcher);
  f(r.replay.trace);
  f(r.replay.policy);
  f(r.replay.backend);
  f(r.replay.stats.allocator);
  f(r.replay.stats.backend);
  for (oom_event& e : r.replay.stats.oom_events) f(e.advice);
}

}  // namespace report_render_detail

/// `runs` with every string made harmless: "x" where it was not empty.
inline std::vector<run_report> harmless(std::vector<run_report> runs) {
  for (run_report& r : runs)
    report_render_detail::for_each_string(r, [](std::string& s) {
      if (!s.empty()) s = "x";
    });
  return runs;
}

/// Renders `runs` every way `fragctl report` does and checks each output
/// against the harmless rendering (markup_check.hpp).
inline void check_renders_escaped(const std::vector<run_report>& runs) {
  const std::vector<run_report> plain = harmless(runs);
  const markup_skeleton page = parse_markup(render_html(runs), "HTML");
  check(page == parse_markup(render_html(plain), "HTML (harmless strings)"),
        "the HTML page's markup changes with the report's strings");
  check(page.scripts == 1, "the HTML page holds {} scripts, not its own one", page.scripts);
  for (std::size_t i = 0; i < runs.size(); ++i) {
    for (std::size_t m = 0; m < runs[i].maps.size(); ++m) {
      if (!runs[i].maps[m].map.available) continue;
      const markup_skeleton svg = parse_markup(render_map_svg(runs[i].maps[m]), "SVG");
      check(svg == parse_markup(render_map_svg(plain[i].maps[m]), "SVG (harmless strings)"),
            "the SVG's markup changes with the report's strings");
      check(svg.scripts == 0, "the SVG holds a script");
    }
    const std::string text = render_text(runs[i]);
    check_terminal_text(text, "text");
    const std::string plain_text = render_text(plain[i]);
    check(std::count(text.begin(), text.end(), '\n') == std::count(plain_text.begin(), plain_text.end(), '\n'),
          "the text summary's lines change with the report's strings");
  }
  if (runs_are_ranks(runs)) {
    const std::string ranks = render_rank_table(runs);
    check_terminal_text(ranks, "rank table");
    const std::string plain_ranks = render_rank_table(plain);
    check(std::count(ranks.begin(), ranks.end(), '\n') == std::count(plain_ranks.begin(), plain_ranks.end(), '\n'),
          "the rank table's lines change with the report's strings");
    check(!nlohmann::json::parse(render_rank_json(runs), nullptr, false).is_discarded(), "the ranks' JSON is not JSON");
  }
  const std::string comparison = render_comparison(runs);
  check_terminal_text(comparison, "comparison");
  const std::string plain_comparison = render_comparison(plain);
  check(std::count(comparison.begin(), comparison.end(), '\n') ==
            std::count(plain_comparison.begin(), plain_comparison.end(), '\n'),
        "the comparison's lines change with the report's strings");
}

/// The fuzz target (any bytes).
inline void run_report_render(const std::uint8_t* data, std::size_t size) {
  byte_reader in(data, size);
  const std::uint8_t mode = in.byte();
  if (mode == 'J') {
    const std::string_view text = in.rest();
    auto runs = run_reports_from_json(text, "fuzz.json");
    if (detail::json_too_deep(text)) {
      check(!runs.ok() && std::string(runs.status().message()).starts_with("fuzz.json: JSON nested deeper than "),
            "a document deeper than the limit was not refused for its depth");
    }
    if (runs.ok()) check_renders_escaped(*runs);
    return;
  }
  switch (mode % 3) {
    case 0: {
      std::size_t depth = 0;
      const std::string text = report_render_detail::report_text(in, depth);
      auto runs = run_reports_from_json(text, "fuzz.json");
      const std::string message(runs.status().message());
      const bool refused_for_depth = message.find("JSON nested deeper than 256 levels") != std::string::npos;
      check(refused_for_depth == (depth > detail::json_max_depth), "a document {} levels deep: {}", depth,
            runs.ok() ? std::string("read") : message);
      check(runs.ok() || message.starts_with("fuzz.json"), "an error without the file: {}", message);
      if (runs.ok()) check_renders_escaped(*runs);
      return;
    }
    case 1: check_renders_escaped(report_render_detail::direct_runs(in)); return;
    default: {
      const std::string name = next_string(in);
      auto t = parse_trace(report_render_detail::snapshot_text(in), name);
      if (!t.ok() || t->events.empty()) return;
      report_options options;
      options.replay.policy = in.byte() < 128 ? "caching" : "arena";
      options.replay.cfg.backend = backend_kind::sim;
      options.replay.cfg.sim_capacity = 4 * GiB;
      options.replay.cfg.log_level = "off";
      options.max_timeline_points = 64;
      std::vector<run_report> runs;
      try {
        runs.push_back(replay_run_report(*t, options));
      } catch (const std::exception&) {
        return;  // a replay error is `fragctl report`'s exit 1, not a rendering matter
      }
      runs.front().source = name;
      check_renders_escaped(runs);
      return;
    }
  }
}

}  // namespace fragctl::fuzz
