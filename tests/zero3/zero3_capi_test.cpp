// The zero3 C API on sim, one rank: a step of fetch/release and gradients,
// statistics JSON, and errors as fragctl_status codes with a message
// (fragctl_last_error).
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fragctl/zero3/zero3.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "fragctl/fragctl.h"
#include "fragctl/zero3/options.hpp"

namespace {

// The manager on two private allocators (long-lived, transient) of fragctl_create.
class zero3_capi : public ::testing::Test {
 protected:
  zero3_capi() {
    for (fragctl_allocator** a : {&long_lived_, &transient_}) {
      EXPECT_EQ(fragctl_create("arena", "sim_backed:true,sim_capacity:256MiB,arena_size:64MiB", "sim", 0, a),
                FRAGCTL_OK)
          << fragctl_last_error();
    }
  }
  ~zero3_capi() override {
    EXPECT_EQ(fragctl_destroy(transient_), FRAGCTL_OK) << fragctl_last_error();
    EXPECT_EQ(fragctl_destroy(long_lived_), FRAGCTL_OK) << fragctl_last_error();
  }
  fragctl_status create(const char* options, const char* communicator, fragctl_zero3** z) {
    return fragctl_zero3_create(long_lived_, transient_, options, communicator, z);
  }

  fragctl_allocator* long_lived_ = nullptr;
  fragctl_allocator* transient_ = nullptr;
};

TEST_F(zero3_capi, one_step_through_the_c_api) {
  fragctl_zero3* z = nullptr;
  ASSERT_EQ(create("stage3_param_persistence_threshold:64,gradient_type:fp32", "local", &z),
            FRAGCTL_OK)
      << fragctl_last_error();
  const fragctl_zero3_param layer[] = {{"norm", 32, 2, 1}, {"w", 4096, 2, 1}, {"frozen", 1000, 2, 0}};
  const fragctl_zero3_param head[] = {{"lm_head", 5000, 2, 1}};
  ASSERT_EQ(fragctl_zero3_add_block(z, "layer.0", layer, 3), FRAGCTL_OK);
  ASSERT_EQ(fragctl_zero3_add_block(z, "head", head, 1), FRAGCTL_OK);
  ASSERT_EQ(fragctl_zero3_start(z), FRAGCTL_OK) << fragctl_last_error();
  EXPECT_EQ(fragctl_zero3_add_block(z, "late", head, 1), FRAGCTL_ERROR_INVALID_ARGUMENT);

  // Load "w" through its shard (one rank holds all of it), then gather it back.
  std::size_t offset = 1;
  void* shard = nullptr;
  std::size_t bytes = 0;
  ASSERT_EQ(fragctl_zero3_shard_of(z, 0, 1, &offset, &shard, &bytes), FRAGCTL_OK);
  ASSERT_EQ(offset, 0U);
  ASSERT_EQ(bytes, 8192U);
  std::memset(shard, 0x5a, bytes);
  void* pointers[3] = {};
  std::size_t sizes[3] = {};
  ASSERT_EQ(fragctl_zero3_fetch(z, 0, nullptr, pointers, sizes, 3), FRAGCTL_OK);
  EXPECT_EQ(sizes[0], 64U);
  EXPECT_EQ(sizes[1], 8192U);
  EXPECT_EQ(sizes[2], 2000U);
  EXPECT_EQ(static_cast<unsigned char*>(pointers[1])[8191], 0x5a);
  void* grads[3] = {};
  std::size_t grad_sizes[3] = {};
  void* data = nullptr;
  void* gradient = nullptr;
  std::size_t elements = 0;
  ASSERT_EQ(fragctl_zero3_trainable_shard(z, 0, &data, &gradient, &elements), FRAGCTL_OK);
  EXPECT_EQ(gradient, nullptr);  // allocated at the block's reduce
  ASSERT_EQ(fragctl_zero3_begin_gradients(z, 0, nullptr, grads, grad_sizes, 3), FRAGCTL_OK);
  EXPECT_EQ(grad_sizes[1], 4096U * 4);  // fp32 gradients
  EXPECT_EQ(grads[2], nullptr);         // frozen
  EXPECT_EQ(fragctl_zero3_release_gradients(z, nullptr), FRAGCTL_ERROR_INVALID_ARGUMENT);  // reduce to come
  EXPECT_NE(std::string(fragctl_last_error()).find("holds a reduce bucket"), std::string::npos);
  ASSERT_EQ(fragctl_zero3_reduce_gradients(z, 0, nullptr), FRAGCTL_OK);
  ASSERT_EQ(fragctl_zero3_release(z, 0, nullptr), FRAGCTL_OK);
  ASSERT_EQ(fragctl_zero3_finish_gradients(z, nullptr), FRAGCTL_OK);
  ASSERT_EQ(fragctl_zero3_trainable_shard(z, 0, &data, &gradient, &elements), FRAGCTL_OK);
  EXPECT_NE(gradient, nullptr);
  EXPECT_EQ(elements, 4096U);
  ASSERT_EQ(fragctl_zero3_end_step(z, nullptr), FRAGCTL_OK);
  ASSERT_EQ(fragctl_zero3_release_gradients(z, nullptr), FRAGCTL_OK) << fragctl_last_error();
  ASSERT_EQ(fragctl_zero3_trainable_shard(z, 0, &data, &gradient, &elements), FRAGCTL_OK);
  EXPECT_EQ(gradient, nullptr);
  ASSERT_EQ(fragctl_zero3_synchronize(z), FRAGCTL_OK);

  char* text = nullptr;
  ASSERT_EQ(fragctl_zero3_stats_json(z, &text), FRAGCTL_OK) << fragctl_last_error();
  ASSERT_NE(text, nullptr);
  const nlohmann::json j = nlohmann::json::parse(text);
  fragctl_string_free(text);
  EXPECT_EQ(j["schema"], "fragctl.zero3");
  EXPECT_EQ(j["gathers"], 1);
  EXPECT_EQ(j["parameters"]["frozen"], 1);

  // Errors: a status and a message naming the problem.
  EXPECT_EQ(fragctl_zero3_release(z, 0, nullptr), FRAGCTL_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fragctl_last_error()).find("no consumer"), std::string::npos);
  EXPECT_EQ(fragctl_zero3_fetch(z, 7, nullptr, pointers, sizes, 3), FRAGCTL_ERROR_INVALID_ARGUMENT);
  fragctl_zero3_destroy(z);
}

