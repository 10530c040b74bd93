// Hung collectives in `fragctl report` (issue 31; docs/reports.md, "Hangs"):
// a report document's "hangs" are read, shown in the summary, the HTML page
// (escaped like every string of a report), under the rank table and in its
// JSON; a document without them renders as before.
#include <string>
#include <vector>

#include "fragctl/run_report.hpp"
#include "fragctl/stats.hpp"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace fragctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A report document of rank `rank` of 2 whose process recorded `hangs`.
std::string document(int rank, const nlohmann::json& hangs) {
  allocator_stats s;
  s.allocator = "caching";
  s.backend = "sim";
  nlohmann::json doc = {{"schema_version", 1},
                        {"reason", "hang"},
                        {"rank", rank},
                        {"local_rank", rank},
                        {"world_size", 2},
                        {"launcher", "torchrun"},
                        {"allocators", nlohmann::json::array({nlohmann::json::parse(to_json(s))})}};
  if (!hangs.is_null()) doc["hangs"] = hangs;
  return doc.dump();
}

nlohmann::json rank0_hang() {
  return nlohmann::json::array({{{"rank", 0},
                                 {"communicator", "nccl"},
                                 {"collective", "all_gather"},
                                 {"sequence", 41},
                                 {"block", "block 3 '<script>alert(1)</script>'"},
                                 {"modules", {"model.layers.2"}},
                                 {"bytes", 4096},
                                 {"deadline_s", 16.0},
                                 {"group_timeout_s", 20.0},
                                 {"elapsed_s", 16.2},
                                 {"timed_out", true},
                                 {"missing", {1}},
                                 {"peers",
                                  {"rank 1 has not entered all_gather #41 of block 3; it completed #40 at 12.3 s "
                                   "and has been silent 20.1 s\x1b[2J"}},
                                 {"message", "zero3 rank 0: ..."}}});
}

std::vector<run_report> load(const std::string& json, const std::string& source) {
  auto runs = run_reports_from_json(json, source);
  EXPECT_TRUE(runs.ok()) << runs.status();
  return runs.ok() ? *runs : std::vector<run_report>{};
}

TEST(hang_report, the_summary_and_the_page_show_the_hang_and_where_the_others_were) {
  const std::vector<run_report> runs = load(document(0, rank0_hang()), "run.0.json");
  ASSERT_EQ(runs.size(), 1U);
  ASSERT_EQ(runs[0].hangs.size(), 1U);
  const hang_note& h = runs[0].hangs[0];
  EXPECT_EQ(h.missing, std::vector<std::int64_t>{1});
  EXPECT_EQ(h.group_timeout_s, 20.0);
  const std::string text = render_text(runs[0]);
  EXPECT_THAT(text, HasSubstr("Hangs: 1"));
  EXPECT_THAT(text, HasSubstr("rank 0: all_gather #41 of block 3 '<script>alert(1)</script>' (nccl) passed fragctl's "
                              "deadline of 16 s after 16.2 s; rank 1 had not entered it"));
  EXPECT_THAT(text, HasSubstr("    rank 1 has not entered all_gather #41"));
  EXPECT_THAT(text, HasSubstr("modules: model.layers.2; 4.00 KiB gathered"));
  EXPECT_THAT(text, HasSubstr("fragctl's deadline 16 s, the process group's timeout 20 s"));
  EXPECT_THAT(text, Not(HasSubstr("\x1b")));  // printable only
  const std::string page = render_html(runs);
  EXPECT_THAT(page, HasSubstr("<h3>Hangs (1)</h3>"));
  EXPECT_THAT(page, HasSubstr("&lt;script&gt;alert(1)&lt;/script&gt;"));
  EXPECT_THAT(page, Not(HasSubstr("<script>alert(1)")));
}

TEST(hang_report, the_rank_table_has_a_line_per_rank_that_waited) {
  std::vector<run_report> runs = load(document(0, rank0_hang()), "run.0.json");
  for (run_report& r : load(document(1, nullptr), "run.1.json")) runs.push_back(std::move(r));
  ASSERT_TRUE(runs_are_ranks(runs));
  const std::string table = render_rank_table(runs);
  EXPECT_THAT(table, HasSubstr("\nHangs (collectives that passed their deadline or failed"));
  EXPECT_THAT(table, HasSubstr("  rank 0: all_gather #41 of block 3"));
  EXPECT_THAT(table, Not(HasSubstr("  rank 1: all_gather")));
  const nlohmann::json j = nlohmann::json::parse(render_rank_json(runs));
  EXPECT_EQ(j["ranks"][0]["hangs"][0]["missing"], nlohmann::json::array({1}));
  EXPECT_TRUE(j["ranks"][1]["hangs"].empty());
  // The control: without hangs, no section and no line.
  std::vector<run_report> quiet = load(document(0, nullptr), "run.0.json");
  EXPECT_THAT(render_text(quiet[0]), Not(HasSubstr("Hangs")));
  for (run_report& r : load(document(1, nullptr), "run.1.json")) quiet.push_back(std::move(r));
  EXPECT_THAT(render_rank_table(quiet), Not(HasSubstr("Hangs")));
}

TEST(hang_report, hangs_that_are_not_a_list_of_records_are_an_error_naming_them) {
  EXPECT_FALSE(run_reports_from_json(document(0, "nothing"), "bad.json").ok());
  const auto wrong = run_reports_from_json(document(0, nlohmann::json::array({1})), "bad.json");
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(std::string(wrong.status().message()), HasSubstr("bad.json: hangs[0] is not an object"));
}

}  // namespace
}  // namespace fragctl
