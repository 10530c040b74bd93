// tools/grafana/fragctl.json, the dashboard docs/statistics.md ships: every
// metric its queries name is one to_prometheus writes, and it shows what the
// dashboard promises (reserved vs requested, fragmentation, OOMs, calls),
// per device.
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "fragctl/stats.hpp"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "support/test_support.hpp"
#include "util/strings.hpp"

namespace fragctl {
namespace {

void collect_queries(const nlohmann::json& j, std::vector<std::string>& out) {
  if (j.is_object()) {
    for (const auto& [key, value] : j.items()) {
      if ((key == "expr" || key == "query") && value.is_string()) out.push_back(value.get<std::string>());
      collect_queries(value, out);
    }
  } else if (j.is_array()) {
    for (const auto& v : j) collect_queries(v, out);
  }
}

// The metric names (sample names) of to_prometheus's output.
std::set<std::string> exported_metrics() {
  allocator_stats s;
  s.size_histogram[3] = 1;
  std::set<std::string> names;
  const std::string text = to_prometheus(s);  // split returns views into it: it must outlive the loop
  for (const std::string_view line : util::split(text, '\n')) {
    if (line.empty() || line.starts_with("#")) continue;
    names.emplace(line.substr(0, line.find('{')));
  }
  return names;
}

TEST(grafana_dashboard, queries_name_only_exported_metrics) {
  const std::string text = testing::read_file(testing::test_data("../../tools/grafana/fragctl.json"));
  ASSERT_FALSE(text.empty()) << "tools/grafana/fragctl.json not found";
  std::vector<std::string> queries;
  collect_queries(nlohmann::json::parse(text), queries);
  ASSERT_GE(queries.size(), 8u);

  const std::set<std::string> exported = exported_metrics();
  ASSERT_TRUE(exported.count("fragctl_request_size_bytes_bucket")) << "histogram series missing";
  std::set<std::string> used;
  const std::regex metric(R"(fragctl_[a-z0-9_]+)");
  for (const std::string& q : queries) {
    for (auto it = std::sregex_iterator(q.begin(), q.end(), metric); it != std::sregex_iterator(); ++it) {
      EXPECT_TRUE(exported.count(it->str())) << it->str() << " in \"" << q << "\" is not a metric fragctl writes";
      used.insert(it->str());
    }
  }
  for (const char* shown : {"fragctl_reserved_bytes", "fragctl_requested_bytes", "fragctl_fragmentation_ratio",
                            "fragctl_reserved_over_requested_ratio", "fragctl_ooms_total",
                            "fragctl_allocations_total", "fragctl_backend_calls_total",
                            "fragctl_request_size_bytes_bucket"}) {
    EXPECT_TRUE(used.count(shown)) << "the dashboard does not show " << shown;
  }
}

TEST(grafana_dashboard, every_panel_query_selects_the_device) {
  const nlohmann::json dash =
      nlohmann::json::parse(testing::read_file(testing::test_data("../../tools/grafana/fragctl.json")));
  ASSERT_TRUE(dash.contains("panels"));
  for (const auto& panel : dash["panels"]) {
    for (const auto& target : panel["targets"]) {
      EXPECT_NE(target["expr"].get<std::string>().find("device=~\"$device\""), std::string::npos)
          << panel["title"] << ": " << target["expr"];
    }
  }
}

}  // namespace
}  // namespace fragctl
