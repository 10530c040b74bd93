// `fragctl config` and the Environment block of `fragctl --help` print the
// library's two tables (config_options(), environment_variables()) as they
// are: one row each, the same defaults.
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include "fmt/format.h"
#include "fragctl/config.hpp"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "support/test_support.hpp"

namespace fragctl {
namespace {

using fragctl::testing::fragctl_binary;
using fragctl::testing::run_fragctl;
using fragctl::testing::run_result;
using ::testing::HasSubstr;

class FragctlConfig : public fragctl::testing::fragctl_command_test {};

TEST_F(FragctlConfig, JsonHasEveryOptionAndVariableWithItsDefault) {
  const run_result r = run_fragctl("config --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["options"].size(), config_options().size());
  for (std::size_t i = 0; i < config_options().size(); ++i) {
    EXPECT_EQ(j["options"][i]["key"], config_options()[i].key);
    EXPECT_EQ(j["options"][i]["default"], config_options()[i].default_value);
  }
  ASSERT_EQ(j["environment"].size(), environment_variables().size());
  for (std::size_t i = 0; i < environment_variables().size(); ++i) {
    EXPECT_EQ(j["environment"][i]["name"], environment_variables()[i].name);
    EXPECT_EQ(j["environment"][i]["default"], environment_variables()[i].default_value);
  }
}

TEST_F(FragctlConfig, TextShowsReleaseDelaysUnit) {
  const run_result r = run_fragctl("config");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("release_delay_calls"));
  EXPECT_THAT(r.out, HasSubstr("a count, not a time"));
  EXPECT_THAT(r.out, HasSubstr("16MiB"));
}

TEST_F(FragctlConfig, CurrentShowsWhatTheEnvironmentGives) {
  ::setenv("FRAGCTL_CONF", "map_chunk:64MiB,release_delay_calls:7", 1);
  const run_result r = run_fragctl("config --current --json");
  ::setenv("FRAGCTL_CONF", "map_chunk:lots", 1);
  const run_result bad = run_fragctl("config --current", "2>&1");
  ::unsetenv("FRAGCTL_CONF");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  std::map<std::string, std::string> values;
  for (const auto& o : j["options"]) values[o["key"].get<std::string>()] = o["value"].get<std::string>();
  EXPECT_EQ(values["map_chunk"], "64MiB");
  EXPECT_EQ(values["release_delay"], "7");
  EXPECT_EQ(bad.status, 1);
  EXPECT_THAT(bad.out, HasSubstr("FRAGCTL_CONF: bad value \"lots\" for map_chunk"));
}

TEST_F(FragctlConfig, CurrentRefusesAMisspeltPolicyAndNamesTheEffectiveOne) {
  ::setenv("FRAGCTL_BACKEND", "sim", 1);
  ::setenv("FRAGCTL_POLICY", "arean", 1);
  const run_result bad = run_fragctl("config --current", "2>&1");
  ::setenv("FRAGCTL_POLICY", "buckets:caching", 1);
  const run_result named = run_fragctl("config --current --json");
  ::unsetenv("FRAGCTL_POLICY");
  const run_result defaulted = run_fragctl("config --current");
  ::unsetenv("FRAGCTL_BACKEND");
  EXPECT_EQ(bad.status, 1) << bad.out;
  EXPECT_THAT(bad.out, HasSubstr("FRAGCTL_POLICY"));
  EXPECT_THAT(bad.out, HasSubstr("arean"));
  ASSERT_EQ(named.status, 0) << named.out;
  const auto j = nlohmann::json::parse(named.out);
  EXPECT_EQ(j["effective"]["policy"], "buckets:caching");
  EXPECT_EQ(j["effective"]["backend"], "sim");
  ASSERT_EQ(defaulted.status, 0) << defaulted.out;
  EXPECT_THAT(defaulted.out, HasSubstr("gets: policy arena (the backend's default) on the sim backend"));
}

TEST_F(FragctlConfig, MainHelpListsEveryEnvironmentVariable) {
  const run_result r = run_fragctl("--help");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("config"));
  const std::string environment = r.out.substr(r.out.find("\nEnvironment"));
  for (const environment_variable& v : environment_variables())
    EXPECT_THAT(environment, HasSubstr(fmt::format("  {} ", v.name))) << v.name;
}

}  // namespace
}  // namespace fragctl
