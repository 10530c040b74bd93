// The `fragctl` command end to end: runs the built binary (<build>/tools/fragctl,
// found next to this test's own directory) and checks its output and exit
// status.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "fragctl/trace.hpp"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "support/test_support.hpp"

namespace fragctl {
namespace {

using fragctl::testing::test_data;
using fragctl::testing::run_result;
using fragctl::testing::fragctl_binary;
using fragctl::testing::run_fragctl;

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class FragctlCli : public fragctl::testing::fragctl_command_test {};

TEST_F(FragctlCli, ReplayJson) {
  const run_result r =
      run_fragctl("replay '" + test_data("tiny_fragctl.csv") + "' --policy caching --backend sim --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0]["trace"], "tiny_fragctl");
  EXPECT_EQ(j[0]["policy"], "caching");
  EXPECT_EQ(j[0]["backend"], "sim");
  EXPECT_EQ(j[0]["peak_requested"].get<std::size_t>(), 3000000u + 4096u);
  EXPECT_EQ(j[0]["operations"].get<std::size_t>(), 6u);
  EXPECT_EQ(j[0]["unknown_frees"].get<std::size_t>(), 0u);
}

TEST_F(FragctlCli, ReplayTableHasOneRowPerTraceAndPolicy) {
  const run_result r = run_fragctl("replay '" + test_data("tiny_fragctl.csv") + "' '" +
                                   test_data("tiny_rmm.csv") + "' --policy caching --backend sim");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("reserved/requested"));
  EXPECT_THAT(r.out, HasSubstr("tiny_fragctl  caching"));
  EXPECT_THAT(r.out, HasSubstr("tiny_rmm"));
  EXPECT_THAT(r.out, HasSubstr("2.86 MiB"));  // tiny_fragctl's peak requested, 3004096 bytes
}

TEST_F(FragctlCli, MalformedTraceExitsOneWithTheLine) {
  const fs::path bad = fs::path(::testing::TempDir()) / "bad_number.csv";
  std::ofstream(bad) << "action,addr,size,stream,time_us\nalloc,4096,512,0,1\nalloc,8192,lots,0,2\n";
  const run_result r = run_fragctl("replay '" + bad.string() + "' --backend sim", "2>&1 >/dev/null");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.out, HasSubstr("bad_number.csv:3: bad size 'lots'"));
}

// Issue 18: a trace that cannot be read dropped the JSON of the traces
// replayed before it; now they are printed and the exit status is 1.
TEST_F(FragctlCli, ReplayJsonKeepsResultsBeforeAnUnreadableTrace) {
  const fs::path bad = fs::path(::testing::TempDir()) / "unreadable.csv";
  std::ofstream(bad) << "action,addr,size,stream,time_us\nalloc,4096,lots,0,1\n";
  const run_result r = run_fragctl("replay '" + test_data("tiny_fragctl.csv") + "' '" + bad.string() +
                                   "' --policy caching --backend sim --json");
  EXPECT_EQ(r.status, 1);
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 1u) << r.out;
  EXPECT_EQ(j[0]["trace"], "tiny_fragctl");
}

