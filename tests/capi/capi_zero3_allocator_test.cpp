// fragctl_zero3_use_allocator (fragctl/zero3/zero3.h) on sim: a manager
// given an allocator handle takes its shards, gathered blocks and gradients
// from it and returns them at destroy; the handle cannot be destroyed under
// the manager; misuse is refused. Without the call the manager keeps its own
// allocators (the default).
#include <gtest/gtest.h>

#include <cstddef>
#include <string>

#include "fragctl/fragctl.h"
#include "fragctl/zero3/zero3.h"
#include "nlohmann/json.hpp"
#include "support/test_support.hpp"

namespace {

// One rank, so this rank's shard is the whole of every parameter.
constexpr fragctl_zero3_param layer[] = {{"w", 1 << 20, 2, 1}, {"frozen", 1 << 18, 2, 0}};
constexpr std::size_t layer_bytes = ((1 << 20) + (1 << 18)) * 2;

class zero3_allocator : public ::testing::Test {
 protected:
  zero3_allocator() {
    EXPECT_EQ(fragctl_create("caching", "sim_capacity:256MiB,sim_backed:true", "sim", 0, &allocator_), FRAGCTL_OK)
        << fragctl_last_error();
    EXPECT_EQ(fragctl_zero3_create("stage3_param_persistence_threshold:64,gradient_type:fp32", "local", &z_),
              FRAGCTL_ZERO3_OK)
        << fragctl_zero3_last_error();
  }
  ~zero3_allocator() override {
    fragctl_zero3_destroy(z_);
    EXPECT_EQ(fragctl_destroy(allocator_), FRAGCTL_OK) << fragctl_last_error();
  }

  /// The allocator's current requested and reserved bytes.
  [[nodiscard]] std::pair<std::size_t, std::size_t> held() const {
    char* text = nullptr;
    EXPECT_EQ(fragctl_stats_json(allocator_, &text), FRAGCTL_OK) << fragctl_last_error();
    const nlohmann::json j = nlohmann::json::parse(text == nullptr ? "{}" : text);
    fragctl_string_free(text);
    return {j["requested_bytes"]["current"].get<std::size_t>(), j["reserved_bytes"]["current"].get<std::size_t>()};
  }

  void start() {
    ASSERT_EQ(fragctl_zero3_add_block(z_, "layer.0", layer, 2), FRAGCTL_ZERO3_OK) << fragctl_zero3_last_error();
    ASSERT_EQ(fragctl_zero3_start(z_), FRAGCTL_ZERO3_OK) << fragctl_zero3_last_error();
  }

