// Hostile reports (issue 27; docs/reliability.md, "Bad inputs"): a report,
// a trace or a file name written to attack whoever reads it with `fragctl
// report`. Each test names what the code before the fix did and keeps a
// positive control. The HTML and SVG checks use fuzz_report_render's oracle
// (fuzz/harness/markup_check.hpp); the browser's view is in
// tests/report/html_browser_test.cpp.
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/json_io.hpp"
#include "fmt/format.h"
#include "fragctl/error.hpp"
#include "fragctl/log.hpp"
#include "fragctl/memory_map.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/run_report.hpp"
#include "fragctl/sim_backend.hpp"
#include "fragctl/stats.hpp"
#include "fragctl/stats_export.hpp"
#include "fuzz/harness/report_render.hpp"
#include "nlohmann/json.hpp"
#include "report/render_util.hpp"
#include "support/test_support.hpp"
#include "util/strings.hpp"

namespace fragctl {
namespace {

namespace fs = std::filesystem;
using fragctl::testing::fragmenting_trace;
using fragctl::testing::occurrences;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string pwned = "</title></rect></g></svg><script>document.title=\"PWNED\"</script><svg><g><rect><title>";

std::string message_of(const absl::Status& s) { return std::string(s.message()); }

// A report of one allocator whose memory map has one segment in `pool`.
std::string report_with_pool(const std::string& pool) {
  const nlohmann::json doc = {
      {"schema_version", 1},
      {"reason", "exit"},
      {"allocators",
       {{{"schema_version", 1},
         {"allocator", "caching"},
         {"backend", "sim"},
         {"requested_bytes", {{"current", 1024}, {"peak", 1024}}},
         {"reserved_bytes", {{"current", 2 * MiB}, {"peak", 2 * MiB}}},
         {"memory_map",
          {{"available", true},
           {"allocator", "caching"},
           {"segments",
            {{{"address", "0x200000"},
              {"size", 2 * MiB},
              {"stream", "0x0"},
              {"pool", pool},
              {"blocks",
               {{{"address", "0x200000"}, {"size", 1024}, {"requested", 1000}, {"use", "live"}, {"stream", "0x0"}},
                {{"address", "0x200400"},
                 {"size", 2 * MiB - 1024},
                 {"requested", 0},
                 {"use", "free"},
                 {"stream", "0x0"}}}}}}}}}}}}};
  return doc.dump();
}

// A replayed run with every kind of string a renderer shows: maps, an OOM
// with its advice, a timeline.
run_report replayed_run() {
  report_options o;
  o.replay.policy = "caching";
  o.replay.cfg.backend = backend_kind::sim;
  o.replay.cfg.sim_capacity = 64 * MiB;
  o.replay.cfg.log_level = "off";
  return replay_run_report(fragmenting_trace(), o);
}

// H1: map_svg wrote the pool raw into each segment's <title>: the page ran
// the payload's script.
TEST(hostile_report, a_pool_name_with_markup_stays_text_in_html_and_svg) {
  const auto runs = run_reports_from_json(report_with_pool(pwned), "r.json");
  ASSERT_TRUE(runs.ok()) << runs.status();
  const std::string html = render_html(*runs);
  const std::string svg = render_map_svg(runs->front().maps.front());
  for (const std::string* page : {&html, &svg}) {
    EXPECT_THAT(*page, Not(HasSubstr("<script>document")));
    EXPECT_THAT(*page, Not(HasSubstr("</svg><script>")));
    // The pool is there, as text, in the segment's title and data-pool.
    EXPECT_THAT(*page, HasSubstr("&lt;/title&gt;&lt;/rect&gt;&lt;/g&gt;&lt;/svg&gt;&lt;script&gt;document.title="
                                 "&quot;PWNED&quot;&lt;/script&gt;"));
  }
  EXPECT_EQ(occurrences(html, "<script"), 1u);  // the page's own
  EXPECT_EQ(occurrences(svg, "<script"), 0u);
  EXPECT_NO_THROW(fuzz::check_renders_escaped(*runs));
  // Positive control: a plain pool reads and shows as itself.
  const auto plain = run_reports_from_json(report_with_pool("large"), "r.json");
  ASSERT_TRUE(plain.ok());
  EXPECT_THAT(render_map_svg(plain->front().maps.front()), HasSubstr("(large pool, stream default)</title>"));
}

// The oracle fuzz_report_render relies on catches what the old map_svg
// wrote (its positive control: a checker that accepts everything proves
// nothing).
TEST(hostile_report, the_fuzz_oracle_catches_a_string_written_as_markup) {
  const auto runs = run_reports_from_json(report_with_pool("x"), "r.json");
  ASSERT_TRUE(runs.ok());
  const std::string clean = render_html(*runs);
  const fuzz::markup_skeleton expected = fuzz::parse_markup(clean, "clean");
  EXPECT_EQ(expected.scripts, 1u);
  // The old writer: the pool unescaped in the segment's title.
  std::string injected = clean;
  const std::size_t at = injected.find("(x pool");
  ASSERT_NE(at, std::string::npos);
  injected.replace(at + 1, 1, pwned);
  const fuzz::markup_skeleton got = fuzz::parse_markup(injected, "injected");
  EXPECT_NE(got, expected);
  EXPECT_EQ(got.scripts, 2u);
  // An attribute breakout, an entity-less '&', a '>' in text, an unknown element, a control character.
  for (const std::string payload : {"\"><svg onload=alert(1)>", "a & b", "a > b", "<img src=x>", "\x1b[2J"}) {
    std::string page = clean;
    page.replace(page.find("(x pool") + 1, 1, payload);
    EXPECT_THROW((void)fuzz::parse_markup(page, "injected"), fuzz::invariant_violation) << payload;
  }
}

// H1, every string: each field a renderer shows gets each hostile payload
// (pass p gives field k payload p + k, so every pair is rendered) and
// renders as text in the HTML page, the SVG, the terminal summary and the
// comparison.
TEST(hostile_report, every_string_field_stays_text_in_every_rendering) {
  const run_report base = replayed_run();
  ASSERT_EQ(base.stats.oom_events.size(), 1u);
  ASSERT_EQ(base.maps.size(), 3u);
  std::size_t fields = 0;
  run_report counted = base;
  fuzz::report_render_detail::for_each_string(counted, [&](std::string&) { ++fields; });
  EXPECT_GE(fields, 20u);  // 3 maps of 3 or more segments
  // The second run, for the comparison, without maps or timeline: the
  // first holds every picture (and keeps the test short under ASan).
  run_report other = base;
  other.maps.clear();
  other.time = {};
  const std::vector<std::string>& payloads = fuzz::hostile_payloads();
  std::size_t rendered = 0;
  for (std::size_t pass = 0; pass < payloads.size(); ++pass) {
    std::vector<run_report> runs = {base, other};
    std::size_t field = 0;
    fuzz::report_render_detail::for_each_string(
        runs[0], [&](std::string& s) { s = payloads[(pass + field++) % payloads.size()]; });
    try {
      fuzz::check_renders_escaped(runs);
      rendered += fields;
    } catch (const fuzz::invariant_violation& e) {
      ADD_FAILURE() << "pass " << pass << ": " << e.what();
    }
  }
  EXPECT_EQ(rendered, fields * payloads.size());
}

// H3: `fragctl report` on 100,000 nested arrays overflowed the stack (the
// copy in load.cpp); the other readers took such documents or crashed later.
TEST(hostile_report, json_nested_deeper_than_256_levels_is_an_error_naming_the_limit) {
  const auto nested = [](std::size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); };
  const std::string deep_report = R"({"schema_version": 1, "allocators": )" + nested(100000) + "}";
  const auto runs = run_reports_from_json(deep_report, "deep.json");
  ASSERT_FALSE(runs.ok());
  EXPECT_EQ(message_of(runs.status()),
            "deep.json: JSON nested deeper than 256 levels (byte 291); fragctl reads at most 256");