// Issue 18: one allocation over 2^62 bytes aborted the policy's replay.
TEST_F(FragctlCli, ReplayCountsAnOversizedRowAndGoesOn) {
  const fs::path trace = fs::path(::testing::TempDir()) / "oversized.csv";
  std::ofstream(trace) << "action,addr,size,stream,time_us\nalloc,4096,512,0,1\n"
                          "alloc,8192,18446744073709551615,0,2\nfree_requested,4096,512,0,3\n";
  const run_result r = run_fragctl("replay '" + trace.string() + "' --policy caching,arena --backend sim --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 2u);
  for (const auto& result : j) {
    EXPECT_EQ(result["refused"].get<std::uint64_t>(), 1u);
    EXPECT_EQ(result["peak_requested"].get<std::uint64_t>(), 512u);
  }
}

// Issue 16: a trace with the header only (a run whose rows never reached the
// file) replayed as a peak of 0 B with exit status 0. Now it is skipped with
// a message and exit status 3; the other traces still replay.
TEST_F(FragctlCli, ReplayOfATraceWithoutEventsSaysSoAndExitsThree) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("fragctl_cli_empty_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path header_only = dir / "header_only.csv";
  const fs::path ended_empty = dir / "ended_empty.csv";
  const fs::path err = dir / "stderr.txt";
  std::ofstream(header_only) << "action,addr,size,stream,time_us\n";
  std::ofstream(ended_empty) << "action,addr,size,stream,time_us\nend,0,0,0,5\n";
  for (const fs::path& empty : {header_only, ended_empty}) {
    const run_result r = run_fragctl("replay '" + test_data("tiny_fragctl.csv") + "' '" + empty.string() +
                                         "' --policy caching --backend sim --json",
                                     "2>'" + err.string() + "'");
    EXPECT_EQ(r.status, 3) << empty;
    const auto j = nlohmann::json::parse(r.out);
    ASSERT_EQ(j.size(), 1u) << r.out;
    EXPECT_EQ(j[0]["trace"], "tiny_fragctl");
    EXPECT_THAT(fragctl::testing::read_file(err), HasSubstr(empty.string() + ": no allocation or free to replay"));
  }
  // A trace that cannot be read still gives 1, the worse outcome.
  const fs::path bad = dir / "unreadable.csv";
  std::ofstream(bad) << "action,addr,size,stream,time_us\nalloc,4096,lots,0,1\n";
  EXPECT_EQ(run_fragctl("replay '" + header_only.string() + "' '" + bad.string() + "' --backend sim").status, 1);
  fs::remove_all(dir);
}

// Regression (issue 27 M3): a trace whose writer was killed (no end row at
// its end) was summarized and replayed as a whole run. Now `info` and
// `replay` say it is cut (a warning in text, "complete"/"trace_complete":
// false in JSON), and --require-complete refuses it with exit status 1; a
// trace that ends with its end row passes, and one that cannot tell (no end
// row, another tool's) is null in JSON and refused only under
// --require-complete.
TEST_F(FragctlCli, InfoAndReplaySayATraceIsCutAndRequireCompleteRefusesIt) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("fragctl_cli_cut_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string head =
      "action,addr,size,stream,time_us\n# fragctl trace: complete when its last row is an end row\n"
      "alloc,4096,512,0,1\nalloc,8192,1024,0,2\n";
  const fs::path cut = dir / "cut.csv";
  const fs::path whole = dir / "whole.csv";
  const fs::path foreign = dir / "foreign.csv";
  std::ofstream(cut) << head << "end,0,2,0,3\nfree_requested,4096,512,0,4\n";
  std::ofstream(whole) << head << "free_requested,4096,512,0,4\nend,0,3,0,5\n";
  std::ofstream(foreign) << "action,addr,size,stream,time_us\nalloc,4096,512,0,1\n";
  const fs::path err = dir / "stderr.txt";
  const auto quoted = [](const fs::path& p) { return "'" + p.string() + "'"; };

  run_result r = run_fragctl("info " + quoted(cut), "2>" + quoted(err));
  EXPECT_EQ(r.status, 0);
  EXPECT_THAT(r.out, HasSubstr("complete        no: cut, its tail is missing"));
  EXPECT_THAT(fragctl::testing::read_file(err), HasSubstr("fragctl info: warning: " + cut.string() +
                                                          ": the trace is cut (1 row that no end row counts)"));

  r = run_fragctl("info --json " + quoted(cut) + " " + quoted(whole) + " " + quoted(foreign), "2>/dev/null");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto info = nlohmann::json::parse(r.out);
  ASSERT_EQ(info.size(), 3u);
  EXPECT_EQ(info[0]["complete"], false);
  EXPECT_EQ(info[1]["complete"], true);
  EXPECT_TRUE(info[2]["complete"].is_null());

  r = run_fragctl("info --require-complete " + quoted(cut), "2>" + quoted(err));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(fragctl::testing::read_file(err), HasSubstr("refused (--require-complete)"));
  EXPECT_EQ(run_fragctl("info --require-complete " + quoted(foreign), "2>/dev/null").status, 1);
  EXPECT_EQ(run_fragctl("info --require-complete " + quoted(whole), "2>" + quoted(err)).status, 0);  // control
  EXPECT_EQ(fragctl::testing::read_file(err), "");

  r = run_fragctl("replay --json --policy caching --backend sim " + quoted(cut) + " " + quoted(whole),
                  "2>" + quoted(err));
  ASSERT_EQ(r.status, 0) << r.out;
  const auto replayed = nlohmann::json::parse(r.out);
  ASSERT_EQ(replayed.size(), 2u);
  EXPECT_EQ(replayed[0]["trace_complete"], false);
  EXPECT_EQ(replayed[1]["trace_complete"], true);
  EXPECT_THAT(fragctl::testing::read_file(err), HasSubstr("fragctl replay: warning: " + cut.string()));

  r = run_fragctl(
      "replay --json --require-complete --policy caching --backend sim " + quoted(cut) + " " + quoted(whole),
      "2>" + quoted(err));
  EXPECT_EQ(r.status, 1);
  const auto required = nlohmann::json::parse(r.out);
  ASSERT_EQ(required.size(), 1u) << r.out;  // the whole trace still replays
  EXPECT_EQ(required[0]["trace"], "whole");
  EXPECT_THAT(fragctl::testing::read_file(err), HasSubstr(cut.string() + ": the trace is cut"));
  fs::remove_all(dir);
}

TEST_F(FragctlCli, UsageErrorsExitTwo) {
  run_result r = run_fragctl("replay --frobnicate x", "2>&1");
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.out, HasSubstr("unknown option '--frobnicate'"));
  r = run_fragctl("replay", "2>&1");
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.out, HasSubstr("no trace given"));
  r = run_fragctl("replay x.csv --policy no-such-policy", "2>&1");
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.out, HasSubstr("--policy"));
  r = run_fragctl("replay x.csv --capacity lots", "2>&1");
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.out, HasSubstr("--capacity"));
  r = run_fragctl("replay x.csv --capacity 5000000TiB", "2>&1");  // issue 18: above the 2^62 cap
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.out, HasSubstr("--capacity: expected a size such as 80GiB, at most 2^62 bytes"));
  r = run_fragctl("frobnicate", "2>&1");
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.out, HasSubstr("unknown command 'frobnicate'"));
}

