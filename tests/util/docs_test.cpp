// The documentation stays in step with the code: every FRAGCTL_CONF option
// and every environment variable has its row in docs/configuration.md, and
// every statistics key and metric is named in docs/statistics.md.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fmt/format.h"
#include "fragctl/config.hpp"
#include "fragctl/stats.hpp"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "util/strings.hpp"

namespace fragctl {
namespace {

// docs/ is two levels above FRAGCTL_TEST_DATA (<repo>/tests/data).
std::string read_doc(std::string_view name) {
  const char* data = std::getenv("FRAGCTL_TEST_DATA");
  if (data == nullptr) {
    ADD_FAILURE() << "FRAGCTL_TEST_DATA is not set (run through ctest)";
    return {};
  }
  const std::string path = fmt::format("{}/../../docs/{}", data, name);
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The table row of `key` (the line starting "| `key` |"), with Markdown's
// escaped pipes ("\|") read as plain ones.
std::string row_of(const std::string& doc, std::string_view key) {
  const std::string start = fmt::format("| `{}` |", key);
  for (const std::string_view line : util::split(doc, '\n')) {
    if (!line.starts_with(start)) continue;
    std::string row(line);
    for (std::size_t at = row.find("\\|"); at != std::string::npos; at = row.find("\\|", at)) row.erase(at, 1);
    return row;
  }
  return {};
}

TEST(docs, configuration_has_a_row_per_option_with_type_and_default) {
  const std::string doc = read_doc("configuration.md");
  ASSERT_FALSE(doc.empty());
  for (const option_info& o : config_options()) {
    const std::string row = row_of(doc, o.key);
    ASSERT_FALSE(row.empty()) << "docs/configuration.md has no row \"| `" << o.key << "` |\"";
    EXPECT_NE(row.find(o.type), std::string::npos) << o.key << ": type " << o.type << " missing in: " << row;
    if (!o.default_value.empty()) {
      EXPECT_NE(row.find(o.default_value), std::string::npos)
          << o.key << ": default " << o.default_value << " missing in: " << row;
    }
  }
}

TEST(docs, configuration_has_a_row_per_environment_variable_with_its_default) {
  const std::string doc = read_doc("configuration.md");
  ASSERT_FALSE(doc.empty());
  for (const environment_variable& v : environment_variables()) {
    const std::string row = row_of(doc, v.name);
    ASSERT_FALSE(row.empty()) << "docs/configuration.md has no row \"| `" << v.name << "` |\"";
    if (!v.default_value.empty()) {
      EXPECT_NE(row.find(fmt::format("`{}`", v.default_value)), std::string::npos)
          << v.name << ": default " << v.default_value << " missing in: " << row;
    }
  }
}

void collect_keys(const nlohmann::json& j, std::vector<std::string>& keys) {
  if (!j.is_object()) return;
  for (const auto& [key, value] : j.items()) {
    keys.push_back(key);
    collect_keys(value, keys);
  }
}

TEST(docs, statistics_names_every_json_key_and_metric) {
  const std::string doc = read_doc("statistics.md");
  ASSERT_FALSE(doc.empty());
  // With the objects present only once they have something to say (the
  // plan's, a pause's), so that their keys and metrics are checked too.
  allocator_stats s;
  s.pool.plan.steps_detected = 1;
  s.pool.pause_detached_exports = 1;
  std::vector<std::string> keys;
  collect_keys(nlohmann::json::parse(to_json(s)), keys);
  ASSERT_NE(std::find(keys.begin(), keys.end(), "starts_refused_memory"), keys.end()) << "control: the plan's keys";
  for (const std::string& key : keys) {
    EXPECT_NE(doc.find(fmt::format("`{}`", key)), std::string::npos) << "JSON key " << key;
  }
  const std::string text = to_prometheus(s);
  ASSERT_NE(text.find("fragctl_pause_detached_exports_total"), std::string::npos) << "control: a pause's metrics";
  for (const std::string_view line : util::split(text, '\n')) {
    if (!line.starts_with("# TYPE ")) continue;
    const std::string_view rest = line.substr(7);
    const std::string metric(rest.substr(0, rest.find(' ')));
    EXPECT_NE(doc.find(fmt::format("`{}`", metric)), std::string::npos) << "metric " << metric;
  }
}

}  // namespace
}  // namespace fragctl
