// FRAGCTL_CONF parsing, sizes, errors, and the environment variables.
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "fmt/format.h"
#include "fragctl/config.hpp"
#include "gtest/gtest.h"

namespace fragctl {
namespace {

// Every field of config, for comparing two configurations in one assertion.
std::string describe(const config& c) {
  return fmt::format(
      "policy={} backend={} device={} sim_capacity={} sim_granularity={} sim_backed={} sim_vm={} "
      "small_size={} small_segment={} large_segment={} large_segment_limit={} segment_round={} "
      "max_split_size={} release_on_oom={} arena_size={} release_threshold={} release_delay={} map_chunk={} "
      "wait_before_growing={} step_plan={} lifetime_placement={} fallback_size={} buckets_limit={} slab_size={} slab_reserve={} warmup_bytes={} "
      "warmup_profile={} warmup_on_exhausted={} limit={} thread_safe={} report={} prometheus={} report_interval={} "
      "report_map={} trace={} log_level={}",
      c.policy, static_cast<int>(c.backend), c.device, c.sim_capacity, c.sim_granularity, c.sim_backed,
      c.sim_virtual_memory, c.small_size, c.small_segment, c.large_segment, c.large_segment_limit, c.segment_round,
      c.max_split_size, c.release_on_oom, c.arena_size, c.release_threshold, c.release_delay, c.map_chunk,
      c.wait_before_growing, c.step_plan, c.lifetime_placement, c.fallback_size, c.buckets_limit, c.slab_size, c.slab_reserve, c.warmup_bytes,
      c.warmup_profile, static_cast<int>(c.warmup_on_exhausted), c.limit, c.thread_safe, c.report_path,
      c.prometheus_path, c.report_interval_ms, c.report_map, c.trace_path, c.log_level);
}

// The documented default of an option as a value: "0 (device total)" -> "0".
std::string_view default_token(std::string_view documented) {
  return documented.substr(0, documented.find(" ("));
}

config without_options_set(config c) {
  c.options_set.clear();
  return c;
}

// Table-driven: every default shown (docs, help) is formatted from the
// struct's initialiser; a literal written into a row that disagrees with it,
// or a formatter that loses the value, parses into a config unequal to the
// default one.
TEST(config, each_displayed_default_is_the_default_configs_value) {
  const config defaults;
  for (const option_info& o : config_options()) {
    const std::string conf = fmt::format("{}:{}", o.key, default_token(o.default_value));
    auto parsed = parse_config(conf);
    ASSERT_TRUE(parsed.ok()) << conf << ": " << parsed.status();
    EXPECT_TRUE(without_options_set(*parsed) == defaults)
        << o.key << ": shown default " << o.default_value << " gives " << describe(*parsed);
    EXPECT_EQ(default_token(o.default_value), option_value(defaults, o.key)) << o.key;
  }
}

TEST(config, every_option_is_documented) {
  for (const option_info& o : config_options()) {
    EXPECT_FALSE(o.key.empty());
    EXPECT_FALSE(o.type.empty()) << o.key;
    EXPECT_FALSE(o.help.empty()) << o.key;
  }
}

TEST(config, sizes_accept_units) {
  EXPECT_EQ(parse_size("512MiB").value(), 512 * MiB);
  EXPECT_EQ(parse_size("2GiB").value(), 2 * GiB);
  EXPECT_EQ(parse_size("1.5GiB").value(), 3 * GiB / 2);
  EXPECT_EQ(parse_size("4096").value(), 4096u);
  EXPECT_EQ(parse_size("2KB").value(), 2000u);
  EXPECT_EQ(parse_size("2k").value(), 2048u);
  EXPECT_EQ(parse_size(" 8 MiB ").value(), 8 * MiB);
  EXPECT_FALSE(parse_size("").ok());
  EXPECT_FALSE(parse_size("MiB").ok());
  EXPECT_FALSE(parse_size("12 parsecs").ok());
  EXPECT_FALSE(parse_size("-1").ok());
  EXPECT_FALSE(parse_size("99999999999TiB").ok());
}

TEST(config, parses_several_options_with_spaces) {
  auto c = parse_config(" small_size : 2MiB , limit:1GiB,thread_safe:off, warmup_on_exhausted:fail ");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->small_size, 2 * MiB);
  EXPECT_EQ(c->limit, GiB);
  EXPECT_FALSE(c->thread_safe);
  EXPECT_EQ(c->warmup_on_exhausted, warmup_exhausted::fail);
}

TEST(config, later_options_apply_on_top_of_the_base) {
  config base;
  base.limit = 7;
  base.policy = "caching";
  auto c = parse_config("slab_reserve:9", base);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->limit, 7u);
  EXPECT_EQ(c->policy, "caching");
  EXPECT_EQ(c->slab_reserve, 9u);
}

