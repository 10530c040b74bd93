// make_backend: FRAGCTL_BACKEND semantics through the parsed configuration.
// Assertions that depend on whether a GPU is present ask the factories first
// and expect accordingly (or skip where only a machine without one can tell).
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "fragctl/backend.hpp"
#include "fragctl/config.hpp"
#include "fragctl/error.hpp"
#include "fragctl/log.hpp"
#include "fragctl/sim_backend.hpp"
#include "support/log_capture.hpp"
#include "util/strings.hpp"

namespace fragctl {
namespace {

bool cuda_present() {
  try {
    return make_cuda_backend(0) != nullptr;
  } catch (const backend_error&) {
    return false;
  }
}

bool hip_present() {
  try {
    return make_hip_backend(0) != nullptr;
  } catch (const backend_error&) {
    return false;
  }
}

config config_for(std::string_view backend, std::string_view conf = "") {
  absl::StatusOr<config> parsed = parse_config(conf);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  absl::StatusOr<backend_kind> kind = parse_backend_kind(backend);
  EXPECT_TRUE(kind.ok()) << kind.status();
  config cfg = parsed.ok() ? *parsed : config{};
  if (kind.ok()) cfg.backend = *kind;
  return cfg;
}


TEST(backend_select, explicit_sim_uses_the_configured_options) {
  config cfg = config_for("sim", "sim_capacity:1GiB,sim_granularity:64KiB,sim_virtual_memory:false");
  cfg.device = 2;
  const std::unique_ptr<device_backend> backend = make_backend(cfg);
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->name(), "sim");
  EXPECT_EQ(backend->device(), 2);
  EXPECT_EQ(backend->granularity(), 64 * KiB);
  EXPECT_FALSE(backend->supports_virtual_memory());
  const auto* sim = dynamic_cast<const sim_backend*>(backend.get());
  ASSERT_NE(sim, nullptr);
  EXPECT_EQ(sim->options().capacity, 1 * GiB);
  EXPECT_EQ(sim->options().granularity, 64 * KiB);
  EXPECT_FALSE(sim->options().backed);
  EXPECT_FALSE(sim->options().virtual_memory);
}

TEST(backend_select, explicit_sim_can_be_backed) {
  const std::unique_ptr<device_backend> backend = make_backend(config_for("sim", "sim_backed:true"));
  const auto* sim = dynamic_cast<const sim_backend*>(backend.get());
  ASSERT_NE(sim, nullptr);
  EXPECT_TRUE(sim->options().backed);
  EXPECT_TRUE(sim->supports_virtual_memory());
  EXPECT_EQ(sim->granularity(), 2 * MiB);
}

TEST(backend_select, automatic_prefers_cuda_then_hip_then_sim) {
  const std::unique_ptr<device_backend> backend = make_backend(config_for("auto"));
  ASSERT_NE(backend, nullptr);
  const std::string_view expected = cuda_present() ? "cuda" : hip_present() ? "hip" : "sim";
  EXPECT_EQ(backend->name(), expected);
}

TEST(backend_select, automatic_without_a_gpu_gives_the_configured_sim_and_says_why) {
  if (cuda_present() || hip_present()) GTEST_SKIP() << "a GPU is present";
  const fragctl::testing::log_capture log(spdlog::level::info);
  const std::unique_ptr<device_backend> backend = make_backend(config_for("auto", "sim_capacity:2GiB"));
  const auto* sim = dynamic_cast<const sim_backend*>(backend.get());
  ASSERT_NE(sim, nullptr);
  EXPECT_EQ(sim->options().capacity, 2 * GiB);
  const std::string text = log.text();
  EXPECT_NE(text.find("cuda skipped: cuda backend: "), std::string::npos) << text;
  EXPECT_NE(text.find("hip skipped: hip backend: "), std::string::npos) << text;
  EXPECT_NE(text.find("using sim"), std::string::npos) << text;
}

TEST(backend_select, explicit_cuda_without_a_driver_is_a_one_line_error) {
  if (cuda_present()) GTEST_SKIP() << "a CUDA device is present";
  try {
    (void)make_backend(config_for("cuda"));
    FAIL() << "FRAGCTL_BACKEND=cuda worked without a CUDA device";
  } catch (const backend_error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    EXPECT_NE(util::lower(what).find("cuda"), std::string::npos) << what;
    EXPECT_FALSE(e.code_name().empty());
  }
}

TEST(backend_select, explicit_hip_without_a_device_is_a_one_line_error) {
  if (hip_present()) GTEST_SKIP() << "a HIP device is present";
  try {
    (void)make_backend(config_for("hip"));
    FAIL() << "FRAGCTL_BACKEND=hip worked without a HIP device";
  } catch (const backend_error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    EXPECT_NE(util::lower(what).find("hip"), std::string::npos) << what;
  }
}

TEST(backend_select, explicit_cuda_on_a_missing_device_names_it) {
  if (!cuda_present()) GTEST_SKIP() << "no CUDA device";
  config cfg = config_for("cuda");
  cfg.device = 4096;
  try {
    (void)make_backend(cfg);
    FAIL() << "CUDA device 4096 exists?";
  } catch (const backend_error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device 4096"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fragctl
