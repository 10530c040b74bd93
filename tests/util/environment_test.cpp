// The environment table: every variable the code reads is a row, each
// default shown is the default config's, and config_from_environment,
// the misspelling warning and the zero3 NCCL loader read through it.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "fmt/format.h"
#include "fragctl/config.hpp"
#include "fragctl/error.hpp"
#include "fragctl/zero3/communicator.hpp"
#include "gtest/gtest.h"
#include "support/log_capture.hpp"

namespace fragctl {
namespace {

namespace fs = std::filesystem;

bool is_row(std::string_view name) {
  for (const environment_variable& v : environment_variables())
    if (v.name == name) return true;
  return false;
}

// The repository root: two levels above FRAGCTL_TEST_DATA (<repo>/tests/data).
fs::path source_root() {
  const char* data = std::getenv("FRAGCTL_TEST_DATA");
  if (data == nullptr) {
    ADD_FAILURE() << "FRAGCTL_TEST_DATA is not set (run through ctest)";
    return {};
  }
  return fs::path(data) / ".." / "..";
}

struct source_file {
  std::string path;  ///< relative to the root
  std::string text;
};

// The library's, the CLI's and the Python package's sources (not tests).
std::vector<source_file> sources() {
  const fs::path root = source_root();
  std::vector<source_file> out;
  for (const char* dir : {"src", "allocator_policies", "include", "tools/fragctl", "python/fragctl"}) {
    for (const auto& entry : fs::recursive_directory_iterator(root / dir)) {
      const std::string ext = entry.path().extension().string();
      if (!entry.is_regular_file() || (ext != ".cpp" && ext != ".hpp" && ext != ".h" && ext != ".py")) continue;
      std::ifstream in(entry.path());
      std::stringstream s;
      s << in.rdbuf();
      out.push_back({fs::relative(entry.path(), root).generic_string(), s.str()});
    }
  }
  return out;
}

TEST(environment, every_variable_the_code_reads_is_a_row) {
  const std::vector<source_file> files = sources();
  ASSERT_GT(files.size(), 50u) << "sources not found under " << source_root();
  const std::regex getenv_call(R"(getenv\s*\(([^)]*)\))");
  const std::regex asked(R"(environment_value\(\s*"([A-Za-z0-9_]+)\")");
  // os.environ.get("X"), os.environ["X"], ..., and "X" in os.environ.
  const std::regex python_read(R"#(os\.environ(?:\.get\(|\[|\.setdefault\(|\.pop\()\s*"([A-Z0-9_]+)")#"
                               R"#(|"([A-Z0-9_]+)"\s+(?:not\s+)?in\s+os\.environ)#");
  std::set<std::string> read;
  for (const source_file& f : files) {
    for (auto m = std::sregex_iterator(f.text.begin(), f.text.end(), getenv_call); m != std::sregex_iterator(); ++m) {
      // The one getenv (environment_value), and the NCCL communicator's
      // rendezvous variable whose name is an option (its default is checked below).
      const bool allowed =
          f.path == "src/util/environment.cpp" || (f.path == "src/zero3/collectives/nccl_rendezvous.cpp" &&
                                                   (*m)[1].str().find("unique_id_env") != std::string::npos);
      EXPECT_TRUE(allowed) << f.path << " calls " << m->str() << ": read it with environment_value and add a row";
    }
    for (auto m = std::sregex_iterator(f.text.begin(), f.text.end(), asked); m != std::sregex_iterator(); ++m)
      read.insert((*m)[1].str());
    if (f.path.ends_with(".py")) {
      for (auto m = std::sregex_iterator(f.text.begin(), f.text.end(), python_read); m != std::sregex_iterator(); ++m) {
        const std::string name = (*m)[1].matched ? (*m)[1].str() : (*m)[2].str();
        if (name.starts_with("FRAGCTL_")) read.insert(name);
      }
    }
  }
  read.insert(zero3::nccl_options{}.unique_id_env);
  // Positive control: the scan sees the readers outside config_from_environment.
  for (const char* name : {"FRAGCTL_LOG_LEVEL", "FRAGCTL_NCCL_LIBRARY", "FRAGCTL_LIBRARY", "FRAGCTL_TORCH_ROUTE"})
    EXPECT_TRUE(read.contains(name)) << name << " was not found read in the sources";
  for (const std::string& name : read) EXPECT_TRUE(is_row(name)) << name << " is read but is not a row";
}

TEST(environment, rows_are_documented_and_unique) {
  std::set<std::string_view> names;
  for (const environment_variable& v : environment_variables()) {
    EXPECT_TRUE(names.insert(v.name).second) << v.name << " twice";
    EXPECT_FALSE(v.value.empty()) << v.name;
    EXPECT_FALSE(v.help.empty()) << v.name;
    EXPECT_FALSE(v.read_by.empty()) << v.name;
  }
}

TEST(environment, asking_for_a_name_that_is_not_a_row_throws) {
  EXPECT_THROW((void)environment_value("FRAGCTL_NO_SUCH_VARIABLE"), invalid_argument);
  ::setenv("FRAGCTL_NCCL_LIBRARY", "/opt/libnccl.so.2", 1);
  EXPECT_EQ(environment_value("FRAGCTL_NCCL_LIBRARY"), std::optional<std::string_view>("/opt/libnccl.so.2"));
  ::unsetenv("FRAGCTL_NCCL_LIBRARY");
  EXPECT_EQ(environment_value("FRAGCTL_NCCL_LIBRARY"), std::nullopt);
}

TEST(environment, a_changed_default_shows_in_the_table) {
  config c;
  c.map_chunk = 64 * MiB;
  c.max_split_size = 3 * GiB;
  c.report_interval_ms = 15000;
  EXPECT_EQ(option_value(c, "map_chunk"), "64MiB");
  EXPECT_EQ(option_value(c, "max_split_size"), "3GiB");
  EXPECT_EQ(option_value(c, "report_interval"), "15s");
  EXPECT_EQ(option_value(config{}, "max_split_size"), "unlimited");
  EXPECT_THROW((void)option_value(c, "no_such_key"), invalid_argument);
}

TEST(environment, the_log_level_shows_its_default_though_a_config_leaves_it_unset) {
  // config::log_level is empty unless FRAGCTL_LOG_LEVEL set it (an empty
  // one leaves the process's level alone); the table, `fragctl config` and
  // --help still show the level the logger starts at.
  EXPECT_TRUE(config{}.log_level.empty());
  bool seen = false;
  for (const environment_variable& v : environment_variables()) {
    if (v.name != "FRAGCTL_LOG_LEVEL") continue;
    seen = true;
    EXPECT_EQ(v.default_value, default_log_level);
    EXPECT_EQ(v.default_value, "warn");
  }
  EXPECT_TRUE(seen);
}

TEST(environment, format_size_is_exact_and_short) {
  EXPECT_EQ(format_size(0), "0");
  EXPECT_EQ(format_size(512), "512");
  EXPECT_EQ(format_size(80 * GiB), "80GiB");
  EXPECT_EQ(format_size(100'000'000), "100MB");
  EXPECT_EQ(format_size(2'000'000'000), "2GB");
  EXPECT_EQ(format_size(3 * MiB + 1), "3145729");
  for (const std::size_t bytes : {std::size_t{1}, 4096 * std::size_t{1000}, 3 * GiB / 2, std::size_t{1} << 62})
    EXPECT_EQ(parse_size(format_size(bytes)).value(), bytes) << format_size(bytes);
}

// release_delay counts allocator calls; release_delay_calls is the same
// option under a name that says so, and the old key keeps working.
TEST(environment, release_delay_and_its_alias_set_the_same_count) {
  auto old_key = parse_config("release_delay:5");
  auto alias = parse_config("release_delay_calls:7");
  ASSERT_TRUE(old_key.ok()) << old_key.status();
  ASSERT_TRUE(alias.ok()) << alias.status();
  EXPECT_EQ(old_key->release_delay, 5u);
  EXPECT_EQ(alias->release_delay, 7u);
  EXPECT_EQ(option_value(*alias, "release_delay"), "7");
  EXPECT_FALSE(parse_config("release_delay:10ms").ok());
  for (const option_info& o : config_options()) {
    if (o.key.starts_with("release_delay")) {
      EXPECT_NE(o.help.find("calls"), std::string_view::npos) << o.key;
    }
  }
}

TEST(environment, variables_that_set_an_option_override_it) {
  ::setenv("FRAGCTL_CONF", "report_interval:5s,prometheus:/tmp/conf.prom", 1);
  ::setenv("FRAGCTL_REPORT_INTERVAL", "250ms", 1);
  ::setenv("FRAGCTL_PROMETHEUS", "/tmp/a,b.prom", 1);  // a whole value: commas are not separators here
  auto c = config_from_environment();
  ::setenv("FRAGCTL_REPORT_INTERVAL", "soon", 1);
  auto bad = config_from_environment();
  for (const char* name : {"FRAGCTL_CONF", "FRAGCTL_REPORT_INTERVAL", "FRAGCTL_PROMETHEUS"}) ::unsetenv(name);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->report_interval_ms, 250u);
  EXPECT_EQ(c->prometheus_path, "/tmp/a,b.prom");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(std::string(bad.status().message()).starts_with("FRAGCTL_REPORT_INTERVAL: ")) << bad.status();
}

TEST(environment, the_misspelling_warning_knows_every_row) {
  ::setenv("FRAGCTL_NCCL_LIBRAY", "/opt/libnccl.so.2", 1);
  ::setenv("FRAGCTL_NCCL_LIBRARY", "/opt/libnccl.so.2", 1);  // a row: no warning of its own
  const testing::log_capture log;
  const auto c = config_from_environment();
  ::unsetenv("FRAGCTL_NCCL_LIBRAY");
  ::unsetenv("FRAGCTL_NCCL_LIBRARY");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NE(log.text().find("FRAGCTL_NCCL_LIBRAY is not a fragctl variable and is ignored; did you mean "
                            "FRAGCTL_NCCL_LIBRARY?"),
            std::string::npos)
      << log.text();
  EXPECT_EQ(log.text().find("FRAGCTL_NCCL_LIBRARY is not"), std::string::npos) << log.text();
}

}  // namespace
}  // namespace fragctl