TEST(config, empty_and_whitespace_conf_change_nothing) {
  const std::string defaults = describe(config{});
  for (const char* conf : {"", "   ", ",", " , ,  ", "\t"}) {
    auto c = parse_config(conf);
    ASSERT_TRUE(c.ok()) << "\"" << conf << "\": " << c.status();
    EXPECT_EQ(describe(*c), defaults) << "\"" << conf << "\"";
  }
}

std::string error_of(std::string_view conf) {
  auto c = parse_config(conf);
  EXPECT_FALSE(c.ok()) << conf;
  return std::string(c.status().message());
}

TEST(config, bad_value_names_the_key_and_what_it_accepts) {
  std::string m = error_of("small_size:lots");
  EXPECT_NE(m.find("small_size"), std::string::npos) << m;
  EXPECT_NE(m.find("\"lots\""), std::string::npos) << m;
  EXPECT_NE(m.find("MiB"), std::string::npos) << m;

  m = error_of("release_on_oom:maybe");
  EXPECT_NE(m.find("release_on_oom"), std::string::npos) << m;
  EXPECT_NE(m.find("true/false"), std::string::npos) << m;

  m = error_of("warmup_on_exhausted:explode");
  EXPECT_NE(m.find("warmup_on_exhausted"), std::string::npos) << m;
  EXPECT_NE(m.find("grow or fail"), std::string::npos) << m;

  m = error_of("device:-1");
  EXPECT_NE(m.find("device"), std::string::npos) << m;

  m = error_of("sim_granularity:3000");
  EXPECT_NE(m.find("power of two"), std::string::npos) << m;

  m = error_of("limit");
  EXPECT_NE(m.find("key:value"), std::string::npos) << m;
}

TEST(config, unknown_key_lists_the_known_keys) {
  const std::string m = error_of("small_sizes:1MiB");
  EXPECT_NE(m.find("unknown key \"small_sizes\""), std::string::npos) << m;
  for (const option_info& o : config_options()) EXPECT_NE(m.find(o.key), std::string::npos) << o.key;
}

TEST(config, backend_kinds) {
  EXPECT_EQ(parse_backend_kind("cuda").value(), backend_kind::cuda);
  EXPECT_EQ(parse_backend_kind("HIP").value(), backend_kind::hip);
  EXPECT_EQ(parse_backend_kind("sim").value(), backend_kind::sim);
  EXPECT_EQ(parse_backend_kind("auto").value(), backend_kind::automatic);
  EXPECT_EQ(parse_backend_kind("").value(), backend_kind::automatic);
  EXPECT_FALSE(parse_backend_kind("opencl").ok());
}

// Sets environment variables for one test and restores them after.
class environment {
 public:
  environment() {
    for (const char* name : names) {
      const char* v = std::getenv(name);
      saved_.push_back(v == nullptr ? std::nullopt : std::optional<std::string>(v));
      ::unsetenv(name);
    }
  }
  ~environment() {
    for (std::size_t i = 0; i < std::size(names); ++i) {
      if (saved_[i]) ::setenv(names[i], saved_[i]->c_str(), 1);
      else ::unsetenv(names[i]);
    }
  }
  void set(const char* name, const char* value) { ::setenv(name, value, 1); }