  const fs::path dir = fs::temp_directory_path() / fmt::format("fragctl_hostile_report_{}", ::getpid());
  fs::create_directories(dir);
  const fs::path file = dir / "deep.json";
  std::ofstream(file) << deep_report;
  const auto loaded = load_run_reports(file.string());
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(message_of(loaded.status()), HasSubstr(file.string() + ": JSON nested deeper than 256 levels"));

  // Statistics, report documents, memory maps: a deep field they would skip.
  const std::string stats = R"({"schema_version": 1, "allocator": "caching", "x": )" + nested(100000) + "}";
  EXPECT_THAT(message_of(stats_from_json(stats).status()), HasSubstr("stats JSON: JSON nested deeper than 256"));
  EXPECT_THAT(message_of(stats_export_from_json(stats).status()),
              HasSubstr("report JSON: JSON nested deeper than 256"));
  EXPECT_THAT(message_of(memory_snapshot_from_json(R"({"x": )" + nested(100000) + "}").status()),
              HasSubstr("memory map JSON: JSON nested deeper than 256"));
  // A PyTorch snapshot, with the line.
  const auto snapshot = parse_trace("{\n\"device_traces\": [" + nested(100000) + "]}", "snap.json");
  EXPECT_THAT(message_of(snapshot.status()),
              HasSubstr("snap.json:2: JSON nested deeper than 256 levels; fragctl reads at most 256"));
  // A warm-up profile stops the warmup policy.
  std::ofstream(dir / "profile.json") << stats;
  config cfg;
  cfg.backend = backend_kind::sim;
  cfg.warmup_profile = (dir / "profile.json").string();
  sim_backend sim;
  try {
    (void)make_policy("warmup:caching", cfg, sim);
    ADD_FAILURE() << "a warm-up profile nested 100,000 levels deep was taken";
  } catch (const invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("JSON nested deeper than 256 levels"));
  }
  fs::remove_all(dir);

