// PyTorch's allocator keys in FRAGCTL_CONF and PYTORCH_CUDA_ALLOC_CONF
// (src/util/pytorch_conf.hpp), and the size units every size error states.
#include <cstdlib>
#include <string>

#include "fragctl/config.hpp"
#include "gtest/gtest.h"
#include "support/log_capture.hpp"
#include "support/test_support.hpp"

namespace fragctl {
namespace {

std::string error_of(std::string_view conf, config base = {}) {
  auto c = parse_config(conf, std::move(base));
  return c.ok() ? std::string("(parsed)") : std::string(c.status().message());
}

TEST(pytorch_conf, max_split_size_mb_is_in_mebibytes) {
  auto c = parse_config("max_split_size_mb:128");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_split_size, 128 * MiB);
  const std::string m = error_of("max_split_size_mb:1.5");
  EXPECT_NE(m.find("max_split_size_mb"), std::string::npos) << m;
  EXPECT_NE(m.find("2^20"), std::string::npos) << m;
}

TEST(pytorch_conf, expandable_segments_chooses_the_arena) {
  auto on = parse_config("expandable_segments:True");
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ(on->policy, "arena");
  auto off = parse_config("expandable_segments:False");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->policy, "caching");
  config buckets;
  buckets.policy = "buckets:arena";
  auto kept = parse_config("expandable_segments:true", buckets);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->policy, "buckets:arena");
  config caching;
  caching.policy = "caching";
  const std::string m = error_of("expandable_segments:True", caching);
  EXPECT_NE(m.find("FRAGCTL_POLICY"), std::string::npos) << m;
  EXPECT_NE(error_of("expandable_segments:maybe").find("True or False"), std::string::npos);
}

TEST(pytorch_conf, keys_without_an_equivalent_name_what_to_use) {
  std::string m = error_of("garbage_collection_threshold:0.6");
  EXPECT_NE(m.find("garbage_collection_threshold"), std::string::npos) << m;
  EXPECT_NE(m.find("release_threshold"), std::string::npos) << m;
  EXPECT_EQ(m.find("known keys"), std::string::npos) << m;
  m = error_of("roundup_power2_divisions:4");
  EXPECT_NE(m.find("buckets"), std::string::npos) << m;
  m = error_of("backend:cudaMallocAsync");
  EXPECT_NE(m.find("PYTORCH_CUDA_ALLOC_CONF"), std::string::npos) << m;
  EXPECT_NE(m.find("FRAGCTL_BACKEND"), std::string::npos) << m;
}

TEST(pytorch_conf, size_errors_say_which_unit_is_which) {
  const std::string m = error_of("small_size:12 furlongs");
  EXPECT_NE(m.find("MiB is 2^20"), std::string::npos) << m;
  EXPECT_NE(m.find("MB is 10^6"), std::string::npos) << m;
}

TEST(pytorch_conf, pytorch_variable_is_read_when_fragctl_conf_is_unset) {
  testing::scoped_environment env;
  env.set("FRAGCTL_CONF", nullptr);
  env.set("FRAGCTL_POLICY", nullptr);
  env.set("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync,max_split_size_mb:256,expandable_segments:True");
  testing::log_capture log;
  auto c = config_from_environment();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_split_size, 256 * MiB);
  EXPECT_EQ(c->policy, "arena");
  const std::string text = log.text();
  EXPECT_EQ(testing::occurrences(text, "\n"), 1u) << text;
  EXPECT_NE(text.find("max_split_size_mb:256 -> max_split_size:256MiB"), std::string::npos) << text;
  EXPECT_NE(text.find("left to PyTorch: backend:cudaMallocAsync"), std::string::npos) << text;
}

// Regression (red team): every job under `fragctl run` warned "FRAGCTL_CONF
// unset, read PYTORCH_CUDA_ALLOC_CONF: mapped nothing; left to PyTorch:
// backend:cudaMallocAsync", a value fragctl run sets itself. A conf that
// maps nothing is said at info; one that maps a key still warns (control).
// In a child process each, started afresh ("threadsafe": the line is said
// once per process, and an earlier test of this program said it).
TEST(pytorch_conf, a_conf_that_maps_nothing_is_no_warning) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto warned = [](const char* pytorch_conf) {
    testing::scoped_environment env;
    env.set("FRAGCTL_CONF", nullptr);
    env.set("FRAGCTL_POLICY", nullptr);
    env.set("PYTORCH_CUDA_ALLOC_CONF", pytorch_conf);
    testing::log_capture log;  // at the default level, warn
    if (!config_from_environment().ok()) std::_Exit(3);
    std::_Exit(log.text().find("read PYTORCH_CUDA_ALLOC_CONF") != std::string::npos ? 1 : 0);
  };
  EXPECT_EXIT(warned("backend:cudaMallocAsync"), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(warned("backend:cudaMallocAsync,max_split_size_mb:256"), ::testing::ExitedWithCode(1), "");
}

TEST(pytorch_conf, fragctl_conf_wins_over_the_pytorch_variable) {
  testing::scoped_environment env;
  env.set("FRAGCTL_CONF", "");
  env.set("FRAGCTL_POLICY", nullptr);
  env.set("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:256");
  auto c = config_from_environment();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_split_size, config{}.max_split_size);
}

TEST(pytorch_conf, bad_pytorch_value_names_the_variable) {
  testing::scoped_environment env;
  env.set("FRAGCTL_CONF", nullptr);
  env.set("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:lots");
  auto c = config_from_environment();
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("PYTORCH_CUDA_ALLOC_CONF"), std::string::npos) << c.status();
}

}  // namespace
}  // namespace fragctl