TEST_F(zero3_capi, bad_options_and_communicators_are_reported) {
  fragctl_zero3* z = nullptr;
  EXPECT_EQ(create("stage3_nonsense:1", "local", &z), FRAGCTL_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fragctl_last_error()).find("stage3_nonsense"), std::string::npos);
  EXPECT_EQ(z, nullptr);
  EXPECT_EQ(create("", "mpi", &z), FRAGCTL_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(create("", "nccl:rank=0,size=2", &z), FRAGCTL_ERROR_INVALID_ARGUMENT);  // sim backend
  EXPECT_EQ(fragctl_zero3_start(nullptr), FRAGCTL_ERROR_INVALID_ARGUMENT);
  fragctl_zero3_destroy(nullptr);
}

// The zero3 statuses are fragctl.h's, named by fragctl_status_string.
TEST(zero3_capi_status, every_status_has_its_name) {
  EXPECT_STREQ(fragctl_status_string(FRAGCTL_OK), "FRAGCTL_OK");
  EXPECT_STREQ(fragctl_status_string(FRAGCTL_ERROR_BUDGET), "FRAGCTL_ERROR_BUDGET");
  EXPECT_STREQ(fragctl_status_string(FRAGCTL_ERROR_COLLECTIVE), "FRAGCTL_ERROR_COLLECTIVE");
  EXPECT_STREQ(fragctl_status_string(FRAGCTL_ERROR_TIMEOUT), "FRAGCTL_ERROR_TIMEOUT");
  EXPECT_STREQ(fragctl_status_string(FRAGCTL_ERROR_INTERNAL), "FRAGCTL_ERROR_INTERNAL");
}

// The options' defaults are read across the language line from here
// (fragctl.torch.zero3's Zero3Config): DeepSpeed's, in its units.
TEST(zero3_capi_defaults, the_default_options_are_the_managers) {
  char* text = nullptr;
  ASSERT_EQ(fragctl_zero3_default_options_json(&text), FRAGCTL_OK) << fragctl_last_error();
  const nlohmann::json j = nlohmann::json::parse(text);
  fragctl_string_free(text);
  const fragctl::zero3::options o;
  EXPECT_EQ(j["stage3_max_live_parameters"].get<std::size_t>() * fragctl::zero3::default_element_bytes,
            o.max_live_bytes);
  EXPECT_EQ(j["stage3_prefetch_bucket_size"].get<std::size_t>() * fragctl::zero3::default_element_bytes,
            o.prefetch_bytes);
  EXPECT_EQ(j["stage3_param_persistence_threshold"].get<std::size_t>(), o.persistence_threshold);
  EXPECT_EQ(j["reduce_bucket_size"].get<std::size_t>(), 500'000'000U);
  EXPECT_EQ(j["alignment"].get<std::size_t>(), o.alignment);
  EXPECT_EQ(fragctl_zero3_default_options_json(nullptr), FRAGCTL_ERROR_INVALID_ARGUMENT);
}

}  // namespace
