// The fragctl command's conventions, run on the built binary: --version
// (and -V, version), --json on report and policies, and one report of
// several devices summarized per device rather than compared.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fragctl/policy.hpp"
#include "fragctl/stats_export.hpp"
#include "fragctl/version.hpp"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "support/stats_export_support.hpp"
#include "support/test_support.hpp"

namespace fragctl {
namespace {

using fragctl::testing::export_entries;
using fragctl::testing::fragctl_binary;
using fragctl::testing::run_fragctl;
using fragctl::testing::run_result;

class FragctlCliConventions : public fragctl::testing::fragctl_command_test {};

TEST_F(FragctlCliConventions, EverySpellingPrintsTheProjectVersion) {
  for (const char* spelling : {"--version", "-V", "version"}) {
    const run_result r = run_fragctl(spelling);
    EXPECT_EQ(r.status, 0) << spelling << ": " << r.out;
    EXPECT_EQ(r.out, std::string("fragctl ") + FRAGCTL_VERSION + "\n") << spelling;
  }
  EXPECT_EQ(std::string(FRAGCTL_VERSION),
            std::to_string(FRAGCTL_VERSION_MAJOR) + "." + std::to_string(FRAGCTL_VERSION_MINOR) + "." +
                std::to_string(FRAGCTL_VERSION_PATCH));
}

// Regression (a docs review, 2026-11-28): docs/replay.md says every command
// has --help, but `fragctl help --help` said "unknown command '--help'"
// (exit 2) and `fragctl version --help` printed the version; `version x`
// ignored the x.
TEST_F(FragctlCliConventions, HelpAndVersionHaveHelpToo) {
  for (const char* args : {"help --help", "help -h", "help help"}) {
    const run_result r = run_fragctl(args, "2>&1");
    EXPECT_EQ(r.status, 0) << args << ": " << r.out;
    EXPECT_NE(r.out.find("Commands:"), std::string::npos) << args << ": " << r.out;
  }
  for (const char* args : {"version --help", "version -h"}) {
    const run_result r = run_fragctl(args, "2>&1");
    EXPECT_EQ(r.status, 0) << args << ": " << r.out;
    EXPECT_EQ(r.out.rfind("Usage: fragctl version\n", 0), 0u) << args << ": " << r.out;
  }
  const run_result extra = run_fragctl("version x", "2>&1");
  EXPECT_EQ(extra.status, 2) << extra.out;
  EXPECT_NE(extra.out.find("takes no arguments, got 'x'"), std::string::npos) << extra.out;
}

TEST_F(FragctlCliConventions, PoliciesJsonListsEveryPolicy) {
  const run_result r = run_fragctl("policies --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), policies().size());
  for (std::size_t i = 0; i < j.size(); ++i) {
    EXPECT_EQ(j[i]["name"], std::string(policies()[i].name));
    EXPECT_EQ(j[i]["kind"], policies()[i].wraps_upstream ? "wrapper" : "base");
  }
}

// A report file of one job with allocators on devices 0 and 1.
std::string two_device_report() {
  std::vector<allocator_stats> devices(2);
  for (int d = 0; d < 2; ++d) {
    devices[d].allocator = "arena";
    devices[d].backend = "cuda";
    devices[d].device = d;
    devices[d].requested = {0, (d + 1) * MiB};
    devices[d].reserved = {0, (d + 2) * MiB};
  }
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("fragctl_two_devices_" + std::to_string(::getpid()) + ".json")).string();
  EXPECT_TRUE(write_stats_export_file(path, export_entries(devices), "test").ok());
  return path;
}

TEST_F(FragctlCliConventions, ReportOfSeveralDevicesIsSummarizedPerDevice) {
  const std::string path = two_device_report();
  const run_result r = run_fragctl("report '" + path + "'");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::size_t first = r.out.find("== device 0: arena");
  const std::size_t second = r.out.find("== device 1: arena");
  EXPECT_NE(first, std::string::npos) << r.out;
  EXPECT_NE(second, std::string::npos) << r.out;
  EXPECT_LT(first, second);
  // Control: two separate files of one device each are still compared side by side.
  const std::string one = path + ".one.json";
  std::vector<allocator_stats> single(1);
  single[0].allocator = "caching";
  ASSERT_TRUE(write_stats_export_file(one, export_entries(single), "test").ok());
  const run_result compared = run_fragctl("report '" + path + "' '" + one + "'");
  EXPECT_EQ(compared.status, 0) << compared.out;
  EXPECT_EQ(compared.out.find("== device"), std::string::npos) << compared.out;
  std::filesystem::remove(path);
  std::filesystem::remove(one);
}

TEST_F(FragctlCliConventions, ReportJsonHasEveryRunWithItsDevice) {
  const std::string path = two_device_report();
  const run_result r = run_fragctl("report --json '" + path + "'");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 2u);
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(j[d]["device"], d);
    EXPECT_EQ(j[d]["kind"], "report");
    EXPECT_EQ(j[d]["stats"]["requested_bytes"]["peak"].get<std::size_t>(), (d + 1) * MiB);
  }
  std::filesystem::remove(path);
}

