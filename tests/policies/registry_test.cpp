// The policy registry: expressions, defaults, names, and the allocator stack.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "fmt/format.h"
#include "fragctl/allocator_stack.hpp"
#include "fragctl/error.hpp"
#include "fragctl/log.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/sim_backend.hpp"
#include "gtest/gtest.h"

namespace fragctl {
namespace {

bool registered(std::string_view name) {
  for (const policy_info& p : policies()) {
    if (p.name == name) return true;
  }
  return false;
}

std::string error_of(std::string_view expression) {
  const absl::Status st = validate_policy(expression);
  EXPECT_FALSE(st.ok()) << expression;
  return std::string(st.message());
}

TEST(policy_registry, lists_caching_as_a_base_with_help) {
  bool found = false;
  for (const policy_info& p : policies()) {
    EXPECT_FALSE(p.help.empty()) << p.name;
    if (p.name == "caching") {
      found = true;
      EXPECT_FALSE(p.wraps_upstream);
    }
    if (p.name == "arena") {
      EXPECT_FALSE(p.wraps_upstream);
    }
    if (p.name == "buckets" || p.name == "warmup") {
      EXPECT_TRUE(p.wraps_upstream) << p.name;
    }
  }
  EXPECT_TRUE(found);
}

TEST(policy_registry, accepts_valid_expressions) {
  EXPECT_TRUE(validate_policy("caching").ok());
  EXPECT_TRUE(validate_policy("").ok());
  EXPECT_TRUE(validate_policy(" caching ").ok());
  for (const policy_info& p : policies()) {
    if (!p.wraps_upstream) continue;
    EXPECT_TRUE(validate_policy(p.name).ok()) << p.name;  // default base follows
    EXPECT_TRUE(validate_policy(fmt::format("{}:caching", p.name)).ok()) << p.name;
  }
}

TEST(policy_registry, unknown_names_are_named_with_the_accepted_list) {
  const std::string message = error_of("nonsense");
  EXPECT_NE(message.find("\"nonsense\""), std::string::npos) << message;
  for (const policy_info& p : policies()) EXPECT_NE(message.find(p.name), std::string::npos) << message;
  EXPECT_NE(error_of("caching:").find("empty name"), std::string::npos);
  EXPECT_NE(error_of("bogus:caching").find("\"bogus\""), std::string::npos);
}

TEST(policy_registry, base_must_come_last) {
  const std::string message = error_of("caching:caching");
  EXPECT_NE(message.find("base policy \"caching\" must come last"), std::string::npos) << message;
  if (registered("buckets")) {
    EXPECT_NE(error_of("caching:buckets").find("must come last"), std::string::npos);
  }
}

TEST(policy_registry, default_policy_follows_virtual_memory_support) {
  const sim_backend without_vm(sim_options{.virtual_memory = false});
  EXPECT_EQ(default_policy(without_vm), "caching");
  const sim_backend with_vm(sim_options{.virtual_memory = true});
  EXPECT_EQ(default_policy(with_vm), registered("arena") ? "arena" : "caching");
}

TEST(policy_registry, make_policy_builds_and_names_the_chain) {
  sim_backend backend;
  config cfg;
  const auto caching = make_policy("caching", cfg, backend);
  EXPECT_EQ(caching->name(), "caching");
  EXPECT_EQ(&caching->backend(), &backend);
  void* p = caching->allocate(1000);
  EXPECT_NE(p, nullptr);
  caching->deallocate(p, 1000);
  EXPECT_THROW((void)make_policy("nonsense", cfg, backend), invalid_argument);
  EXPECT_THROW((void)make_policy("caching:caching", cfg, backend), invalid_argument);
}

TEST(policy_registry, make_policy_empty_expression_is_the_default) {
  sim_backend backend(sim_options{.virtual_memory = false});
  const auto policy = make_policy("", config{}, backend);
  EXPECT_EQ(policy->name(), "caching");
}

config sim_config() {
  config cfg;
  cfg.backend = backend_kind::sim;
  cfg.sim_capacity = 1 * GiB;
  cfg.sim_virtual_memory = false;
  return cfg;
}

TEST(allocator_stack, resolves_the_expression_and_names_the_stack) {
  auto stack = make_allocator(sim_config());
  EXPECT_EQ(stack->configuration().policy, "caching");
  EXPECT_EQ(stack->allocator().name(), "caching");
  EXPECT_EQ(stack->backend().name(), "sim");
  void* p = stack->allocator().allocate(4096);
  const allocator_stats s = stack->stats();
  EXPECT_EQ(s.allocator, "caching");
  EXPECT_EQ(s.allocations, 1u);
  EXPECT_EQ(s.requested.current, 4096u);
  EXPECT_GE(s.reserved.current, 4096u);
  EXPECT_EQ(s.pool.reserved, s.reserved.current);
  stack->allocator().deallocate(p, 4096);
  EXPECT_EQ(stack->stats().frees, 1u);
}

TEST(allocator_stack, trailing_wrapper_gets_the_default_base) {
  if (!registered("buckets")) GTEST_SKIP() << "buckets policy not built";
  config cfg = sim_config();
  cfg.policy = "buckets";
  auto stack = make_allocator(cfg);
  EXPECT_EQ(stack->configuration().policy, "buckets:caching");
  EXPECT_EQ(stack->allocator().name(), "buckets:caching");
  void* p = stack->allocator().allocate(1000);
  stack->allocator().deallocate(p, 1000);
  EXPECT_EQ(stack->stats().allocator, "buckets:caching");
}

TEST(allocator_stack, applies_the_limit) {
  config cfg = sim_config();
  cfg.limit = 4 * MiB;
  auto stack = make_allocator(cfg);
  void* p = stack->allocator().allocate(3 * MiB);
  EXPECT_THROW((void)stack->allocator().allocate(2 * MiB), out_of_memory);
  EXPECT_EQ(stack->stats().ooms, 1u);
  stack->allocator().deallocate(p, 3 * MiB);
  void* q = stack->allocator().allocate(2 * MiB);
  stack->allocator().deallocate(q, 2 * MiB);
}

TEST(allocator_stack, traces_to_the_configured_file) {
  config cfg = sim_config();
  cfg.trace_path = fmt::format("{}/fragctl_{}_stack_trace.csv", ::testing::TempDir(), ::getpid());
  {
    auto stack = make_allocator(cfg);
    stack->allocator().deallocate(stack->allocator().allocate(1000), 1000);
  }
  ASSERT_TRUE(std::filesystem::exists(cfg.trace_path));
  EXPECT_GT(std::filesystem::file_size(cfg.trace_path), std::string_view("action,addr,size,stream,time_us\n").size());
  std::remove(cfg.trace_path.c_str());
}

TEST(allocator_stack, rejects_bad_expressions_and_log_levels) {
  config cfg = sim_config();
  cfg.policy = "nonsense";
  EXPECT_THROW((void)make_allocator(cfg), invalid_argument);
  cfg = sim_config();
  cfg.log_level = "chatty";
  EXPECT_THROW((void)make_allocator(cfg), invalid_argument);
}

TEST(allocator_stack, an_allocator_made_from_options_alone_leaves_the_log_level_as_it_is) {
  // The logger is the process's, its level FRAGCTL_LOG_LEVEL's (read when
  // the library loads): an allocator made from options (fragctl_create, a
  // replay) set it back to warn, and `FRAGCTL_LOG_LEVEL=debug fragctl
  // replay` showed no debug line.
  ASSERT_TRUE(set_log_level("debug"));
  (void)make_allocator(sim_config());
  EXPECT_EQ(logger().level(), spdlog::level::debug);
  // A configuration that names a level (FRAGCTL_LOG_LEVEL read into it)
  // still sets it.
  config cfg = sim_config();
  cfg.log_level = "error";
  (void)make_allocator(cfg);
  EXPECT_EQ(logger().level(), spdlog::level::err);
  ASSERT_TRUE(set_log_level("warn"));
}

}  // namespace
}  // namespace fragctl
