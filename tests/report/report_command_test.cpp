// `fragctl report` end to end: runs the built binary (<build>/tools/fragctl)
// on traces, JSON reports and replay output, and checks what it prints and
// writes, and its exit status.
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "fmt/format.h"
#include "fragctl/allocator_stack.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/process_hooks.hpp"
#include "fragctl/run_report.hpp"
#include "nlohmann/json.hpp"
#include "support/test_support.hpp"

namespace fragctl {
namespace {

using fragctl::testing::read_file;
using fragctl::testing::occurrences;
using fragctl::testing::test_data;
using fragctl::testing::run_result;
using fragctl::testing::fragctl_binary;
using fragctl::testing::run_fragctl;

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class report_command : public fragctl::testing::fragctl_command_test {
 protected:
  void SetUp() override {
    fragctl_command_test::SetUp();
    if (IsSkipped()) return;
    dir_ = fs::temp_directory_path() / fmt::format("fragctl_report_command_{}", ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // A JSON report written by an allocator stack that holds `live` bytes.
  std::string write_report(const std::string& name, const std::string& policy, std::size_t live,
                           bool with_map = true) {
    config cfg;
    cfg.report_map = with_map;
    cfg.backend = backend_kind::sim;
    cfg.policy = policy;
    cfg.report_path = (dir_ / name).string();
    auto stack = make_allocator(cfg);
    void* p = stack->allocator().allocate(live);
    EXPECT_EQ(flush_process_outputs("request"), 1u);
    stack->allocator().deallocate(p, live);
    return (dir_ / name).string();
  }

  fs::path dir_;
};

TEST_F(report_command, summary_of_a_trace) {
  const run_result r = run_fragctl("report '" + test_data("tiny_fragctl.csv") + "' --policy caching");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("fragctl report: tiny_fragctl / caching\n"));
  EXPECT_THAT(r.out, HasSubstr("  trace tiny_fragctl replayed through caching on sim (device 0)\n"));
  EXPECT_THAT(r.out, HasSubstr("  reserved                      22.00 MiB      22.00 MiB\n"));
  EXPECT_THAT(r.out, HasSubstr("Top wasted regions (memory map at peak reserved (event 3, 0.0 ms))\n"
                               "  2 segments, 22.00 MiB reserved: 2.87 MiB live, 19.13 MiB free, 0 B pending\n"));
  EXPECT_THAT(r.out, HasSubstr("     2 MiB - 4 MiB    |"));
  // memory_info: the statistics adaptor measures what is held outside at start.
  EXPECT_THAT(r.out, HasSubstr("  allocate 2, create_stream 1, memory_info 1\n"));
  EXPECT_THAT(r.out, HasSubstr("OOM events: none\n"));
}

TEST_F(report_command, summary_of_a_json_report_with_its_map) {
  const std::string report = write_report("job.json", "caching", 3 * MiB);
  const run_result r = run_fragctl("report '" + report + "'");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("fragctl report: job.json\n"));
  EXPECT_THAT(r.out, HasSubstr(": allocator caching on sim device 0\n"));
  // The stack was destroyed after the block was freed: the last write says so.
  EXPECT_THAT(r.out, HasSubstr("  requested                           0 B       3.00 MiB\n"));
  EXPECT_THAT(r.out, HasSubstr("  reserved                      20.00 MiB      20.00 MiB\n"));
  EXPECT_THAT(r.out, HasSubstr("Top wasted regions (memory map when the report was written (destroy))\n"
                               "  1 segment, 20.00 MiB reserved: 0 B live, 20.00 MiB free, 0 B pending\n"));
}

TEST_F(report_command, comparison_of_two_reports) {
  const std::string a = write_report("native.json", "caching", 30 * MiB);
  const std::string b = write_report("arena.json", "arena", 30 * MiB);
  const run_result r = run_fragctl("report '" + a + "' '" + b + "'");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("fragctl report: comparison\n"));
  EXPECT_THAT(r.out, HasSubstr("  A = native.json ("));
  EXPECT_THAT(r.out, HasSubstr("  B = arena.json ("));
  // caching holds a 30 MiB segment, arena 15 granules of 2 MiB: the same.
  EXPECT_THAT(r.out, ::testing::ContainsRegex("\n  peak reserved +30\\.00 MiB +30\\.00 MiB\n"));
  EXPECT_THAT(r.out, HasSubstr("arena.json and native.json reserve the same at peak (30.00 MiB)"));
}

TEST_F(report_command, comparison_of_policies_on_one_trace_and_html_and_svg) {
  const fs::path html = dir_ / "cmp.html";
  const fs::path svg = dir_ / "map.svg";
  const run_result r = run_fragctl("report '" + test_data("gpt2m.trace.csv.gz") + "' --policy caching,arena --html '" +
                                   html.string() + "' --svg '" + svg.string() + "'");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("  A = gpt2m / caching ("));
  EXPECT_THAT(r.out, HasSubstr("  B = gpt2m / arena ("));
  EXPECT_THAT(r.out, HasSubstr("gpt2m / arena reserves "));
  EXPECT_THAT(r.out, HasSubstr(" less at peak than gpt2m / caching ("));
  const std::string page = read_file(html);
  EXPECT_EQ(occurrences(page, "<section class=\"run\""), 2u);
  EXPECT_EQ(occurrences(page, "<svg class=\"timeline\""), 2u);
  EXPECT_THAT(page, HasSubstr("<section id=\"comparison\">"));
  // The SVG is the caching run's map at peak reserved.
  const std::string map = read_file(svg);
  EXPECT_EQ(map.rfind("<?xml", 0), 0u);
  EXPECT_THAT(map, HasSubstr("at peak reserved"));
  EXPECT_GT(occurrences(map, "<rect class=\"block live"), 100u);
}