TEST_F(FragctlCli, Help) {
  run_result r = run_fragctl("--help");
  EXPECT_EQ(r.status, 0);
  EXPECT_THAT(r.out, HasSubstr("replay"));
  EXPECT_THAT(r.out, HasSubstr("convert"));
  r = run_fragctl("replay --help");
  EXPECT_EQ(r.status, 0);
  EXPECT_THAT(r.out, HasSubstr("Usage: fragctl replay"));
  EXPECT_THAT(r.out, HasSubstr("--policy"));
  EXPECT_THAT(r.out, HasSubstr("caching"));
}

TEST_F(FragctlCli, ConvertWritesFragctlCsv) {
  const fs::path out = fs::path(::testing::TempDir()) / "converted.csv.gz";
  const run_result r = run_fragctl("convert '" + test_data("tiny_snapshot.json") + "' '" + out.string() + "'");
  ASSERT_EQ(r.status, 0) << r.out;
  auto t = read_trace(out.string());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->format, "fragctl-csv");
  auto original = read_trace(test_data("tiny_snapshot.json"));
  ASSERT_TRUE(original.ok()) << original.status();
  EXPECT_EQ(t->events, original->events);
}

// A snapshot saved by torch.cuda.memory._dump_snapshot() (a pickle) replays
// and reports exactly as its JSON form does.
TEST_F(FragctlCli, ReplayAndReportReadPickledSnapshotsAsTheirJson) {
  const auto replay = [](const std::string& file) {
    const run_result r = run_fragctl("replay '" + test_data(file) + "' --policy caching,arena --backend sim --json");
    EXPECT_EQ(r.status, 0) << file << ": " << r.out;
    auto j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
    for (auto& run : j)  // the name, and the timings, which vary run to run
      for (const char* key : {"trace", "median_ns", "p99_ns", "p90_ns", "median_alloc_ns", "p90_alloc_ns",
                              "median_free_ns", "p90_free_ns", "total_ms", "clock_overhead_ns"})
        run.erase(key);
    return j;
  };
  const nlohmann::json expected = replay("tiny_snapshot_pickled.json");
  ASSERT_EQ(expected.size(), 2u);
  EXPECT_EQ(expected[0]["operations"].get<std::size_t>(), 4u);
  for (const char* file : {"tiny_snapshot_pickled.p2.pickle", "tiny_snapshot_pickled.p5.pickle",
                           "tiny_snapshot_pickled.p4.pickle.gz"})
    EXPECT_EQ(replay(file), expected) << file;

  // The report names the trace after its file: give both the same name, the
  // pickle under a .json name too (the content decides the format).
  const auto report = [](const std::string& file, const std::string& dir_name) {
    const fs::path dir = fs::path(::testing::TempDir()) / dir_name;
    fs::create_directories(dir);
    fs::copy_file(test_data(file), dir / "snapshot.json", fs::copy_options::overwrite_existing);
    run_result r = run_fragctl("report '" + (dir / "snapshot.json").string() + "' --policy caching");
    EXPECT_EQ(r.status, 0) << file << ": " << r.out;
    std::string kept;  // without the timings ("median 1447 ns, p99 18267 ns"), which vary run to run
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);)
      if (line.find(" ns") == std::string::npos) kept += line + "\n";
    return kept;
  };
  const std::string report_json = report("tiny_snapshot_pickled.json", "report_json");
  EXPECT_THAT(report_json, HasSubstr("replayed through caching"));
  EXPECT_THAT(report_json, HasSubstr("5.50 KiB"));  // peak requested: 1536 + 4096 bytes live at once
  EXPECT_EQ(report("tiny_snapshot_pickled.p4.pickle", "report_pickle"), report_json);
}