  fragctl::testing::sim_environment env_{"caching", "sim_backed:true,sim_capacity:256MiB"};
  fragctl_allocator* allocator_ = nullptr;
  fragctl_zero3* z_ = nullptr;
};

TEST_F(zero3_allocator, the_manager_allocates_everything_from_the_given_allocator) {
  ASSERT_EQ(fragctl_zero3_use_allocator(z_, allocator_), FRAGCTL_ZERO3_OK) << fragctl_zero3_last_error();
  EXPECT_EQ(held().first, 0U);
  start();
  const std::size_t at_start = held().first;
  EXPECT_GE(at_start, layer_bytes);  // the shard

  void* pointers[2] = {};
  std::size_t sizes[2] = {};
  ASSERT_EQ(fragctl_zero3_fetch(z_, 0, nullptr, pointers, sizes, 2), FRAGCTL_ZERO3_OK) << fragctl_zero3_last_error();
  EXPECT_GE(held().first, at_start + layer_bytes);  // the gathered block
  ASSERT_EQ(fragctl_zero3_begin_gradients(z_, 0, nullptr, pointers, sizes, 2), FRAGCTL_ZERO3_OK);
  ASSERT_EQ(fragctl_zero3_reduce_gradients(z_, 0, nullptr), FRAGCTL_ZERO3_OK) << fragctl_zero3_last_error();
  ASSERT_EQ(fragctl_zero3_release(z_, 0, nullptr), FRAGCTL_ZERO3_OK);
  ASSERT_EQ(fragctl_zero3_finish_gradients(z_, nullptr), FRAGCTL_ZERO3_OK) << fragctl_zero3_last_error();
  const std::size_t with_gradient = held().first;
  EXPECT_GE(with_gradient, at_start + (std::size_t{1} << 20) * 4);  // the fp32 gradient slice of "w"
  ASSERT_EQ(fragctl_zero3_end_step(z_, nullptr), FRAGCTL_ZERO3_OK);
  ASSERT_EQ(fragctl_zero3_release_gradients(z_, nullptr), FRAGCTL_ZERO3_OK) << fragctl_zero3_last_error();
  ASSERT_EQ(fragctl_zero3_synchronize(z_), FRAGCTL_ZERO3_OK);
  EXPECT_EQ(held().first, at_start);  // the slice went back to the shared pool

  const std::size_t length = fragctl_zero3_stats_json(z_, nullptr, 0);
  std::string json(length + 1, '\0');
  ASSERT_EQ(fragctl_zero3_stats_json(z_, json.data(), json.size()), length);
  json.resize(length);
  const nlohmann::json j = nlohmann::json::parse(json);
  EXPECT_EQ(j["allocators"]["long_lived"], j["allocators"]["gathered"]);  // one pool

  fragctl_zero3_destroy(z_);
  z_ = nullptr;
  const auto [requested, reserved] = held();
  EXPECT_EQ(requested, 0U);  // every byte freed
  // What the manager freed stays in the pool for its other users: the same
  // bytes again need nothing more from the device.
  void* p = nullptr;
  ASSERT_EQ(fragctl_malloc(allocator_, &p, layer_bytes, nullptr), FRAGCTL_OK) << fragctl_last_error();
  EXPECT_EQ(held(), std::make_pair(layer_bytes, reserved));
  EXPECT_EQ(fragctl_free(allocator_, p, layer_bytes, nullptr), FRAGCTL_OK);
}

TEST_F(zero3_allocator, without_the_call_the_manager_keeps_its_own_allocators) {
  start();
  void* pointers[2] = {};
  std::size_t sizes[2] = {};
  ASSERT_EQ(fragctl_zero3_fetch(z_, 0, nullptr, pointers, sizes, 2), FRAGCTL_ZERO3_OK) << fragctl_zero3_last_error();
  EXPECT_EQ(held().first, 0U);
  EXPECT_EQ(fragctl_destroy(allocator_), FRAGCTL_OK);  // not a dependent
  allocator_ = nullptr;
}

// As for checkpoint stores (capi_checkpoint_test): a manager left on a
// destroyed allocator would free into freed memory.
TEST_F(zero3_allocator, the_allocator_cannot_be_destroyed_while_the_manager_lives) {
  ASSERT_EQ(fragctl_zero3_use_allocator(z_, allocator_), FRAGCTL_ZERO3_OK) << fragctl_zero3_last_error();
  EXPECT_EQ(fragctl_destroy(allocator_), FRAGCTL_ERROR_STATE);  // unstarted
  start();
  EXPECT_EQ(fragctl_destroy(allocator_), FRAGCTL_ERROR_STATE);
  EXPECT_NE(std::string(fragctl_last_error()).find("ZeRO-3 manager"), std::string::npos) << fragctl_last_error();
  void* pointers[2] = {};
  std::size_t sizes[2] = {};
  EXPECT_EQ(fragctl_zero3_fetch(z_, 0, nullptr, pointers, sizes, 2), FRAGCTL_ZERO3_OK) << fragctl_zero3_last_error();
  fragctl_zero3_destroy(z_);
  z_ = nullptr;
  EXPECT_EQ(fragctl_destroy(allocator_), FRAGCTL_OK) << fragctl_last_error();
  allocator_ = nullptr;
}

TEST_F(zero3_allocator, a_second_call_replaces_the_first_allocator) {
  fragctl_allocator* other = nullptr;
  ASSERT_EQ(fragctl_create("caching", "sim_capacity:256MiB,sim_backed:true", "sim", 0, &other), FRAGCTL_OK);
  ASSERT_EQ(fragctl_zero3_use_allocator(z_, other), FRAGCTL_ZERO3_OK) << fragctl_zero3_last_error();
  ASSERT_EQ(fragctl_zero3_use_allocator(z_, allocator_), FRAGCTL_ZERO3_OK) << fragctl_zero3_last_error();
  EXPECT_EQ(fragctl_destroy(other), FRAGCTL_OK) << fragctl_last_error();  // no longer a dependent
  start();
  EXPECT_GE(held().first, layer_bytes);
}

TEST_F(zero3_allocator, misuse_is_refused_and_leaves_no_dependent) {
  EXPECT_EQ(fragctl_zero3_use_allocator(nullptr, allocator_), FRAGCTL_ZERO3_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fragctl_zero3_last_error()).find("manager is NULL"), std::string::npos)
      << fragctl_zero3_last_error();
  EXPECT_EQ(fragctl_zero3_use_allocator(z_, nullptr), FRAGCTL_ZERO3_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fragctl_zero3_last_error()).find("allocator is NULL"), std::string::npos)
      << fragctl_zero3_last_error();

  fragctl_allocator* device1 = nullptr;
  ASSERT_EQ(fragctl_create("caching", "sim_capacity:256MiB,sim_backed:true", "sim", 1, &device1), FRAGCTL_OK);
  EXPECT_EQ(fragctl_zero3_use_allocator(z_, device1), FRAGCTL_ZERO3_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fragctl_zero3_last_error()).find("sim device 1, the manager on sim device 0"),
            std::string::npos)
      << fragctl_zero3_last_error();
  EXPECT_EQ(fragctl_destroy(device1), FRAGCTL_OK) << fragctl_last_error();

  start();
  EXPECT_EQ(fragctl_zero3_use_allocator(z_, allocator_), FRAGCTL_ZERO3_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fragctl_zero3_last_error()).find("before fragctl_zero3_start"), std::string::npos)
      << fragctl_zero3_last_error();
  EXPECT_EQ(held().first, 0U);  // the manager still uses its own allocators
  // The fixture's fragctl_destroy succeeds while the manager lives: no dependent was left counted.
  EXPECT_EQ(fragctl_destroy(allocator_), FRAGCTL_OK) << fragctl_last_error();
  allocator_ = nullptr;
}

}  // namespace
