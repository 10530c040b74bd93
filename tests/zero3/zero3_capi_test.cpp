// The zero3 C API on sim, one rank: a step of fetch/release and gradients,
// statistics JSON, and errors as status codes with a message.
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fragctl/zero3/zero3.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "support/test_support.hpp"

namespace {

class zero3_capi : public ::testing::Test {
  fragctl::testing::sim_environment env_{"arena", "sim_backed:true,sim_capacity:256MiB,arena_size:64MiB"};
};

TEST_F(zero3_capi, one_step_through_the_c_api) {
  fragctl_zero3* z = nullptr;
  ASSERT_EQ(fragctl_zero3_create("stage3_param_persistence_threshold:64,gradient_type:fp32", "local", &z),
            FRAGCTL_ZERO3_OK)
      << fragctl_zero3_last_error();
  const fragctl_zero3_param layer[] = {{"norm", 32, 2, 1}, {"w", 4096, 2, 1}, {"frozen", 1000, 2, 0}};
  const fragctl_zero3_param head[] = {{"lm_head", 5000, 2, 1}};
  ASSERT_EQ(fragctl_zero3_add_block(z, "layer.0", layer, 3), FRAGCTL_ZERO3_OK);
  ASSERT_EQ(fragctl_zero3_add_block(z, "head", head, 1), FRAGCTL_ZERO3_OK);
  ASSERT_EQ(fragctl_zero3_start(z), FRAGCTL_ZERO3_OK) << fragctl_zero3_last_error();
  EXPECT_EQ(fragctl_zero3_add_block(z, "late", head, 1), FRAGCTL_ZERO3_INVALID_ARGUMENT);

  // Load "w" through its shard (one rank holds all of it), then gather it back.
  std::size_t offset = 1;
  void* shard = nullptr;
  std::size_t bytes = 0;
  ASSERT_EQ(fragctl_zero3_shard_of(z, 0, 1, &offset, &shard, &bytes), FRAGCTL_ZERO3_OK);
  ASSERT_EQ(offset, 0U);
  ASSERT_EQ(bytes, 8192U);
  std::memset(shard, 0x5a, bytes);
  void* pointers[3] = {};
  std::size_t sizes[3] = {};
  ASSERT_EQ(fragctl_zero3_fetch(z, 0, nullptr, pointers, sizes, 3), FRAGCTL_ZERO3_OK);
  EXPECT_EQ(sizes[0], 64U);
  EXPECT_EQ(sizes[1], 8192U);
  EXPECT_EQ(sizes[2], 2000U);
  EXPECT_EQ(static_cast<unsigned char*>(pointers[1])[8191], 0x5a);
  void* grads[3] = {};
  std::size_t grad_sizes[3] = {};
  void* data = nullptr;
  void* gradient = nullptr;
  std::size_t elements = 0;
  ASSERT_EQ(fragctl_zero3_trainable_shard(z, 0, &data, &gradient, &elements), FRAGCTL_ZERO3_OK);
  EXPECT_EQ(gradient, nullptr);  // allocated at the block's reduce
  ASSERT_EQ(fragctl_zero3_begin_gradients(z, 0, nullptr, grads, grad_sizes, 3), FRAGCTL_ZERO3_OK);
  EXPECT_EQ(grad_sizes[1], 4096U * 4);  // fp32 gradients
  EXPECT_EQ(grads[2], nullptr);         // frozen
  EXPECT_EQ(fragctl_zero3_release_gradients(z, nullptr), FRAGCTL_ZERO3_INVALID_ARGUMENT);  // reduce to come
  EXPECT_NE(std::string(fragctl_zero3_last_error()).find("holds a reduce bucket"), std::string::npos);
  ASSERT_EQ(fragctl_zero3_reduce_gradients(z, 0, nullptr), FRAGCTL_ZERO3_OK);
  ASSERT_EQ(fragctl_zero3_release(z, 0, nullptr), FRAGCTL_ZERO3_OK);
  ASSERT_EQ(fragctl_zero3_finish_gradients(z, nullptr), FRAGCTL_ZERO3_OK);
  ASSERT_EQ(fragctl_zero3_trainable_shard(z, 0, &data, &gradient, &elements), FRAGCTL_ZERO3_OK);
  EXPECT_NE(gradient, nullptr);
  EXPECT_EQ(elements, 4096U);
  ASSERT_EQ(fragctl_zero3_end_step(z, nullptr), FRAGCTL_ZERO3_OK);
  ASSERT_EQ(fragctl_zero3_release_gradients(z, nullptr), FRAGCTL_ZERO3_OK) << fragctl_zero3_last_error();
  ASSERT_EQ(fragctl_zero3_trainable_shard(z, 0, &data, &gradient, &elements), FRAGCTL_ZERO3_OK);
  EXPECT_EQ(gradient, nullptr);
  ASSERT_EQ(fragctl_zero3_synchronize(z), FRAGCTL_ZERO3_OK);

  const std::size_t length = fragctl_zero3_stats_json(z, nullptr, 0);
  ASSERT_GT(length, 0U);
  std::string json(length + 1, '\0');
  EXPECT_EQ(fragctl_zero3_stats_json(z, json.data(), json.size()), length);
  json.resize(length);
  const nlohmann::json j = nlohmann::json::parse(json);
  EXPECT_EQ(j["schema"], "fragctl.zero3");
  EXPECT_EQ(j["gathers"], 1);
  EXPECT_EQ(j["parameters"]["frozen"], 1);

  // Errors: a status and a message naming the problem.
  EXPECT_EQ(fragctl_zero3_release(z, 0, nullptr), FRAGCTL_ZERO3_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fragctl_zero3_last_error()).find("no consumer"), std::string::npos);
  EXPECT_EQ(fragctl_zero3_fetch(z, 7, nullptr, pointers, sizes, 3), FRAGCTL_ZERO3_INVALID_ARGUMENT);
  fragctl_zero3_destroy(z);
}

TEST_F(zero3_capi, bad_options_and_communicators_are_reported) {
  fragctl_zero3* z = nullptr;
  EXPECT_EQ(fragctl_zero3_create("stage3_nonsense:1", "local", &z), FRAGCTL_ZERO3_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fragctl_zero3_last_error()).find("stage3_nonsense"), std::string::npos);
  EXPECT_EQ(z, nullptr);
  EXPECT_EQ(fragctl_zero3_create("", "mpi", &z), FRAGCTL_ZERO3_INVALID_ARGUMENT);
  EXPECT_EQ(fragctl_zero3_create("", "nccl:rank=0,size=2", &z), FRAGCTL_ZERO3_INVALID_ARGUMENT);  // sim backend
  EXPECT_EQ(fragctl_zero3_start(nullptr), FRAGCTL_ZERO3_INVALID_ARGUMENT);
  fragctl_zero3_destroy(nullptr);
}

TEST(zero3_capi_status, every_status_has_its_name) {
  EXPECT_STREQ(fragctl_zero3_status_string(FRAGCTL_ZERO3_OK), "FRAGCTL_ZERO3_OK");
  EXPECT_STREQ(fragctl_zero3_status_string(FRAGCTL_ZERO3_BUDGET), "FRAGCTL_ZERO3_BUDGET");
  EXPECT_STREQ(fragctl_zero3_status_string(FRAGCTL_ZERO3_TIMEOUT), "FRAGCTL_ZERO3_TIMEOUT");
  EXPECT_STREQ(fragctl_zero3_status_string(FRAGCTL_ZERO3_ERROR), "FRAGCTL_ZERO3_ERROR");
}

}  // namespace