TEST_F(FragctlCli, InfoJson) {
  const run_result r = run_fragctl("info '" + test_data("tiny_fragctl.csv") + "' --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0]["peak_live_bytes"].get<std::size_t>(), 3004096u);
  EXPECT_EQ(j[0]["allocs"].get<std::size_t>(), 3u);
}

// Issue 27 (low): an environment value fragctl quotes reached the terminal
// with its escapes (here one that clears the screen).
TEST_F(FragctlCli, RunShowsAQuotedEnvironmentValueWithItsEscapesWrittenOut) {
  const auto run = [](const std::string& pytorch_conf) {
    return fragctl::testing::run_command("env -u FRAGCTL_CONF PYTORCH_CUDA_ALLOC_CONF='" + pytorch_conf + "' '" +
                                         fragctl::testing::fragctl_binary().string() +
                                         "' run --backend sim -- true 2>&1");
  };
  const run_result hostile = run("max_split_size_mb:128,mine:\x1b[2J");
  EXPECT_THAT(hostile.out,
              HasSubstr("fragctl run: PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128,mine:\\x1b[2J is applied"));
  EXPECT_EQ(hostile.out.find('\x1b'), std::string::npos) << hostile.out;
  // Positive control: a plain value is quoted as it is.
  EXPECT_THAT(run("max_split_size_mb:128").out,
              HasSubstr("fragctl run: PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128 is applied"));
}

// Regression (a docs review, 2026-11-28): `fragctl run` moved a user's whole
// PYTORCH_CUDA_ALLOC_CONF into FRAGCTL_CONF, so a PyTorch key fragctl has no
// option for (pinned_use_cuda_host_register, garbage_collection_threshold)
// stopped the run with exit 2, asking for the key to be left in
// PYTORCH_CUDA_ALLOC_CONF, where the user had put it; and PyTorch never got
// its own keys. Now fragctl takes what it applies, PyTorch keeps its pinned
// host memory's keys (and any fragctl does not know), and the keys of
// PyTorch's own device allocator, which the shim replaces, are left out,
// each said on one line.
TEST_F(FragctlCli, RunSharesAUsersPytorchConfBetweenFragctlAndPytorch) {
  const auto run = [](const std::string& pytorch_conf, const std::string& options = "") {
    return fragctl::testing::run_command("env -u FRAGCTL_CONF PYTORCH_CUDA_ALLOC_CONF='" + pytorch_conf + "' '" +
                                         fragctl::testing::fragctl_binary().string() + "' run --backend sim " +
                                         options + " -- true 2>&1");
  };
  const run_result mixed =
      run("max_split_size_mb:128,garbage_collection_threshold:0.6,pinned_use_cuda_host_register:True");
  EXPECT_NE(mixed.status, 2) << mixed.out;
  EXPECT_THAT(mixed.out, HasSubstr("fragctl takes max_split_size_mb:128 (as FRAGCTL_CONF); PyTorch gets "
                                   "backend:cudaMallocAsync,pinned_use_cuda_host_register:True; left out: "
                                   "garbage_collection_threshold:0.6"));
  const run_result torch_only = run("roundup_power2_divisions:4,pinned_num_register_threads:2");
  EXPECT_NE(torch_only.status, 2) << torch_only.out;
  EXPECT_THAT(torch_only.out, HasSubstr("fragctl takes nothing; PyTorch gets "
                                        "backend:cudaMallocAsync,pinned_num_register_threads:2; left out: "
                                        "roundup_power2_divisions:4"));
  // PyTorch's list values keep their commas (a review found them split).
  EXPECT_THAT(run("roundup_power2_divisions:[256:1,512:2,>:1],max_split_size_mb:128").out,
              HasSubstr("fragctl takes max_split_size_mb:128 (as FRAGCTL_CONF); PyTorch gets backend:cudaMallocAsync; "
                        "left out: roundup_power2_divisions:[256:1,512:2,>:1]"));
  EXPECT_THAT(run("max_split_size_mb:128", "--conf limit:1GiB").out,
              HasSubstr("fragctl takes nothing (--conf is given; max_split_size_mb:128 not applied)"));
  // Control: a bad value of a key fragctl applies still stops the run.
  const run_result bad = run("max_split_size_mb:0,pinned_use_cuda_host_register:True");
  EXPECT_EQ(bad.status, 2) << bad.out;
  EXPECT_THAT(bad.out, HasSubstr("bad value \"0\" for max_split_size_mb"));
}

// Regression (red team): `fragctl run` checked --policy and --backend but
// not FRAGCTL_POLICY or FRAGCTL_BACKEND from the environment: with a typo
// the program started and every allocation of its failed. Now it stops
// before the program starts, naming the variable.
TEST_F(FragctlCli, RunRefusesABadPolicyOrBackendFromTheEnvironmentBeforeStarting) {
  const auto run = [](const std::string& variables) {
    return fragctl::testing::run_command("env " + variables + " '" + fragctl::testing::fragctl_binary().string() +
                                         "' run -- sh -c 'echo started' 2>&1");
  };
  const run_result policy = run("FRAGCTL_POLICY=bogus FRAGCTL_BACKEND=sim");
  EXPECT_EQ(policy.status, 2) << policy.out;
  EXPECT_THAT(policy.out, HasSubstr("fragctl run: FRAGCTL_POLICY: policy \"bogus\": unknown policy"));
  EXPECT_EQ(policy.out.find("started"), std::string::npos) << policy.out;
  const run_result backend = run("FRAGCTL_BACKEND=bogus");
  EXPECT_EQ(backend.status, 2) << backend.out;
  EXPECT_THAT(backend.out, HasSubstr("fragctl run: FRAGCTL_BACKEND: "));
  EXPECT_EQ(backend.out.find("started"), std::string::npos) << backend.out;
  // Control: good values pass the check (the program starts; under the
  // sanitizer build the preloaded library cannot load into sh, so its
  // output is not asserted).
  const run_result good = run("FRAGCTL_POLICY=caching FRAGCTL_BACKEND=sim");
  EXPECT_NE(good.status, 2) << good.out;
  EXPECT_EQ(good.out.find("fragctl run: FRAGCTL_"), std::string::npos) << good.out;
}

// Regressions (red team), each on the built command:
// * a full or closed standard output exited 0 with the output cut;
// * a trace's times from INT64_MIN to INT64_MAX overflowed info's duration
//   (UBSan; a negative duration where times went backwards), and a GPU lag
//   of INT64_MAX us wrapped its due time into the past (a lag of 10^18 us and
//   one of INT64_MAX us gave different results; UBSan);
// * an allocation at a live address was counted nowhere by info;
// * a trace file name's terminal escapes reached the terminal raw from
//   info, replay and convert.
TEST_F(FragctlCli, OutputErrorsWideNumbersAndHostileNamesAreHandled) {
  namespace fs = std::filesystem;
  const fs::path dir = fragctl::testing::fresh_dir("fragctl_cli", "wide_and_hostile");
  const std::string tiny = test_data("tiny_fragctl.csv");
  const auto q = [](const fs::path& p) { return "'" + p.string() + "'"; };

  const run_result full = run_fragctl("info '" + tiny + "'", "2>&1 >/dev/full");
  EXPECT_EQ(full.status, 1) << full.out;
  EXPECT_THAT(full.out, HasSubstr("fragctl: standard output: No space left on device"));
  EXPECT_EQ(run_fragctl("info '" + tiny + "'", "2>/dev/null >&-").status, 1);
  EXPECT_EQ(run_fragctl("info '" + tiny + "' >/dev/null").status, 0);  // control

  const fs::path wide = dir / "wide.csv";
  std::ofstream(wide) << "action,addr,size,stream,time_us\nalloc,1024,100,0,9223372036854775807\n"
                         "alloc,1024,100,0,-9223372036854775808\nfree_requested,1024,100,0,0\n";
  const run_result info = run_fragctl("info --json " + q(wide));
  ASSERT_EQ(info.status, 0) << info.out;
  const auto j = nlohmann::json::parse(info.out);
  EXPECT_EQ(j[0]["duration_us"].get<std::int64_t>(), INT64_MAX);
  EXPECT_EQ(j[0]["lost_frees"].get<std::size_t>(), 1u);
  EXPECT_EQ(j[0]["overlapping_allocs"].get<std::size_t>(), 0u);

  const auto calls = [&](const std::string& lag) {
    const run_result r = run_fragctl("replay '" + test_data("gpt2m.trace.csv.gz") +
                                     "' --backend sim --policy arena --json --gpu-lag-us " + lag);
    EXPECT_EQ(r.status, 0) << lag << ": " << r.out;
    return nlohmann::json::parse(r.out)[0]["backend_memory_calls"].get<std::uint64_t>();
  };
  EXPECT_EQ(calls("9223372036854775807"), calls("1000000000000000000")) << "both lags outlast the trace";

  const fs::path hostile = dir / "evil\x1b]0;PWN\x07\x1b[2J.csv";
  fs::copy_file(tiny, hostile);
  for (const std::string& args : {"info " + q(hostile), "replay --backend sim " + q(hostile),
                                  "convert " + q(hostile) + " " + q(dir / "out.csv")}) {
    const run_result r = run_fragctl(args, "2>&1");
    EXPECT_EQ(r.status, 0) << args << ": " << r.out;
    EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << args << ": " << r.out;
    EXPECT_THAT(r.out, HasSubstr("evil\\x1b]0;PWN")) << args;
  }
}

// Regression (red team): three messages that did not say what was wrong:
// `run --report ''` said "filesystem error: cannot make absolute path";
// `report` of a missing file said "cannot open" without the reason; a NUL
// byte in a CSV field ended the message there.
TEST_F(FragctlCli, MessagesNameTheProblem) {
  namespace fs = std::filesystem;
  const fs::path dir = fragctl::testing::fresh_dir("fragctl_cli", "messages");
  const run_result empty = run_fragctl("run --report '' -- true", "2>&1");
  EXPECT_EQ(empty.status, 2) << empty.out;
  EXPECT_THAT(empty.out, HasSubstr("--report: expected a file path, got an empty one"));
  const run_result missing = run_fragctl("report '" + (dir / "missing.json").string() + "'", "2>&1");
  EXPECT_EQ(missing.status, 1) << missing.out;
  EXPECT_THAT(missing.out, HasSubstr("missing.json: cannot open: No such file or directory"));
  const fs::path nul = dir / "nul.csv";
  { std::ofstream(nul) << std::string("action,addr,size,stream,time_us\nalloc,1\0,1,0,1\n", 47); }
  const run_result bad = run_fragctl("info '" + nul.string() + "'", "2>&1");
  EXPECT_EQ(bad.status, 1) << bad.out;
  EXPECT_THAT(bad.out, HasSubstr("bad addr '1\\x00' (expected a decimal"));
}

}  // namespace
}  // namespace fragctl
