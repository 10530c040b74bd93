// `fragctl report run.*.json` of one job's ranks (issue 31, deliverable 2;
// docs/reports.md, "Every rank side by side"): one table, a row per rank,
// the imbalance called out with the rank that holds the most, the device
// memory that is not fragctl's, as text, JSON and HTML; and reports that are
// not one job's ranks still compare as before.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fmt/format.h"
#include "fragctl/device_memory.hpp"
#include "fragctl/run_report.hpp"
#include "fragctl/stats_export.hpp"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "support/stats_export_support.hpp"
#include "support/test_support.hpp"

namespace fragctl {
namespace {

namespace fs = std::filesystem;
using fragctl::testing::export_entries;
using fragctl::testing::occurrences;
using fragctl::testing::read_file;
using fragctl::testing::run_command;
using fragctl::testing::run_fragctl;
using fragctl::testing::run_result;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

fs::path fresh_dir(std::string_view name) { return testing::fresh_dir("rank_table", name); }

// The figures of one rank's allocator; device memory on an 80 GiB device
// with `outside` bytes not fragctl's, `at_start` of them held before.
allocator_stats rank_stats(std::size_t reserved_peak, std::size_t requested_peak, std::size_t outside = 0,
                           std::size_t at_start = 0) {
  allocator_stats s;
  s.allocator = "caching";
  s.backend = "sim";
  s.reserved = {reserved_peak - 10 * MiB, reserved_peak};
  s.requested = {requested_peak / 2, requested_peak};
  s.allocated = {requested_peak / 2 + 1 * MiB, requested_peak + 1 * MiB};
  s.pool.largest_free_block = 4 * MiB;
  s.device_memory.measured = true;
  s.device_memory.total = 80 * GiB;
  s.device_memory.free = 80 * GiB - s.reserved.current - outside;
  s.device_memory.outside_at_start = at_start;
  return s;
}

oom_event oom_of(oom_verdict v) {
  oom_event e;
  e.verdict = v;
  e.details.requested = 1 * GiB;
  return e;
}

// Writes rank `rank`'s report as a process of a torchrun job of `world` ranks
// would (the document reads the launcher's variables when written).
fs::path write_rank(const fs::path& dir, int rank, int world, const allocator_stats& s) {
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(rank % 2).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  const std::string doc = stats_export_to_json(export_entries({s}), "exit");
  for (const char* name : {"RANK", "LOCAL_RANK", "WORLD_SIZE"}) ::unsetenv(name);
  const fs::path path = dir / fmt::format("run.{}.json", rank);
  std::ofstream(path) << doc;
  return path;
}

std::vector<run_report> load_all(const std::vector<fs::path>& paths) {
  std::vector<run_report> runs;
  for (const fs::path& p : paths) {
    auto loaded = load_run_reports(p.string());
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    if (!loaded.ok()) continue;
    for (run_report& r : *loaded) runs.push_back(std::move(r));
  }
  return runs;
}

// Four ranks whose every figure is known: rank 2 reserves 150 MiB at peak,
// the others 100 to 102 MiB, with the same live bytes; rank 3 ran out of
// memory twice. Written in the order 3, 1, 2, 0: the table is by rank.
std::vector<run_report> four_ranks(const fs::path& dir) {
  allocator_stats r3 = rank_stats(102 * MiB, 80 * MiB, 700 * MiB, 500 * MiB);
  r3.ooms = 2;
  r3.oom_events = {oom_of(oom_verdict::fragmentation), oom_of(oom_verdict::capacity)};
  return load_all({write_rank(dir, 3, 4, r3),
                   write_rank(dir, 1, 4, rank_stats(101 * MiB, 80 * MiB, 600 * MiB, 500 * MiB)),
                   write_rank(dir, 2, 4, rank_stats(150 * MiB, 80 * MiB, 900 * MiB, 500 * MiB)),
                   write_rank(dir, 0, 4, rank_stats(100 * MiB, 80 * MiB, 600 * MiB, 500 * MiB))});
}

TEST(rank_table, four_reports_of_one_job_are_four_rows_by_rank) {
  const std::vector<run_report> runs = four_ranks(fresh_dir("four"));
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_EQ(runs[0].writer.rank, 3);
  EXPECT_EQ(runs[0].writer.world_size, 4);
  EXPECT_EQ(runs[0].writer.launcher, "torchrun");
  ASSERT_TRUE(runs_are_ranks(runs));
  const std::string text = render_rank_table(runs);
  EXPECT_THAT(text, HasSubstr("fragctl report: 4 ranks side by side (torchrun, world size 4, 1 host)\n"));
  EXPECT_THAT(text, HasSubstr("\n  rank    reserved  peak reserved  requested  peak requested  allocated  peak "
                              "allocated     cached  largest free  not fragctl's  OOMs\n"));
  // One row per rank, in rank order: reserved now and at peak, requested and
  // allocated now and at peak, cached (reserved - allocated now: 90 - 41),
  // the largest free block, not fragctl's (device used 690 MiB - reserved
  // 90 MiB), the OOMs with their verdicts.
  const std::string rows[] = {
      "\n  0      90.00 MiB     100.00 MiB  40.00 MiB       80.00 MiB  41.00 MiB       81.00 MiB  49.00 MiB      4.00 "
      "MiB"
      "     600.00 MiB  0\n",
      "\n  1      91.00 MiB     101.00 MiB  40.00 MiB       80.00 MiB  41.00 MiB       81.00 MiB  50.00 MiB      4.00 "
      "MiB"
      "     600.00 MiB  0\n",
      "\n  2     140.00 MiB     150.00 MiB  40.00 MiB       80.00 MiB  41.00 MiB       81.00 MiB  99.00 MiB      4.00 "
      "MiB"
      "     900.00 MiB  0\n",
      "\n  3      92.00 MiB     102.00 MiB  40.00 MiB       80.00 MiB  41.00 MiB       81.00 MiB  51.00 MiB      4.00 "
      "MiB"
      "     700.00 MiB  2: fragmentation 1, capacity 1\n"};
  std::size_t last = 0;
  for (const std::string& row : rows) {
    const std::size_t at = text.find(row);
    ASSERT_NE(at, std::string::npos) << row << "\nnot in\n" << text;
    EXPECT_GT(at, last) << "rows out of rank order";
    last = at;
  }
  // No fifth row: the line after rank 3's is the note.
  EXPECT_THAT(text, HasSubstr("capacity 1\n  (cached: reserved - allocated now;"));
  EXPECT_THAT(text, HasSubstr("  rank 2 = "));
  EXPECT_THAT(text, HasSubstr("run.2.json (caching on sim device 0, host "));
}

TEST(rank_table, the_imbalance_line_names_the_rank_that_holds_the_most) {
  const std::string text = render_rank_table(four_ranks(fresh_dir("imbalance")));
  EXPECT_THAT(text,
              HasSubstr("Imbalance\n"
                        "  peak reserved   largest 150.00 MiB (rank 2), smallest 100.00 MiB (rank 0): 50.0% more\n"
                        "  peak requested  largest 80.00 MiB (rank 0), smallest 80.00 MiB (rank 0): 0.0% more\n"
                        "  ! rank 2 holds 50.00 MiB more at peak than rank 0 (+50.0%), over the 5% a balanced "
                        "job stays within; the live bytes are balanced, so the difference is the allocator's "
                        "(cache, fragmentation)\n"))
      << text;
}

TEST(rank_table, ranks_within_five_percent_are_balanced_and_not_called_out) {
  const fs::path dir = fresh_dir("balanced");
  const std::vector<run_report> runs = load_all(
      {write_rank(dir, 0, 2, rank_stats(100 * MiB, 80 * MiB)), write_rank(dir, 1, 2, rank_stats(104 * MiB, 80 * MiB))});
  const std::string text = render_rank_table(runs);
  EXPECT_THAT(text, HasSubstr("  balanced: peak reserved within 5% across ranks\n"));
  EXPECT_THAT(text, Not(HasSubstr("  ! ")));
}

// Device used - reserved is not fragctl's; what was held outside when the
// allocator was built is "at start", the rest "since".
TEST(rank_table, the_device_memory_that_is_not_fragctls_is_split_at_the_allocators_start) {
  const std::string text = render_rank_table(four_ranks(fresh_dir("device")));
  EXPECT_THAT(text, HasSubstr("Device memory that is not fragctl's (when each report was written)\n"
                              "                     device used    of total     fragctl not fragctl's    at start"
                              "       since\n"
                              "  rank 0              690.00 MiB   80.00 GiB   90.00 MiB    600.00 MiB  500.00 MiB"
                              "  100.00 MiB\n"))
      << text;
  EXPECT_THAT(
      text,
      HasSubstr("  rank 2                1.02 GiB   80.00 GiB  140.00 MiB    900.00 MiB  500.00 MiB  400.00 MiB\n"));
  EXPECT_THAT(text, HasSubstr("needs NVML's per-process figures and NCCL's own"));
}

TEST(rank_table, reports_without_device_memory_say_it_was_not_recorded) {
  const fs::path dir = fresh_dir("no_device");
  allocator_stats a = rank_stats(100 * MiB, 80 * MiB);
  allocator_stats b = rank_stats(100 * MiB, 80 * MiB);
  a.device_memory = {};
  b.device_memory = {};
  const std::string text = render_rank_table(load_all({write_rank(dir, 0, 2, a), write_rank(dir, 1, 2, b)}));
  EXPECT_THAT(text, HasSubstr("\n  0     90.00 MiB     100.00 MiB"));
  EXPECT_THAT(text, HasSubstr("      -  0\n"));
  EXPECT_THAT(text, HasSubstr("  not recorded: these reports carry no device_memory"));
}

TEST(rank_table, json_has_a_row_per_rank_and_the_imbalance) {
  const nlohmann::json j = nlohmann::json::parse(render_rank_json(four_ranks(fresh_dir("json"))));
  ASSERT_EQ(j["ranks"].size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(j["ranks"][i]["rank"], i);
  EXPECT_EQ(j["ranks"][2]["reserved"]["peak"], 150 * MiB);
  EXPECT_EQ(j["ranks"][2]["cached"], 99 * MiB);
  EXPECT_EQ(j["ranks"][2]["device_memory"]["not_fragctl"], 900 * MiB);
  EXPECT_EQ(j["ranks"][2]["device_memory"]["not_fragctl_since_start"], 400 * MiB);
  EXPECT_EQ(j["ranks"][3]["oom_verdicts"]["fragmentation"], 1);
  EXPECT_EQ(j["ranks"][3]["oom_verdicts"]["capacity"], 1);
  EXPECT_EQ(j["ranks"][1]["local_rank"], 1);
  EXPECT_EQ(j["ranks"][0]["stats"]["reserved_bytes"]["peak"], 100 * MiB);
  EXPECT_EQ(j["imbalance"]["peak_reserved"]["max_rank"], 2);
  EXPECT_EQ(j["imbalance"]["peak_reserved"]["min_rank"], 0);
  EXPECT_DOUBLE_EQ(j["imbalance"]["peak_reserved"]["excess"].get<double>(), 0.5);
  EXPECT_EQ(j["imbalance"]["over_threshold"], true);
}

// Regression (red team): a rank that reserved nothing gave "excess": 0.0
// beside over_threshold: true; there is no finite ratio, so it is null.
TEST(rank_table, json_excess_is_null_where_the_smallest_rank_reserved_nothing) {
  const fs::path dir = fresh_dir("json_zero");
  const nlohmann::json j = nlohmann::json::parse(render_rank_json(
      load_all({write_rank(dir, 0, 2, rank_stats(0, 0)), write_rank(dir, 1, 2, rank_stats(100 * MiB, 80 * MiB))})));
  EXPECT_TRUE(j["imbalance"]["peak_reserved"]["excess"].is_null()) << j["imbalance"].dump();
  EXPECT_EQ(j["imbalance"]["over_threshold"], true);
}

TEST(rank_table, html_draws_a_pair_of_bars_per_rank_and_names_the_largest) {
  const std::string html = render_html(four_ranks(fresh_dir("html")));
  EXPECT_THAT(html, HasSubstr("<section id=\"ranks\"><h2>Ranks side by side</h2>"));
  EXPECT_THAT(html, HasSubstr("rank 2 holds 50.00 MiB more at peak than rank 0 (+50.0%)"));
  EXPECT_EQ(occurrences(html, "<title>peak reserved: "), 4u);
  EXPECT_EQ(occurrences(html, "<title>not fragctl&#39;s") + occurrences(html, "<title>not fragctl's"), 4u);
  EXPECT_THAT(html, Not(HasSubstr("<section id=\"comparison\">")));
}

// Not one job's ranks: the same rank twice (two runs of rank 0, the usual
// before/after comparison), different world sizes, or a report without a rank.
TEST(rank_table, reports_that_are_not_one_jobs_ranks_still_compare) {
  const fs::path a = fresh_dir("compare_a");
  const fs::path b = fresh_dir("compare_b");
  const std::vector<run_report> twice = load_all(
      {write_rank(a, 0, 2, rank_stats(100 * MiB, 80 * MiB)), write_rank(b, 0, 2, rank_stats(120 * MiB, 80 * MiB))});
  EXPECT_FALSE(runs_are_ranks(twice));
  const std::vector<run_report> worlds = load_all(
      {write_rank(a, 0, 2, rank_stats(100 * MiB, 80 * MiB)), write_rank(b, 1, 4, rank_stats(120 * MiB, 80 * MiB))});
  EXPECT_FALSE(runs_are_ranks(worlds));
  std::vector<run_report> unranked = load_all(
      {write_rank(a, 0, 2, rank_stats(100 * MiB, 80 * MiB)), write_rank(b, 1, 2, rank_stats(120 * MiB, 80 * MiB))});
  ASSERT_TRUE(runs_are_ranks(unranked));
  unranked[1].writer.rank.reset();
  EXPECT_FALSE(runs_are_ranks(unranked));
  EXPECT_FALSE(runs_are_ranks({unranked[0]}));
}

TEST(rank_table, a_rank_of_another_type_is_an_error_naming_the_field) {
  const fs::path dir = fresh_dir("bad_rank");
  std::ofstream(dir / "r.json") << R"({"schema_version": 1, "rank": "zero", "allocators": [)"
                                << to_json(rank_stats(100 * MiB, 80 * MiB)) << "]}";
  const auto loaded = load_run_reports((dir / "r.json").string());
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(std::string(loaded.status().message()),
              HasSubstr("r.json: field \"rank\": expected a non-negative integer or null"));
}

// A report's strings (host, launcher, file name) reach the terminal only
// printable and the page only escaped (issue 27's rule for every renderer).
TEST(rank_table, hostile_hosts_neither_move_the_terminal_nor_add_markup) {
  const fs::path dir = fresh_dir("hostile");
  std::vector<run_report> runs = load_all(
      {write_rank(dir, 0, 2, rank_stats(100 * MiB, 80 * MiB)), write_rank(dir, 1, 2, rank_stats(120 * MiB, 80 * MiB))});
  ASSERT_EQ(runs.size(), 2u);
  runs[0].writer.host = "\x1b[2J\x1b[31mnode\nfake line";
  runs[1].writer.host = "</td><script>alert(1)</script>";
  runs[1].writer.launcher =
      "\xe2\x80\xae"
      "evil";
  const std::string text = render_rank_table(runs);
  EXPECT_EQ(text.find('\x1b'), std::string::npos);
  EXPECT_EQ(text.find("\nfake line"), std::string::npos);
  EXPECT_EQ(text.find("\xe2\x80\xae"), std::string::npos);
  const std::string html = render_html(runs);
  EXPECT_EQ(occurrences(html, "<script"), 1u) << "only the page's own script";
  EXPECT_THAT(html, HasSubstr("&lt;/td&gt;&lt;script&gt;"));
  EXPECT_FALSE(nlohmann::json::parse(render_rank_json(runs), nullptr, false).is_discarded());
}

// --- The split of the device memory that is not fragctl's (issue 31) ---

// Four ranks whose not-fragctl memory is split: each has a 500 MiB context
// and 1 GiB of other processes' memory; rank 2's NCCL communicators took
// 1.5 GiB, the others' 256 MiB; rank 1 has a 64 MiB graph pool.
std::vector<run_report> four_split_ranks(const fs::path& dir) {
  std::vector<fs::path> paths;
  for (int rank : {3, 1, 2, 0}) {
    const std::size_t nccl = rank == 2 ? 1536 * MiB : 256 * MiB;
    const std::size_t pools = rank == 1 ? 64 * MiB : 0;
    const std::size_t outside = 500 * MiB + 1 * GiB + nccl + pools + 100 * MiB;
    allocator_stats s = rank_stats(100 * MiB, 80 * MiB, outside, 500 * MiB);
    device_memory_inputs in;
    in.total = s.device_memory.total;
    in.free = s.device_memory.free;
    in.reserved = s.reserved.current;
    in.process = {true, s.reserved.current + outside - 1 * GiB, 1 * GiB};
    in.context = 500 * MiB;
    in.nccl = nccl;
    in.graph_pools = pools;
    s.device_memory.split = split_device_memory(in);
    paths.push_back(write_rank(dir, rank, 4, s));
  }
  return load_all(paths);
}

TEST(rank_table, each_ranks_device_memory_is_split_and_the_imbalance_named) {
  const std::vector<run_report> runs = four_split_ranks(fresh_dir("split"));
  ASSERT_EQ(runs.size(), 4u);
  const std::string text = render_rank_table(runs);
  EXPECT_THAT(text, HasSubstr("Device memory that is not fragctl's, split (docs/reports.md)\n"
                              "                     not fragctl's         context            NCCL     graph pools"
                              "   other fragctl           other other processes\n"
                              "  rank 0                  1.84 GiB      500.00 MiB      256.00 MiB             0 B"
                              "             0 B      100.00 MiB        1.00 GiB\n"
                              "  rank 1                  1.90 GiB      500.00 MiB      256.00 MiB       64.00 MiB"
                              "             0 B      100.00 MiB        1.00 GiB\n"
                              "  rank 2                  3.09 GiB      500.00 MiB        1.50 GiB             0 B"
                              "             0 B      100.00 MiB        1.00 GiB\n"))
      << text;
  // The imbalance: largest minus smallest and which rank, for reserved
  // (above) and for the memory that is not fragctl's, with the part that
  // differs most.
  EXPECT_THAT(text, HasSubstr("  not fragctl's   largest 3.09 GiB (rank 2), smallest 1.84 GiB (rank 0): 1.25 GiB more "
                              "(+68.1%)\n"
                              "  ! rank 2 holds 1.25 GiB more device memory that is not fragctl's than rank 0; NCCL "
                              "differs most: 1.25 GiB more\n"))
      << text;
  EXPECT_THAT(text, HasSubstr("The split below tells them apart."));
  EXPECT_THAT(text, Not(HasSubstr("which these reports do not carry")));

  const nlohmann::json j = nlohmann::json::parse(render_rank_json(runs));
  EXPECT_EQ(j["ranks"][2]["device_memory"]["split"]["nccl"], 1536 * MiB);
  EXPECT_EQ(j["ranks"][1]["device_memory"]["split"]["graph_pools"], 64 * MiB);
  EXPECT_EQ(j["ranks"][0]["device_memory"]["split"]["other_processes"], 1 * GiB);
  EXPECT_EQ(j["imbalance"]["not_fragctl"]["max_rank"], 2);
  EXPECT_EQ(j["imbalance"]["not_fragctl"]["min_rank"], 0);
  EXPECT_EQ(j["imbalance"]["not_fragctl"]["difference"], 1280 * MiB);
  EXPECT_EQ(j["imbalance"]["not_fragctl"]["differs_most"], "NCCL");
  EXPECT_EQ(j["imbalance"]["not_fragctl"]["over_threshold"], true);

  const std::string html = render_html(runs);
  EXPECT_THAT(html, HasSubstr("<h3>Device memory that is not fragctl's, split</h3>"));
  EXPECT_THAT(html, HasSubstr("rank 2 holds 1.25 GiB more device memory that is not fragctl's than rank 0; NCCL "
                              "differs most: 1.25 GiB more</p>"));
  EXPECT_THAT(html, HasSubstr("<tr><td>rank 2</td><td>3.09 GiB</td><td>500.00 MiB</td><td>1.50 GiB</td><td>0 B</td>"
                              "<td>0 B</td><td>100.00 MiB</td><td>1.00 GiB</td></tr>"));
}

// A report without per-process figures: other processes read "-" (they are
// part of other), and a rank written before the split reads "not recorded".
TEST(rank_table, a_split_without_nvml_or_from_an_older_report_says_so) {
  const fs::path dir = fresh_dir("split_partial");
  allocator_stats a = rank_stats(100 * MiB, 80 * MiB, 600 * MiB, 500 * MiB);
  device_memory_inputs in;
  in.total = a.device_memory.total;
  in.free = a.device_memory.free;
  in.reserved = a.reserved.current;
  in.context = 500 * MiB;
  a.device_memory.split = split_device_memory(in);
  const allocator_stats b = rank_stats(100 * MiB, 80 * MiB, 600 * MiB, 500 * MiB);
  const std::string text = render_rank_table(load_all({write_rank(dir, 0, 2, a), write_rank(dir, 1, 2, b)}));
  EXPECT_THAT(text, HasSubstr("  rank 0                600.00 MiB      500.00 MiB             0 B             0 B"
                              "             0 B      100.00 MiB               -\n"
                              "  rank 1             not recorded\n"))
      << text;
}

// --- End to end: four processes of a "torchrun job", then `fragctl report` ---

class rank_table_command : public fragctl::testing::fragctl_command_test {};

// Each rank is a separately started process given one FRAGCTL_REPORT with
// {rank}, as torchrun starts them; rank 2 uses 8 MiB small segments, the
// others 2 MiB, for the same live bytes: rank 2 reserves four times as much.
TEST_F(rank_table_command, four_processes_one_report_each_and_one_table) {
  const fs::path dir = fresh_dir("processes");
  { std::ofstream(dir / "go").put('\n'); }  // the worker waits for it
  for (int rank = 0; rank < 4; ++rank) {
    const std::string command = fmt::format(
        "env -u OMPI_COMM_WORLD_RANK -u SLURM_PROCID RANK={} LOCAL_RANK={} WORLD_SIZE=4 FRAGCTL_BACKEND=sim "
        "FRAGCTL_POLICY=caching FRAGCTL_CONF=small_segment:{} FRAGCTL_REPORT='{}/run.{{rank}}.json' '{}' '{}' 8 1",
        rank, rank, rank == 2 ? "8MiB" : "2MiB", dir.string(), FRAGCTL_LIFECYCLE_WORKER, dir.string());
    ASSERT_EQ(run_command(command).status, 0) << command;
  }
  for (int rank = 0; rank < 4; ++rank)
    ASSERT_TRUE(fs::exists(dir / fmt::format("run.{}.json", rank))) << "no report of rank " << rank;

  const run_result text = run_fragctl(fmt::format("report '{}'/run.*.json", dir.string()));
  ASSERT_EQ(text.status, 0) << text.out;
  EXPECT_THAT(text.out, HasSubstr("fragctl report: 4 ranks side by side (torchrun, world size 4, 1 host)\n"));
  // A row per rank, each with its reserved bytes now and at peak: 8 MiB on rank 2, 2 MiB elsewhere.
  for (int rank = 0; rank < 4; ++rank) {
    const char* reserved = rank == 2 ? "8.00 MiB" : "2.00 MiB";
    EXPECT_THAT(text.out, ContainsRegex(fmt::format("\n  {} +{} +{}  ", rank, reserved, reserved)));
  }
  EXPECT_EQ(occurrences(text.out, "/run."), 4u) << "one line naming each rank's file";
  EXPECT_THAT(text.out,
              HasSubstr("  peak reserved   largest 8.00 MiB (rank 2), smallest 2.00 MiB (rank 0): 300.0% more\n"));
  EXPECT_THAT(text.out, HasSubstr("  ! rank 2 holds 6.00 MiB more at peak than rank 0 (+300.0%)"));
  EXPECT_THAT(text.out, Not(HasSubstr("comparison")));

  const run_result json = run_fragctl(fmt::format("report --json '{}'/run.*.json", dir.string()));
  ASSERT_EQ(json.status, 0) << json.out;
  const nlohmann::json j = nlohmann::json::parse(json.out);
  ASSERT_EQ(j["ranks"].size(), 4u);
  EXPECT_EQ(j["imbalance"]["peak_reserved"]["max_rank"], 2);
  EXPECT_EQ(j["ranks"][3]["device_memory"]["not_fragctl"], 0) << "on sim the device holds only fragctl's bytes";
}

}  // namespace
}  // namespace fragctl
