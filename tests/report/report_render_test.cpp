// fragctl report's renderers, checked on runs whose every number is known:
// the text summary, the comparison, the SVG map and the HTML page (golden
// checks on structure and numbers), and the replay report's timeline and
// maps.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "fragctl/policy.hpp"
#include "fragctl/progress_bar.hpp"
#include "fragctl/run_report.hpp"
#include "support/test_support.hpp"

namespace fragctl {
namespace {

using fragctl::testing::occurrences;
using fragctl::testing::fragmenting_trace;

using ::testing::HasSubstr;
using ::testing::Not;

report_options caching_on_64_mib() {
  report_options o;
  o.replay.policy = "caching";
  o.replay.cfg.backend = backend_kind::sim;
  o.replay.cfg.sim_capacity = 64 * MiB;
  o.replay.cfg.log_level = "off";
  return o;
}

TEST(report_render, replay_report_has_timeline_and_maps) {
  const trace t = fragmenting_trace();
  const run_report r = replay_run_report(t, caching_on_64_mib());
  EXPECT_EQ(r.kind, "replay");
  EXPECT_EQ(r.name, "fragmenting / caching");
  ASSERT_EQ(r.time.points.size(), t.events.size());  // fewer events than max points: one point each
  EXPECT_TRUE(r.time.by_time);
  EXPECT_EQ(r.time.points[5].requested, 3 * 20 * MiB);
  EXPECT_EQ(r.time.points[5].reserved, 60 * MiB);
  EXPECT_EQ(r.time.points[8].requested, 36 * MiB);
  EXPECT_DOUBLE_EQ(r.time.points[8].time_ms, 8.0);
  ASSERT_EQ(r.time.ooms.size(), 1u);
  EXPECT_EQ(r.time.ooms[0].event, 9u);
  EXPECT_EQ(r.time.ooms[0].bytes, 16 * MiB);
  EXPECT_EQ(r.time.ooms[0].reserved, 60 * MiB);

  ASSERT_EQ(r.maps.size(), 3u);
  EXPECT_EQ(r.maps[0].label, "at the first OOM (event 9, 9.0 ms)");
  // The 4 KiB request after the OOM takes a new 2 MiB small segment: 62 MiB.
  EXPECT_EQ(r.maps[1].label, "at peak reserved (event 10, 10.0 ms)");
  EXPECT_EQ(r.maps[1].map.reserved_bytes(), 62 * MiB);
  EXPECT_EQ(r.maps[2].label, "after the last event (14.0 ms)");
  EXPECT_EQ(r.maps[0].map.segments.size(), 3u);
  EXPECT_EQ(r.maps[0].map.bytes(block_use::free), 24 * MiB);
  EXPECT_EQ(r.maps[2].map.bytes(block_use::live), 0u);

  EXPECT_EQ(r.stats.ooms, 1u);
  ASSERT_EQ(r.stats.oom_events.size(), 1u);
  EXPECT_EQ(r.stats.oom_events[0].verdict, oom_verdict::fragmentation);
}

TEST(report_render, timeline_keeps_peaks_when_downsampled) {
  trace t;
  t.name = "saw";
  for (std::uint64_t i = 0; i < 1000; ++i) {
    t.events.push_back({trace_event::action::alloc, 1, (i % 100 == 57) ? 64 * MiB : MiB, 0, static_cast<std::int64_t>(2 * i)});
    t.events.push_back({trace_event::action::free, 1, 0, 0, static_cast<std::int64_t>(2 * i + 1)});
  }
  report_options o = caching_on_64_mib();
  o.replay.cfg.sim_capacity = GiB;
  o.max_timeline_points = 50;
  const run_report r = replay_run_report(t, o);
  ASSERT_EQ(r.time.points.size(), 50u);
  std::size_t peak = 0;
  for (const timeline_point& p : r.time.points) peak = std::max(peak, p.requested);
  EXPECT_EQ(peak, 64 * MiB);
  EXPECT_EQ(r.time.points.back().event, t.events.size() - 1);
}

TEST(report_render, text_summary) {
  const run_report r = replay_run_report(fragmenting_trace(), caching_on_64_mib());
  const std::string text = render_text(r);
  // Sections in order.
  const std::vector<std::string> sections = {"fragctl report: fragmenting / caching", "\nMemory\n", "\nReplay\n",
                                             "\nTop wasted regions (memory map at the first OOM (event 9, 9.0 ms))\n",
                                             "\nRequest sizes", "\nBackend calls", "\nOOM events: 1\n"};
  std::size_t at = 0;
  for (const std::string& s : sections) {
    const std::size_t found = text.find(s, at);
    ASSERT_NE(found, std::string::npos) << s << "\n" << text;
    at = found;
  }
  EXPECT_THAT(text, HasSubstr("  reserved                      62.00 MiB      62.00 MiB\n"));
  EXPECT_THAT(text, HasSubstr("  requested                           0 B      60.00 MiB\n"));
  EXPECT_THAT(text, HasSubstr("  reserved/requested                1.033   (1.000 is ideal)\n"));
  EXPECT_THAT(text, HasSubstr("  largest free block            20.00 MiB   of 62.00 MiB free in cache, 4 segments\n"));
  EXPECT_THAT(text, HasSubstr("  3 segments, 60.00 MiB reserved: 36.00 MiB live, 24.00 MiB free, 0 B pending\n"));
  // Three segments each wasting 8 MiB in one hole.
  EXPECT_EQ(occurrences(text, " 20.00 MiB large  default"), 3u);
  EXPECT_EQ(occurrences(text, "  8.00 MiB         0 B      1     8.00 MiB\n"), 3u);
  // Histogram: 3 x 8 MiB, 4 x 12/16 MiB (bucket 8-16 MiB holds 12 MiB; 16 MiB is the next), one 4 KiB.
  EXPECT_THAT(text, HasSubstr("    4 KiB - 8 KiB    |"));
  EXPECT_THAT(text, HasSubstr("    8 MiB - 16 MiB   |\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588"
                              "\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588"
                              "\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588"
                              "\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588 6\n"));
  EXPECT_THAT(text, HasSubstr("\nBackend calls (6 memory calls, 8 in all)\n  allocate 6, memory_info 2\n"
                              "  2 backend allocations ran out of memory\n"));
  EXPECT_THAT(text, HasSubstr("[fragmentation] out of memory: caching could not allocate 16.00 MiB on stream "
                              "default: reserved 60.00 MiB, cached free 24.00 MiB, largest free block 8.00 MiB"));
  EXPECT_THAT(text, HasSubstr("try FRAGCTL_POLICY=arena"));
}

allocator_stats stats_with(std::string name, std::size_t peak_reserved, std::size_t peak_requested) {
  allocator_stats s;
  s.allocator = std::move(name);
  s.backend = "cuda";
  s.reserved = {peak_reserved / 2, peak_reserved};
  s.requested = {peak_requested / 2, peak_requested};
  return s;
}

TEST(report_render, comparison_shows_difference_in_peak_reserved) {
  run_report a;
  a.name = "native.json";
  a.source = "native.json";
  a.stats = stats_with("caching", 40 * GiB, 30 * GiB);
  run_report b;
  b.name = "arena.json";
  b.source = "arena.json";
  b.stats = stats_with("arena", 30 * GiB, 30 * GiB);
  const std::string text = render_comparison({a, b});
  EXPECT_THAT(text, HasSubstr("  A = native.json (native.json, caching on cuda)\n"));
  EXPECT_THAT(text, HasSubstr("arena.json reserves 10.00 GiB less at peak than native.json (30.00 GiB vs 40.00 GiB, "
                              "-25.0%)"));
  EXPECT_THAT(text, HasSubstr("(-10.00 GiB (-25.0%))"));
  EXPECT_THAT(text, ::testing::ContainsRegex("\n  reserved/requested +1\\.333 +1\\.000\n"));
  EXPECT_THAT(text, ::testing::ContainsRegex("\n  peak reserved +40\\.00 GiB +30\\.00 GiB\n"));
  EXPECT_THAT(text, HasSubstr("(-0.333)"));
}

TEST(report_render, map_svg_structure) {
  const run_report r = replay_run_report(fragmenting_trace(), caching_on_64_mib());
  const labelled_map& m = r.maps[0];  // at the first OOM: 3 segments of [8 MiB free][12 MiB live]
  const std::string svg = render_map_svg(m);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_THAT(svg, HasSubstr("xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_THAT(svg, HasSubstr("data-segments=\"3\" data-blocks=\"6\""));
  EXPECT_EQ(occurrences(svg, "<rect class=\"block live\""), 3u);
  EXPECT_EQ(occurrences(svg, "<rect class=\"block free\""), 3u);
  EXPECT_EQ(occurrences(svg, "<rect class=\"segment\""), 3u);
  EXPECT_EQ(occurrences(svg, "<g class=\"legend-item\""), map_size_classes().size() + 2);
  // 12 MiB live blocks are in the 1 - 16 MiB class.
  EXPECT_EQ(occurrences(svg, "fill=\"#33a02c\" data-address"), 3u);
  EXPECT_THAT(svg, HasSubstr("data-size=\"12582912\" data-requested=\"12582912\" data-stream=\"default\"><title>live "
                             "block"));
  EXPECT_THAT(svg, HasSubstr("3 segments, 60.00 MiB reserved: 36.00 MiB live, 24.00 MiB free, 0 B pending; one row = "
                             "32.00 MiB"));
  EXPECT_THAT(svg, Not(HasSubstr("https:")));
  EXPECT_EQ(occurrences(svg, "<svg"), occurrences(svg, "</svg>"));
  EXPECT_EQ(occurrences(svg, "<g"), occurrences(svg, "</g>"));
}

TEST(report_render, map_svg_merges_blocks_too_thin_to_see) {
  labelled_map m;
  m.label = "many";
  m.map.available = true;
  memory_segment s;
  s.address = 0x100000000;
  s.size = GiB;
  for (std::size_t i = 0; i < 4096; ++i) {
    s.blocks.push_back({s.address + i * 4 * KiB, 4 * KiB, 4 * KiB, i % 2 == 0 ? block_use::live : block_use::live,
                        nullptr});
  }
  s.blocks.push_back({s.address + 4096 * 4 * KiB, GiB - 16 * MiB, 0, block_use::free, nullptr});
  m.map.segments.push_back(s);
  const std::string svg = render_map_svg(m);
  EXPECT_EQ(occurrences(svg, "<rect class=\"block cluster live\""), 1u);
  EXPECT_THAT(svg, HasSubstr("data-blocks=\"4096\" data-size=\"16777216\""));
  EXPECT_EQ(occurrences(svg, "<rect class=\"block free\""), 1u);
}

TEST(report_render, html_is_self_contained) {
  const run_report r = replay_run_report(fragmenting_trace(), caching_on_64_mib());
  run_report other = r;
  other.name = "fragmenting / copy";
  const std::string html = render_html({r, other});
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  // Nothing is fetched: no external scripts, styles, images or fonts.
  for (const char* ref : {"src=", "href=", "@import", "url(http", "https:", "http://www.w"}) {
    EXPECT_THAT(html, Not(HasSubstr(ref))) << ref;
  }
  EXPECT_EQ(occurrences(html, "<script>"), 1u);
  EXPECT_EQ(occurrences(html, "<section class=\"run\""), 2u);
  EXPECT_THAT(html, HasSubstr("<section id=\"comparison\">"));
  EXPECT_EQ(occurrences(html, "<svg class=\"timeline\""), 2u);
  EXPECT_EQ(occurrences(html, "<path class=\"line reserved\""), 2u);
  EXPECT_EQ(occurrences(html, "<g class=\"oom\""), 2u);
  // Three maps per run, the first shown and the others folded.
  EXPECT_EQ(occurrences(html, "<svg class=\"memory-map\""), 6u);
  EXPECT_EQ(occurrences(html, "<details><summary>Memory map"), 4u);
  EXPECT_THAT(html, HasSubstr("<span class=\"verdict fragmentation\">fragmentation</span> allocation #7:"));
  // Ids stay unique across maps.
  EXPECT_EQ(occurrences(html, "id=\"r0m0-pending\""), 1u);
  EXPECT_EQ(occurrences(html, "id=\"r1m2-pending\""), 1u);
}

TEST(report_render, a_missing_map_is_explained) {
  run_report r;
  r.name = "x";
  r.kind = "replay";
  memory_snapshot unavailable;
  unavailable.allocator = "passthrough";
  r.maps.push_back({"", unavailable});
  EXPECT_THAT(render_text(r), HasSubstr("no memory map: the passthrough policy does not describe its layout"));
  EXPECT_THAT(render_html({r}), HasSubstr("no memory map: the passthrough policy does not describe its layout"));
}

TEST(report_render, progress_bar_frames) {
  const std::string half = format_progress("gpt2m / caching", 50, 100, 2.0, 80);
  EXPECT_EQ(half.rfind("gpt2m / caching \u2595", 0), 0u);
  EXPECT_THAT(half, HasSubstr(" 50% 50/100 events  2.0 s left"));
  EXPECT_EQ(occurrences(half, "\u2588"), occurrences(half, "\u2591"));  // half full
  const std::string done = format_progress("x", 35700, 35700, 9.0, 80);
  EXPECT_THAT(done, HasSubstr("100% 35.7k/35.7k events"));
  EXPECT_EQ(occurrences(done, "\u2591"), 0u);
  EXPECT_THAT(done, Not(HasSubstr("left")));
  // A narrow terminal shortens the label first, and the bar stays readable.
  const std::string narrow = format_progress("a very long trace name / buckets:arena", 1, 4, 1.0, 50);
  EXPECT_GE(occurrences(narrow, "\u2588") + occurrences(narrow, "\u2591") + 1, 10u);
}

}  // namespace
}  // namespace fragctl