// Regression (red team): an output named as one of the command's inputs
// replaced it: `report X --html X` turned the report or trace into HTML,
// `convert T T` dropped T's unreplayable rows for good, `replay T --conf
// trace:T` overwrote T with the replay's own trace; --html and --svg on one
// path kept only the SVG, `run --report F --trace F` only one of the two.
// Each is refused now (exit 2, both paths named) and the input kept byte for
// byte; devices are still written into.
TEST_F(FragctlCliConventions, AnOutputThatIsAnInputOrAnotherOutputIsRefusedAndTheInputKept) {
  namespace fs = std::filesystem;
  const fs::path dir = fragctl::testing::fresh_dir("cli_conventions", "output_is_input");
  const fs::path trace = dir / "t.csv";
  fs::copy_file(fragctl::testing::test_data("tiny_fragctl.csv"), trace);
  const std::string report = two_device_report();
  const fs::path link = dir / "link.csv";
  fs::create_symlink(trace, link);
  // A warmup profile (a report of an earlier run) is an input too (red team, 2026-11-28:
  // `--conf warmup_profile:P,trace:P` replaced the profile with the replay's trace).
  const fs::path profile = dir / "profile.json";
  ASSERT_EQ(run_fragctl("replay '" + trace.string() + "' --backend sim --policy arena --conf report:" +
                        profile.string(), ">/dev/null 2>&1")
                .status,
            0);
  const std::string trace_text = fragctl::testing::read_file(trace);
  const std::string report_text = fragctl::testing::read_file(report);
  const std::string profile_text = fragctl::testing::read_file(profile);
  const auto q = [](const fs::path& p) { return "'" + p.string() + "'"; };
  struct refused {
    std::string args;
    std::string says;
  };
  const std::vector<refused> cases{
      {"report " + q(trace) + " --html " + q(trace), "is the same file as the input"},
      {"report " + q(report) + " --html " + q(report), "is the same file as the input"},
      {"report " + q(report) + " --svg " + q(report), "is the same file as the input"},
      {"convert " + q(trace) + " " + q(trace), "is the same file as the input"},
      {"convert " + q(link) + " " + q(trace), "is the same file as the input"},
      {"replay " + q(trace) + " --backend sim --conf trace:" + trace.string(), "is the same file as the input"},
      {"report " + q(report) + " --html " + q(dir / "page") + " --svg " + q(dir / "page"), "name the same file"},
      {"run --backend sim --report " + q(dir / "out") + " --trace " + q(dir / "out") + " -- true",
       "name the same file"},
      {"replay " + q(trace) + " --backend sim --policy warmup:arena --conf warmup_profile:" + profile.string() +
           ",trace:" + profile.string(),
       "is the same file as the input"},
      {"report " + q(trace) + " --backend sim --policy warmup:arena --conf warmup_profile:" + profile.string() +
           ",report:" + profile.string(),
       "is the same file as the input"},
      {"run --backend sim --report " + q(dir / "out") + " --conf trace:" + (dir / "out").string() + " -- true",
       "name the same file"},
      {"run --backend sim --conf warmup_profile:" + profile.string() + ",report:" + profile.string() + " -- true",
       "is the same file as the input"},
  };
  for (const refused& c : cases) {
    const run_result r = run_fragctl(c.args, "2>&1");
    EXPECT_EQ(r.status, 2) << c.args << ": " << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.args << ": " << r.out;
  }
  EXPECT_EQ(fragctl::testing::read_file(trace), trace_text);
  EXPECT_EQ(fragctl::testing::read_file(report), report_text);
  EXPECT_EQ(fragctl::testing::read_file(profile), profile_text);
  EXPECT_FALSE(fs::exists(dir / "page"));
  EXPECT_FALSE(fs::exists(dir / "out"));
  // Controls: other files, and one device named twice, are written.
  EXPECT_EQ(run_fragctl("convert " + q(trace) + " " + q(dir / "copy.csv")).status, 0);
  EXPECT_EQ(run_fragctl("report " + q(trace) + " --html /dev/null --svg /dev/null", "2>&1 >/dev/null").status, 0);
  EXPECT_EQ(run_fragctl("report " + q(report) + " --html " + q(dir / "page.html")).status, 0);
  EXPECT_TRUE(fs::exists(dir / "page.html"));
  fs::remove(report);
}