TEST_F(report_command, replay_json_output_is_a_report) {
  const fs::path results = dir_ / "replay.json";
  ASSERT_EQ(std::system(("'" + fragctl_binary().string() + "' replay '" + test_data("tiny_fragctl.csv") +
                         "' --policy caching,buckets:caching --backend sim --json > '" + results.string() + "'")
                            .c_str()),
            0);
  const run_result r = run_fragctl("report '" + results.string() + "'");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("  A = tiny_fragctl / caching ("));
  EXPECT_THAT(r.out, HasSubstr("  B = tiny_fragctl / buckets:caching ("));
}

TEST_F(report_command, errors) {
  EXPECT_EQ(run_fragctl("report").status, 2);
  EXPECT_EQ(run_fragctl("report --top 0 x").status, 2);
  EXPECT_EQ(run_fragctl("report '" + test_data("tiny_fragctl.csv") + "' --policy nosuch").status, 2);
  const run_result missing = run_fragctl("report /nonexistent/file.json", "2>&1");
  EXPECT_EQ(missing.status, 1);
  EXPECT_THAT(missing.out, HasSubstr("/nonexistent/file.json"));
  // A report written without its map has no picture: --svg says so.
  const std::string report = write_report("nomap.json", "caching", MiB, /*with_map=*/false);
  const run_result no_map = run_fragctl("report '" + report + "' --svg '" + (dir_ / "x.svg").string() + "'", "2>&1");
  EXPECT_EQ(no_map.status, 1);
  EXPECT_THAT(no_map.out, HasSubstr("no run has a memory map"));
  EXPECT_THAT(run_fragctl("report --help").out, HasSubstr("Usage: fragctl report [OPTIONS] FILE..."));
}

// Regressions (red team, 2026-11-28): `fragctl report` replayed a cut
// trace without the warning replay and info give, reported an empty trace
// as a summary of 0 B with exit 0, and its timeline subtracted times as
// 64-bit integers (a trace spanning more than 2^63 us overflowed: UBSan).
// `fragctl convert` wrote a cut trace with an end row, so the copy read as
// whole (`info --require-complete` passed it).
TEST_F(report_command, a_cut_an_empty_or_a_far_spread_trace_is_said_so) {
  const fs::path cut = dir_ / "cut.csv";
  std::ofstream(cut) << "action,addr,size,stream,time_us\n"
                        "# fragctl trace: complete when its last row is an end row\n"
                        "alloc,4096,100,0,1\n";
  const run_result r = run_fragctl("report '" + cut.string() + "'", "2>&1");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("fragctl report: warning: " + cut.string() + ": the trace is cut"));
  const run_result converted =
      run_fragctl("convert '" + cut.string() + "' '" + (dir_ / "copy.csv").string() + "'", "2>&1");
  EXPECT_EQ(converted.status, 0) << converted.out;
  EXPECT_THAT(converted.out, HasSubstr("fragctl convert: warning: " + cut.string() + ": the trace is cut"));
  const run_result copy = run_fragctl("info --require-complete '" + (dir_ / "copy.csv").string() + "'", "2>&1");
  EXPECT_EQ(copy.status, 1) << copy.out;
  EXPECT_THAT(copy.out, HasSubstr("the trace is cut"));
  // Control: a whole trace converts to a whole one, without a warning.
  const run_result whole =
      run_fragctl("convert '" + test_data("tiny_fragctl.csv") + "' '" + (dir_ / "whole.csv").string() + "'", "2>&1");
  EXPECT_EQ(whole.out.find("warning"), std::string::npos) << whole.out;
  EXPECT_EQ(run_fragctl("info --require-complete '" + (dir_ / "whole.csv").string() + "'").status, 0);

  const fs::path empty = dir_ / "empty.csv";
  std::ofstream(empty) << "action,addr,size,stream,time_us\n";
  const run_result nothing = run_fragctl("report '" + empty.string() + "'", "2>&1");
  EXPECT_EQ(nothing.status, 1) << nothing.out;
  EXPECT_THAT(nothing.out, HasSubstr("no allocation or free to replay"));

  const fs::path spread = dir_ / "spread.csv";
  std::ofstream(spread) << "action,addr,size,stream,time_us\n"
                           "alloc,4096,100,0,-9223372036854775808\n"
                           "free_requested,4096,100,0,9223372036854775807\n";
  const auto runs = load_run_reports(spread.string());
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_FALSE(runs->front().time.points.empty());
  EXPECT_GT(runs->back().time.points.back().time_ms, 1e15);
}

