// The HTML report in a real browser: headless Chromium loads the page, runs
// its script, and the DOM it dumps is checked for what a reader sees (the
// memory maps' blocks and legends, the timeline's lines and OOM mark, the
// tooltip a hover shows); a screenshot checks that it renders at all.
// A hostile report (issue 27, H1) runs no script, in the page or in the
// standalone SVG. Skipped, with a message, where Chromium is not installed
// (tools/install-deps.sh installs Debian's `chromium`).
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "fmt/format.h"
#include "fragctl/run_report.hpp"
#include "fuzz/harness/report_render.hpp"
#include "report/markup.hpp"
#include "support/test_support.hpp"

namespace fragctl {
namespace {

using fragctl::testing::occurrences;
using fragctl::testing::run_command;
using fragctl::testing::run_result;
using fragctl::testing::fragmenting_trace;

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

std::string find_chromium() {
  if (const char* given = std::getenv("FRAGCTL_CHROMIUM"); given != nullptr && *given != '\0') return given;
  const char* path = std::getenv("PATH");
  for (const std::string_view name : {"chromium", "chromium-browser", "google-chrome", "chrome"}) {
    std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
    std::size_t start = 0;
    while (start <= dirs.size()) {
      const std::size_t end = std::min(dirs.find(':', start), dirs.size());
      const fs::path candidate = fs::path(dirs.substr(start, end - start)) / name;
      if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
      start = end + 1;
    }
  }
  return {};
}

// Runs the browser headless on `page` with the flags that keep it off the
// network and out of the user's profile.
run_result run_chromium(const std::string& chromium, const fs::path& profile, const std::string& action,
                        const fs::path& page) {
  const std::string command = fmt::format(
      "timeout 120 '{}' --headless --no-sandbox --disable-gpu --disable-quic --no-first-run "
      "--disable-background-networking --disable-component-update --disable-sync --disable-extensions "
      "--hide-scrollbars --user-data-dir='{}' {} 'file://{}' 2>/dev/null",
      chromium, profile.string(), action, page.string());
  return run_command(command);
}

class html_browser : public ::testing::Test {
 protected:
  void SetUp() override {
    chromium_ = find_chromium();
    if (chromium_.empty()) {
      GTEST_SKIP() << "Chromium is not installed (apt-get install chromium, or set FRAGCTL_CHROMIUM); "
                      "the HTML report is not checked in a browser";
    }
    dir_ = fs::temp_directory_path() / fmt::format("fragctl_html_browser_{}", ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "profile");
    report_options o;
    o.replay.policy = "caching";
    o.replay.cfg.backend = backend_kind::sim;
    o.replay.cfg.sim_capacity = 64 * MiB;
    o.replay.cfg.log_level = "off";
    run_ = replay_run_report(fragmenting_trace(), o);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  std::string chromium_;
  fs::path dir_;
  run_report run_;
};

TEST_F(html_browser, dom_after_scripts_shows_maps_timeline_and_tooltip) {
  std::string html = render_html({run_});
  // What a hover does: the test moves the pointer onto the first live block
  // of the first map once the page's own script has run.
  const std::string probe =
      "<script>(function(){var b=document.querySelector('svg.memory-map .block.live');"
      "var r=b.getBoundingClientRect();b.dispatchEvent(new MouseEvent('mousemove',{bubbles:true,"
      "clientX:r.left+1,clientY:r.top+1}));document.body.dataset.probed='1';})();</script>\n";
  html.insert(html.rfind("</body>"), probe);
  const fs::path page = dir_ / "report.html";
  std::ofstream(page) << html;

  const run_result browser = run_chromium(chromium_, dir_ / "profile", "--dump-dom", page);
  ASSERT_EQ(browser.status, 0) << "chromium failed";
  const std::string& dom = browser.out;
  ASSERT_FALSE(dom.empty());

  // The page's script ran to its end, then the probe.
  EXPECT_THAT(dom, HasSubstr("data-ready=\"1\""));
  EXPECT_THAT(dom, HasSubstr("data-probed=\"1\""));
  std::size_t blocks = 0;
  std::size_t live = 0;
  std::size_t maps = 0;
  for (const labelled_map& m : run_.maps) {
    maps += m.map.available ? 1 : 0;
    blocks += m.map.block_count();
    for (const memory_segment& seg : m.map.segments)
      for (const memory_block& b : seg.blocks) live += b.use == block_use::live ? 1 : 0;
  }
  ASSERT_EQ(maps, 3u);
  EXPECT_THAT(dom, HasSubstr(fmt::format("data-maps=\"{}\"", maps)));
  EXPECT_THAT(dom, HasSubstr(fmt::format("data-blocks=\"{}\"", blocks)));
  EXPECT_EQ(occurrences(dom, "<rect class=\"block "), blocks);
  EXPECT_EQ(live, 3u + 4u);  // at the OOM: three 12 MiB blocks; at peak: those and the 4 KiB one
  EXPECT_EQ(occurrences(dom, "<rect class=\"block live\""), live);
  EXPECT_EQ(occurrences(dom, "<g class=\"legend-item\""), maps * (map_size_classes().size() + 2));

  // The timeline: both lines with one vertex per event, and the OOM.
  const std::regex reserved("<path class=\"line reserved\" d=\"(M[^\"]*)\"");
  std::smatch match;
  ASSERT_TRUE(std::regex_search(dom, match, reserved));
  EXPECT_EQ(occurrences(match[1].str(), "L"), fragmenting_trace().events.size() - 1);
  EXPECT_EQ(occurrences(dom, "<path class=\"line requested\""), 1u);
  EXPECT_EQ(occurrences(dom, "<g class=\"oom\" data-event=\"9\">"), 1u);

  // The tooltip shows the hovered block's address, size and stream.
  const std::regex tooltip("<div id=\"tooltip\" style=\"([^\"]*)\">([^<]*)</div>");
  ASSERT_TRUE(std::regex_search(dom, match, tooltip)) << "no tooltip in the DOM";
  EXPECT_THAT(match[1].str(), HasSubstr("display: block"));
  EXPECT_THAT(match[2].str(), HasSubstr("live block 0x"));
  EXPECT_THAT(match[2].str(), HasSubstr("size 12.00 MiB  (requested 12.00 MiB)"));
  EXPECT_THAT(match[2].str(), HasSubstr("stream default"));
  EXPECT_THAT(match[2].str(), HasSubstr("segment 0x"));
}

TEST_F(html_browser, screenshot_renders) {
  const fs::path page = dir_ / "report.html";
  std::ofstream(page) << render_html({run_});
  const fs::path png = dir_ / "report.png";
  const run_result browser = run_chromium(
      chromium_, dir_ / "profile", fmt::format("--window-size=1200,900 --screenshot='{}'", png.string()), page);
  ASSERT_EQ(browser.status, 0);
  ASSERT_TRUE(fs::exists(png));
  std::ifstream in(png, std::ios::binary);
  std::array<unsigned char, 24> head{};
  in.read(reinterpret_cast<char*>(head.data()), head.size());
  EXPECT_EQ(std::string(reinterpret_cast<char*>(head.data()) + 1, 3), "PNG");
  const auto be32 = [&](std::size_t at) {
    return (std::uint32_t{head[at]} << 24) | (std::uint32_t{head[at + 1]} << 16) | (std::uint32_t{head[at + 2]} << 8) |
           std::uint32_t{head[at + 3]};
  };
  EXPECT_EQ(be32(16), 1200u);  // IHDR width
  EXPECT_EQ(be32(20), 900u);   // IHDR height
  EXPECT_GT(fs::file_size(png), 20000u) << "a blank page compresses to almost nothing";
}

// `page` with every escaped occurrence of `payload` that `context` follows
// written raw: what the renderers wrote before issue 27 (map_svg's segment
// title, " pool, stream ..."), the positive control of the tests below.
std::string unescaped(std::string page, const std::string& payload, const std::string& context = "") {
  const std::string escaped = report_detail::escape_markup(payload) + context;
  std::size_t replaced = 0;
  for (std::size_t at = page.find(escaped); at != std::string::npos; at = page.find(escaped, at + payload.size())) {
    page.replace(at, escaped.size(), payload + context);
    ++replaced;
  }
  EXPECT_GT(replaced, 0u);
  return page;
}

// Issue 27, H1: every string of the report (name, source, allocator,
// backend, OOM advice, map labels and allocators, pools, trace and policy)
// holds a script that renames the page. Before, the pool reached the page
// raw in each segment's <title> and the page's title became "PWNED".
TEST_F(html_browser, a_report_whose_strings_hold_scripts_runs_none) {
  const std::string payload = "</title></rect></g></svg><script>document.title=\"PWNED\"</script><svg><g><rect><title>";
  fuzz::report_render_detail::for_each_string(run_, [&](std::string& s) { s = payload; });
  const std::string html = render_html({run_});
  const fs::path page = dir_ / "hostile.html";
  std::ofstream(page) << html;
  const run_result browser = run_chromium(chromium_, dir_ / "profile", "--dump-dom", page);
  ASSERT_EQ(browser.status, 0) << "chromium failed";
  EXPECT_THAT(browser.out, HasSubstr("data-ready=\"1\""));  // the page's own script ran
  EXPECT_THAT(browser.out, HasSubstr("<title>fragctl report: &lt;/title&gt;"));
  EXPECT_THAT(browser.out, Not(HasSubstr("<title>PWNED</title>")));

  // Positive control: the same page with the payload written raw renames
  // itself in this browser.
  const fs::path raw = dir_ / "raw.html";
  std::ofstream(raw) << unescaped(html, payload);
  const run_result control = run_chromium(chromium_, dir_ / "profile", "--dump-dom", raw);
  ASSERT_EQ(control.status, 0);
  EXPECT_THAT(control.out, HasSubstr("<title>PWNED</title>"));
}

// The standalone SVG (`fragctl report --svg`) is XML: a pool that closes
// the segment's <title> and opens an SVG <script> ran it when the file was
// opened in a browser.
TEST_F(html_browser, a_standalone_svg_whose_pool_holds_a_script_runs_none) {
  const std::string payload =
      "</title><script>document.documentElement.setAttribute(\"data-pwned\",\"1\")</script><title>";
  labelled_map map = run_.maps.front();
  for (memory_segment& s : map.map.segments) s.pool = payload;
  const std::string svg = render_map_svg(map);
  const fs::path file = dir_ / "hostile.svg";
  std::ofstream(file) << svg;
  const run_result browser = run_chromium(chromium_, dir_ / "profile", "--dump-dom", file);
  ASSERT_EQ(browser.status, 0) << "chromium failed";
  EXPECT_THAT(browser.out, HasSubstr("<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"memory-map\""));
  EXPECT_THAT(browser.out, Not(HasSubstr("parsererror")));  // well-formed XML
  EXPECT_THAT(browser.out, Not(HasSubstr("data-pwned=\"1\"")));

  // The old writer: the pool escaped in data-pool, raw in the title.
  const fs::path raw = dir_ / "raw.svg";
  std::ofstream(raw) << unescaped(svg, payload, " pool, stream");
  const run_result control = run_chromium(chromium_, dir_ / "profile", "--dump-dom", raw);
  ASSERT_EQ(control.status, 0);
  EXPECT_THAT(control.out, HasSubstr("data-pwned=\"1\""));
}

}  // namespace
}  // namespace fragctl