  // Positive control: 256 levels in all read, 257 do not; brackets inside
  // strings do not count.
  const std::string at_limit = R"({"schema_version": 1, "allocator": "[[[{{{", "x": )" + nested(255) + "}";
  EXPECT_TRUE(stats_from_json(at_limit).ok()) << stats_from_json(at_limit).status();
  EXPECT_FALSE(stats_from_json(R"({"schema_version": 1, "x": )" + nested(256) + "}").ok());
  EXPECT_EQ(detail::json_too_deep(R"(["\"[[[", [[]]])", 2), 11u);
  EXPECT_FALSE(detail::json_too_deep(R"(["\"[[[", [[]]])", 3).has_value());
}

// A trace name from a file name that is not UTF-8 made every --json fail
// with nlohmann's "[json.exception.type_error.316] invalid UTF-8 byte".
TEST(hostile_report, a_name_that_is_not_utf8_is_written_as_u_fffd) {
  replay_result r;
  r.trace =
      "tr\xff"
      "ace";
  r.policy = "caching";
  r.stats.allocator = "caching\xc3";
  std::string text;
  ASSERT_NO_THROW(text = to_json(r));
  const auto j = nlohmann::json::parse(text);
  EXPECT_EQ(j["trace"],
            "tr\xef\xbf\xbd"
            "ace");
  EXPECT_EQ(j["stats"]["allocator"], "caching\xef\xbf\xbd");
  ASSERT_NO_THROW((void)to_json(std::vector<replay_result>{r}));
  memory_snapshot m;
  m.available = true;
  m.segments.push_back({0x1000, 4096, nullptr, "\xff", {}});
  ASSERT_NO_THROW(text = to_json(m));
  EXPECT_THAT(text, HasSubstr("\"pool\": \"\xef\xbf\xbd\""));
  // Positive control: UTF-8 is written as it is.
  r.trace =
      "tr\xc3\xa4"
      "ce";
  EXPECT_EQ(nlohmann::json::parse(to_json(r))["trace"],
            "tr\xc3\xa4"
            "ce");
}

// Low: an allocator, pool, advice or name with terminal escapes reached
// the terminal raw (clear the screen, colours, a forged line, reordered text).
TEST(hostile_report, terminal_controls_in_report_strings_are_shown_escaped) {
  run_report r = replayed_run();
  r.name = "job\nfragctl report: all fine";
  r.replay.trace = "t\x1b[2J";
  r.stats.allocator = "caching\x1b]0;title\x07";
  r.stats.backend =
      "sim\xc2\x9b"
      "31m";
  r.stats.oom_events.front().advice =
      "raise \xe2\x80\xae"
      "capacity";
  r.maps.front().map.segments.front().pool = "large\r\x08";
  const std::string text = render_text(r);
  fuzz::check_terminal_text(text, "text");
  EXPECT_THAT(text, HasSubstr("fragctl report: job\\x0afragctl report: all fine\n"));
  EXPECT_THAT(text, HasSubstr("trace t\\x1b[2J replayed through caching\\x1b]0;title\\x07 on sim\\u009b31m"));
  EXPECT_THAT(text, HasSubstr("raise \\u202ecapacity"));
  const std::string comparison = render_comparison({r, replayed_run()});
  fuzz::check_terminal_text(comparison, "comparison");
  EXPECT_THAT(comparison, HasSubstr("A = job\\x0afragctl report: all fine"));
  // Positive control: UTF-8 text that is not a control shows as it is.
  EXPECT_EQ(util::printable("arena \xce\xbc \xe2\x80\x94 \xf0\x9f\x93\x88"),
            "arena \xce\xbc \xe2\x80\x94 \xf0\x9f\x93\x88");
  EXPECT_EQ(util::printable("\xff\xed\xa0\x80\xc0\xbc"), "\\xff\\xed\\xa0\\x80\\xc0\\xbc");
  EXPECT_EQ(util::printable("\x7f\xef\xbf\xbe\xe2\x81\xa6"), "\\x7f\\ufffe\\u2066");
}

// Low (issue 27's table, left open there): the library's own log lines on
// stderr carried what they quote raw: a FRAGCTL_CONF value in a parse
// warning or a path in a report writer's warning could clear the screen or
// retitle the window. The stderr sink writes each line through
// util::printable and keeps the line breaks between lines.
TEST(hostile_report, terminal_controls_in_log_lines_reach_stderr_escaped) {
  const spdlog::level::level_enum level = logger().level();  // an earlier test may have set another
  logger().set_level(spdlog::level::warn);
  ::testing::internal::CaptureStderr();
  logger().warn("FRAGCTL_CONF: bad value {}", "a\x1b]0;PWNED\x07" "b\x1b[2J\xe2\x80\xae\xff\tc");
  logger().warn("two lines\nthe second {}", "\x1b[31mred");
  logger().warn("plain arena \xce\xbc line");  // positive control: shown as it is
  const std::string err = ::testing::internal::GetCapturedStderr();
  logger().set_level(level);
  EXPECT_THAT(err, Not(HasSubstr("\x1b"))) << err;
  EXPECT_THAT(err, Not(HasSubstr("\xe2\x80\xae"))) << err;
  EXPECT_THAT(err, HasSubstr("FRAGCTL_CONF: bad value a\\x1b]0;PWNED\\x07b\\x1b[2J\\u202e\\xff\\x09c\n")) << err;
  EXPECT_THAT(err, HasSubstr("two lines\nthe second \\x1b[31mred\n")) << err;
  EXPECT_THAT(err, HasSubstr("[fragctl] [warning] plain arena \xce\xbc line\n")) << err;
}

// Low: a report whose current bytes exceed their peak, or that requested
// more than it reserved, rendered as if nothing were wrong.
TEST(hostile_report, inconsistent_figures_are_named_in_a_warning) {
  run_report r = replayed_run();
  r.stats.requested = {10 * MiB, 5 * MiB};
  r.stats.reserved = {4 * MiB, 4 * MiB};
  const std::string text = render_text(r);
  EXPECT_THAT(text, HasSubstr("\n  warning: inconsistent report: current requested bytes (10.00 MiB) above their peak "
                              "(5.00 MiB)\n"));
  EXPECT_THAT(text, HasSubstr("\n  warning: inconsistent report: 10.00 MiB requested now, more than the 4.00 MiB "
                              "reserved\n"));
  EXPECT_THAT(text, HasSubstr("\n  warning: inconsistent report: peak requested 5.00 MiB above peak reserved "
                              "4.00 MiB\n"));
  EXPECT_THAT(render_comparison({r, replayed_run()}), HasSubstr("      warning (A): inconsistent report: "));
  EXPECT_EQ(occurrences(render_html({r}), "<p class=\"warning\">warning: inconsistent report: "), 3u);
  // Positive control: the statistics of real runs, every policy, raise none
  // (the resnet50 trace's first 4,000 events: a real workload, kept short).
  auto resnet = read_trace(fragctl::testing::test_data("resnet50.trace.csv.gz"));
  ASSERT_TRUE(resnet.ok()) << resnet.status();
  resnet->events.resize(std::min<std::size_t>(resnet->events.size(), 4000));
  for (const std::string& policy : replay_policy_set()) {
    for (const trace& t : {fragmenting_trace(), *resnet}) {
      report_options o;
      o.replay.policy = policy;
      o.replay.cfg.backend = backend_kind::sim;
      o.replay.cfg.sim_capacity = t.name == "fragmenting" ? 64 * MiB : 80 * GiB;
      o.replay.cfg.log_level = "off";
      const run_report real = replay_run_report(t, o);
      EXPECT_THAT(report_detail::inconsistencies(real.stats), ::testing::IsEmpty()) << policy;
      EXPECT_THAT(render_text(real), Not(HasSubstr("warning:"))) << policy;
    }
  }
}

// Low (red team): a memory map whose block is larger than its segment, or
// whose blocks overlap, rendered as if it were whole. The text and the page
// name each contradiction, at most three and a count of the rest; a real
// run's maps raise none (the positive control above renders every
// policy's without a warning).
TEST(hostile_report, a_block_past_its_segment_or_overlapping_another_is_named_in_a_warning) {
  run_report r = replayed_run();
  labelled_map damaged;
  damaged.label = "damaged";
  damaged.map.available = true;
  memory_segment seg{0x200000, 2 * MiB, nullptr, "large", {}};
  seg.blocks.push_back({0x200000, 1 * MiB, 1 * MiB, block_use::live, nullptr});
  seg.blocks.push_back({0x300000, 4 * MiB, 0, block_use::free, nullptr});  // past the segment's end
  damaged.map.segments.push_back(seg);
  memory_segment other{0x800000, 2 * MiB, nullptr, "large", {}};
  other.blocks.push_back({0x800000, 1 * MiB, 1 * MiB, block_use::live, nullptr});
  other.blocks.push_back({0x880000, 1 * MiB, 1 * MiB, block_use::live, nullptr});  // overlaps the first
  other.blocks.push_back({0x100000, 512 * KiB, 0, block_use::free, nullptr});      // before the segment
  damaged.map.segments.push_back(other);
  r.maps = {damaged};
  const std::string text = render_text(r);
  EXPECT_THAT(text, HasSubstr("\n  warning: inconsistent report: a block of 4.00 MiB at 0x300000 is not within its "
                              "segment [0x200000, +2.00 MiB)\n"));
  EXPECT_THAT(text, HasSubstr("\n  warning: inconsistent report: blocks at 0x800000 (+1.00 MiB) and 0x880000 overlap "
                              "in segment 0x800000\n"));
  EXPECT_THAT(text, HasSubstr("\n  warning: inconsistent report: a block of 512.00 KiB at 0x100000 is not within its "
                              "segment [0x800000, +2.00 MiB)\n"));
  EXPECT_EQ(occurrences(render_html({r}), "<p class=\"warning\">warning: inconsistent report: "), 3u);
  // The page draws every map: a damaged one after a whole one is named too.
  run_report second = replayed_run();
  second.maps = {replayed_run().maps.front(), damaged};
  EXPECT_EQ(occurrences(render_html({second}), "<p class=\"warning\">warning (memory map damaged): inconsistent "
                                               "report: "),
            3u);
  EXPECT_EQ(occurrences(render_html({second}), "inconsistent report: "), 3u);
  // The warning quotes the map's label, from the file: text, not markup.
  second.maps.back().label = "<script>document.title='PWNED'</script>";
  const std::string page = render_html({second});
  EXPECT_THAT(page, Not(HasSubstr("<script>document.title='PWNED'")));
  EXPECT_THAT(page, HasSubstr("warning (memory map &lt;script&gt;document.title="));
  EXPECT_EQ(occurrences(page, "<script"), 1u);  // the page's own
  // A block of 0 bytes at another's address overlaps nothing.
  labelled_map empty_block;
  empty_block.map.available = true;
  memory_segment tiled{0x200000, 2 * MiB, nullptr, "large", {}};
  tiled.blocks.push_back({0x200000, 2 * MiB, 2 * MiB, block_use::live, nullptr});
  tiled.blocks.push_back({0x200000, 0, 0, block_use::free, nullptr});
  empty_block.map.segments.push_back(tiled);
  EXPECT_THAT(report_detail::map_inconsistencies(empty_block.map), ::testing::IsEmpty());
  // A block reaching over the next two is named against each, an empty
  // block between them or not.
  labelled_map wide;
  wide.map.available = true;
  memory_segment covering{0x200000, 8 * MiB, nullptr, "large", {}};
  covering.blocks.push_back({0x200000, 8 * MiB, 8 * MiB, block_use::live, nullptr});
  covering.blocks.push_back({0x300000, 0, 0, block_use::free, nullptr});
  covering.blocks.push_back({0x400000, 1 * MiB, 1 * MiB, block_use::live, nullptr});
  covering.blocks.push_back({0x600000, 1 * MiB, 1 * MiB, block_use::live, nullptr});
  wide.map.segments.push_back(covering);
  EXPECT_THAT(report_detail::map_inconsistencies(wide.map),
              ::testing::ElementsAre(
                  "inconsistent report: blocks at 0x200000 (+8.00 MiB) and 0x400000 overlap in segment 0x200000",
                  "inconsistent report: blocks at 0x200000 (+8.00 MiB) and 0x600000 overlap in segment 0x200000"));
  // Many: three named, the rest counted.
  for (std::uintptr_t a = 0x10000000; a < 0x10000000 + 10 * MiB; a += MiB) {
    r.maps.front().map.segments.front().blocks.push_back({a, 512, 0, block_use::free, nullptr});
  }
  const std::vector<std::string> many = report_detail::map_inconsistencies(r.maps.front().map);
  ASSERT_EQ(many.size(), 4u);
  EXPECT_EQ(many.back(), "inconsistent report: 10 more such contradictions");
  // A whole map, the first of a real run: none.
  EXPECT_THAT(report_detail::map_inconsistencies(replayed_run().maps.front().map), ::testing::IsEmpty());
}

// A damaged map's segment of 2^64 - 1 bytes took std::bit_ceil past 2^63,
// its undefined case (found by fuzz_report_render; UBSan: "shift exponent
// 64 is too large"), which on x86 drew rows of 1 byte.
TEST(hostile_report, a_segment_above_2_63_bytes_draws_rows_of_2_63_bytes) {
  labelled_map m;
  m.map.available = true;
  m.map.segments.push_back({0x1000, SIZE_MAX, nullptr, "large", {}});
  const std::string svg = render_map_svg(m);
  EXPECT_THAT(svg, HasSubstr("data-row-bytes=\"9223372036854775808\""));
  EXPECT_NO_THROW((void)fuzz::parse_markup(svg, "SVG"));
  // Positive control: an ordinary segment keeps rows of at least 2 MiB.
  m.map.segments.front().size = 3 * MiB;
  EXPECT_THAT(render_map_svg(m), HasSubstr("data-row-bytes=\"4194304\""));
}

}  // namespace
}  // namespace fragctl