// Regression (red team, 2026-11-28): `fragctl replay` printed its error
// lines raw, so a snapshot's unknown action (or a file name) could carry
// terminal controls (a title change, a screen clear) to the user's
// terminal; the other commands escaped them. Every line is escaped now, and
// the reader quotes the action as it quotes CSV fields. A snapshot time of
// 2^63 microseconds or more, cast to a negative one before, is refused.
TEST_F(FragctlCliConventions, ReplayErrorLinesReachTheTerminalEscaped) {
  namespace fs = std::filesystem;
  const fs::path dir = fragctl::testing::fresh_dir("cli_conventions", "escaped_errors");
  const fs::path snapshot = dir / "esc.json";
  std::ofstream(snapshot) << R"({"device_traces":[[{"action":"\u001b]0;PWNED\u0007\u001b[2Jx","addr":1,"size":2}]]})";
  for (const std::string command : {"replay --backend sim", "info", "report --backend sim"}) {
    const run_result r = run_fragctl(command + " '" + snapshot.string() + "'", "2>&1");
    EXPECT_NE(r.status, 0) << command;
    EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << command << ": a raw escape reached the terminal: " << r.out;
    EXPECT_EQ(r.out.find('\x07'), std::string::npos) << command << ": " << r.out;
    EXPECT_NE(r.out.find("unknown action '\\x1b]0;PWNED\\x07\\x1b[2Jx'"), std::string::npos) << command << ": " << r.out;
  }
  const fs::path late = dir / "late.json";
  std::ofstream(late) << R"({"device_traces":[[{"action":"alloc","addr":1,"size":2,"time_us":9223372036854775808}]]})";
  const run_result r = run_fragctl("replay '" + late.string() + "' --backend sim", "2>&1");
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("'time_us' is not a non-negative integer below 2^63"), std::string::npos) << r.out;
  // Control: the largest time allowed is read.
  const fs::path latest = dir / "latest.json";
  std::ofstream(latest) << R"({"device_traces":[[{"action":"alloc","addr":1,"size":2,"time_us":9223372036854775807}]]})";
  EXPECT_EQ(run_fragctl("info '" + latest.string() + "'").status, 0);
}

}  // namespace
}  // namespace fragctl