// Issue 27, H1 and the terminal: a report whose pool would close the SVG and
// open a <script>, whose allocator clears the screen.
TEST_F(report_command, a_hostile_report_stays_text_in_html_svg_and_terminal) {
  const std::string pool = "</title></rect></g></svg><script>document.title=\"PWNED\"</script><svg><g><rect><title>";
  const std::string report = write_report("hostile.json", "caching", 3 * MiB);
  nlohmann::json doc = nlohmann::json::parse(read_file(report));
  doc["allocators"][0]["allocator"] = "caching\x1b[2J\x1b[31m";
  for (auto& segment : doc["allocators"][0]["memory_map"]["segments"]) segment["pool"] = pool;
  std::ofstream(report) << doc.dump();
  const fs::path html = dir_ / "h.html";
  const fs::path svg = dir_ / "h.svg";
  const run_result r =
      run_fragctl("report '" + report + "' --html '" + html.string() + "' --svg '" + svg.string() + "'");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos);
  EXPECT_THAT(r.out, HasSubstr(": allocator caching\\x1b[2J\\x1b[31m on sim device 0\n"));
  for (const fs::path& page : {html, svg}) {
    const std::string text = read_file(page);
    EXPECT_EQ(text.find("<script>document"), std::string::npos) << page;
    EXPECT_THAT(text, HasSubstr("&lt;script&gt;document.title=&quot;PWNED&quot;&lt;/script&gt;")) << page;
  }
  EXPECT_EQ(occurrences(read_file(html), "<script"), 1u);
  EXPECT_EQ(occurrences(read_file(svg), "<script"), 0u);
}

// Issue 27, H3: 100,000 nested arrays (200 KB) crashed `fragctl report`
// with SIGSEGV (status 139).
TEST_F(report_command, a_report_nested_100000_levels_is_an_error_not_a_crash) {
  const fs::path deep = dir_ / "deep.json";
  std::ofstream(deep) << "{\"schema_version\": 1, \"allocators\": " << std::string(100000, '[')
                      << std::string(100000, ']') << "}";
  const run_result r = run_fragctl("report '" + deep.string() + "'", "2>&1");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("deep.json: JSON nested deeper than 256 levels (byte 291); fragctl reads at most 256"));
  // Positive control: an ordinary report still reads.
  EXPECT_EQ(run_fragctl("report '" + write_report("ok.json", "caching", MiB) + "'").status, 0);
}

// A trace named by a file name that is not UTF-8 made every --json fail
// with "[json.exception.type_error.316] invalid UTF-8 byte".
TEST_F(report_command, a_trace_name_that_is_not_utf8_keeps_every_json_output) {
  const fs::path trace = dir_ / "tr\xff.csv";
  fs::copy_file(test_data("tiny_fragctl.csv"), trace);
  for (const std::string command : {"report", "replay --backend sim", "info"}) {
    const run_result r = run_fragctl(command + " '" + trace.string() + "' --json", "2>&1");
    ASSERT_EQ(r.status, 0) << command << ": " << r.out;
    const auto j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(j.is_discarded()) << command << ": " << r.out;
    EXPECT_THAT(r.out, HasSubstr("tr\xef\xbf\xbd")) << command;  // U+FFFD
  }
}

// Error messages quote files (a trace row's action here): their control
// characters reached the terminal raw.
TEST_F(report_command, an_error_quoting_a_file_shows_its_control_characters_escaped) {
  const fs::path trace = dir_ / "bad.csv";
  std::ofstream(trace) << "action,addr,size,stream,time_us\nalloc\x1b[2J\x1b]0;x\x07,4096,512,0,1\n";
  const run_result r = run_fragctl("report '" + trace.string() + "'", "2>&1");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.out, HasSubstr("unknown action 'alloc\\x1b[2J\\x1b]0;x\\x07'"));
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\x07'), std::string::npos) << r.out;
  // Positive control: the message's own line structure is kept.
  EXPECT_THAT(run_fragctl("report", "2>&1").out, HasSubstr("no file given\nRun 'fragctl report --help'"));
}

}  // namespace
}  // namespace fragctl