 private:
  static constexpr const char* names[] = {"FRAGCTL_POLICY",     "FRAGCTL_BACKEND",         "FRAGCTL_CONF",
                                          "FRAGCTL_REPORT",     "FRAGCTL_TRACE",           "FRAGCTL_LOG_LEVEL",
                                          "FRAGCTL_PROMETHEUS", "FRAGCTL_REPORT_INTERVAL", "PYTORCH_CUDA_ALLOC_CONF"};
  std::vector<std::optional<std::string>> saved_;
};

TEST(config_from_environment, nothing_set_gives_the_defaults) {
  environment env;
  auto c = config_from_environment();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(describe(*c), describe(config{}));
}

TEST(config_from_environment, each_displayed_default_is_the_default_configs_value) {
  environment env;
  for (const environment_variable& v : environment_variables()) {
    if (v.default_value.empty()) continue;
    env.set(std::string(v.name).c_str(), std::string(default_token(v.default_value)).c_str());
    auto c = config_from_environment();
    ::unsetenv(std::string(v.name).c_str());
    ASSERT_TRUE(c.ok()) << v.name << ": " << c.status();
    // The level named is kept (an unset one leaves the process's level
    // alone, default_log_level until something sets it).
    config expected;
    if (v.name == "FRAGCTL_LOG_LEVEL") expected.log_level = default_log_level;
    EXPECT_TRUE(*c == expected) << v.name << ": shown default " << v.default_value << " gives " << describe(*c);
  }
}

TEST(config_from_environment, reads_every_variable) {
  environment env;
  env.set("FRAGCTL_POLICY", " buckets:caching ");
  env.set("FRAGCTL_BACKEND", "sim");
  env.set("FRAGCTL_CONF", "sim_capacity:4GiB,limit:1GiB");
  env.set("FRAGCTL_REPORT", "/tmp/report.json");
  env.set("FRAGCTL_TRACE", "/tmp/trace.csv");
  env.set("FRAGCTL_LOG_LEVEL", "debug");
  auto c = config_from_environment();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->policy, "buckets:caching");
  EXPECT_EQ(c->backend, backend_kind::sim);
  EXPECT_EQ(c->sim_capacity, 4 * GiB);
  EXPECT_EQ(c->limit, GiB);
  EXPECT_EQ(c->report_path, "/tmp/report.json");
  EXPECT_EQ(c->trace_path, "/tmp/trace.csv");
  EXPECT_EQ(c->log_level, "debug");
}

TEST(config_from_environment, report_variable_overrides_the_conf_key) {
  environment env;
  env.set("FRAGCTL_CONF", "report:/tmp/from_conf.json");
  auto c = config_from_environment();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->report_path, "/tmp/from_conf.json");
  env.set("FRAGCTL_REPORT", "/tmp/from_env.json");
  c = config_from_environment();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->report_path, "/tmp/from_env.json");
}

TEST(config_from_environment, errors_name_the_variable) {
  {
    environment env;
    env.set("FRAGCTL_BACKEND", "opencl");
    auto c = config_from_environment();
    ASSERT_FALSE(c.ok());
    EXPECT_NE(std::string(c.status().message()).find("FRAGCTL_BACKEND"), std::string::npos) << c.status();
  }
  {
    environment env;
    env.set("FRAGCTL_CONF", "limit:huge");
    auto c = config_from_environment();
    ASSERT_FALSE(c.ok());
    const std::string m(c.status().message());
    EXPECT_NE(m.find("FRAGCTL_CONF"), std::string::npos) << m;
    EXPECT_NE(m.find("limit"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace fragctl
