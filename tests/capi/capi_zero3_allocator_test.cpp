// The ZeRO-3 manager on C API allocator handles (fragctl_zero3_create,
// fragctl/zero3/zero3.h) on sim: it takes its shards and gradients from the
// long-lived handle and its gathered blocks from the transient one, returns
// them at destroy; a handle cannot be destroyed under the manager; misuse is
// refused and leaves no dependent counted.
#include <gtest/gtest.h>

#include <cstddef>
#include <string>

#include "fragctl/fragctl.h"
#include "fragctl/zero3/zero3.h"
#include "nlohmann/json.hpp"

namespace {

// One rank, so this rank's shard is the whole of every parameter.
constexpr fragctl_zero3_param layer[] = {{"w", 1 << 20, 2, 1}, {"frozen", 1 << 18, 2, 0}};
constexpr std::size_t layer_bytes = ((1 << 20) + (1 << 18)) * 2;
constexpr const char* options = "stage3_param_persistence_threshold:64,gradient_type:fp32";

fragctl_allocator* make_allocator(int device = 0) {
  fragctl_allocator* a = nullptr;
  EXPECT_EQ(fragctl_create("caching", "sim_capacity:256MiB,sim_backed:true", "sim", device, &a), FRAGCTL_OK)
      << fragctl_last_error();
  return a;
}

/// An allocator's current requested and reserved bytes.
std::pair<std::size_t, std::size_t> held(fragctl_allocator* a) {
  char* text = nullptr;
  EXPECT_EQ(fragctl_stats_json(a, &text), FRAGCTL_OK) << fragctl_last_error();
  const nlohmann::json j = nlohmann::json::parse(text == nullptr ? "{}" : text);
  fragctl_string_free(text);
  return {j["requested_bytes"]["current"].get<std::size_t>(), j["reserved_bytes"]["current"].get<std::size_t>()};
}

class zero3_allocator : public ::testing::Test {
 protected:
  ~zero3_allocator() override {
    fragctl_zero3_destroy(z_);
    EXPECT_EQ(fragctl_destroy(allocator_), FRAGCTL_OK) << fragctl_last_error();
  }

  /// The manager on `long_lived` and `transient`.
  void create(fragctl_allocator* long_lived, fragctl_allocator* transient) {
    ASSERT_EQ(fragctl_zero3_create(long_lived, transient, options, "local", &z_), FRAGCTL_OK) << fragctl_last_error();
  }

  void start() {
    ASSERT_EQ(fragctl_zero3_add_block(z_, "layer.0", layer, 2), FRAGCTL_OK) << fragctl_last_error();
    ASSERT_EQ(fragctl_zero3_start(z_), FRAGCTL_OK) << fragctl_last_error();
  }

  fragctl_allocator* allocator_ = make_allocator();
  fragctl_zero3* z_ = nullptr;
};

TEST_F(zero3_allocator, the_manager_allocates_everything_from_one_handle) {
  create(allocator_, allocator_);
  EXPECT_EQ(held(allocator_).first, 0U);
  start();
  const std::size_t at_start = held(allocator_).first;
  EXPECT_GE(at_start, layer_bytes);  // the shard

  void* pointers[2] = {};
  std::size_t sizes[2] = {};
  ASSERT_EQ(fragctl_zero3_fetch(z_, 0, nullptr, pointers, sizes, 2), FRAGCTL_OK) << fragctl_last_error();
  EXPECT_GE(held(allocator_).first, at_start + layer_bytes);  // the gathered block
  ASSERT_EQ(fragctl_zero3_begin_gradients(z_, 0, nullptr, pointers, sizes, 2), FRAGCTL_OK);
  ASSERT_EQ(fragctl_zero3_reduce_gradients(z_, 0, nullptr), FRAGCTL_OK) << fragctl_last_error();
  ASSERT_EQ(fragctl_zero3_release(z_, 0, nullptr), FRAGCTL_OK);
  ASSERT_EQ(fragctl_zero3_finish_gradients(z_, nullptr), FRAGCTL_OK) << fragctl_last_error();
  const std::size_t with_gradient = held(allocator_).first;
  EXPECT_GE(with_gradient, at_start + (std::size_t{1} << 20) * 4);  // the fp32 gradient slice of "w"
  ASSERT_EQ(fragctl_zero3_end_step(z_, nullptr), FRAGCTL_OK);
  ASSERT_EQ(fragctl_zero3_release_gradients(z_, nullptr), FRAGCTL_OK) << fragctl_last_error();
  ASSERT_EQ(fragctl_zero3_synchronize(z_), FRAGCTL_OK);
  EXPECT_EQ(held(allocator_).first, at_start);  // the slice went back to the shared pool

  char* text = nullptr;
  ASSERT_EQ(fragctl_zero3_stats_json(z_, &text), FRAGCTL_OK) << fragctl_last_error();
  const nlohmann::json j = nlohmann::json::parse(text);
  fragctl_string_free(text);
  EXPECT_EQ(j["allocators"]["long_lived"], j["allocators"]["gathered"]);  // one pool

  fragctl_zero3_destroy(z_);
  z_ = nullptr;
  const auto [requested, reserved] = held(allocator_);
  EXPECT_EQ(requested, 0U);  // every byte freed
  // What the manager freed stays in the pool for its other users: the same
  // bytes again need nothing more from the device.
  void* p = nullptr;
  ASSERT_EQ(fragctl_malloc(allocator_, &p, layer_bytes, nullptr), FRAGCTL_OK) << fragctl_last_error();
  EXPECT_EQ(held(allocator_), std::make_pair(layer_bytes, reserved));
  EXPECT_EQ(fragctl_free(allocator_, p, layer_bytes, nullptr), FRAGCTL_OK);
}

TEST_F(zero3_allocator, a_manager_on_other_handles_leaves_this_one_alone) {
  fragctl_allocator* own = make_allocator();
  create(own, own);
  start();
  void* pointers[2] = {};
  std::size_t sizes[2] = {};
  ASSERT_EQ(fragctl_zero3_fetch(z_, 0, nullptr, pointers, sizes, 2), FRAGCTL_OK) << fragctl_last_error();
  EXPECT_EQ(held(allocator_).first, 0U);
  EXPECT_EQ(fragctl_destroy(allocator_), FRAGCTL_OK);  // not a dependent
  allocator_ = nullptr;
  fragctl_zero3_destroy(z_);
  z_ = nullptr;
  EXPECT_EQ(fragctl_destroy(own), FRAGCTL_OK) << fragctl_last_error();
}

// As for checkpoint stores (capi_checkpoint_test): a manager left on a
// destroyed allocator would free into freed memory.
TEST_F(zero3_allocator, the_allocator_cannot_be_destroyed_while_the_manager_lives) {
  create(allocator_, allocator_);
  EXPECT_EQ(fragctl_destroy(allocator_), FRAGCTL_ERROR_STATE);  // unstarted
  start();
  EXPECT_EQ(fragctl_destroy(allocator_), FRAGCTL_ERROR_STATE);
  EXPECT_NE(std::string(fragctl_last_error()).find("ZeRO-3 manager"), std::string::npos) << fragctl_last_error();
  void* pointers[2] = {};
  std::size_t sizes[2] = {};
  EXPECT_EQ(fragctl_zero3_fetch(z_, 0, nullptr, pointers, sizes, 2), FRAGCTL_OK) << fragctl_last_error();
  fragctl_zero3_destroy(z_);
  z_ = nullptr;
  EXPECT_EQ(fragctl_destroy(allocator_), FRAGCTL_OK) << fragctl_last_error();
  allocator_ = nullptr;
}

TEST_F(zero3_allocator, long_lived_and_transient_memory_come_from_their_handles) {
  fragctl_allocator* transient = make_allocator();
  create(allocator_, transient);
  start();
  EXPECT_GE(held(allocator_).first, layer_bytes);  // the shard
  EXPECT_EQ(held(transient).first, 0U);
  void* pointers[2] = {};
  std::size_t sizes[2] = {};
  ASSERT_EQ(fragctl_zero3_fetch(z_, 0, nullptr, pointers, sizes, 2), FRAGCTL_OK) << fragctl_last_error();
  EXPECT_GE(held(transient).first, layer_bytes);  // the gathered block
  EXPECT_EQ(fragctl_destroy(transient), FRAGCTL_ERROR_STATE);
  ASSERT_EQ(fragctl_zero3_release(z_, 0, nullptr), FRAGCTL_OK);
  fragctl_zero3_destroy(z_);
  z_ = nullptr;
  EXPECT_EQ(fragctl_destroy(transient), FRAGCTL_OK) << fragctl_last_error();  // no longer a dependent
}

TEST_F(zero3_allocator, misuse_is_refused_and_leaves_no_dependent) {
  EXPECT_EQ(fragctl_zero3_create(nullptr, allocator_, options, "local", &z_), FRAGCTL_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fragctl_last_error()).find("long-lived allocator is NULL"), std::string::npos)
      << fragctl_last_error();
  EXPECT_EQ(fragctl_zero3_create(allocator_, nullptr, options, "local", &z_), FRAGCTL_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fragctl_last_error()).find("transient allocator is NULL"), std::string::npos)
      << fragctl_last_error();
  EXPECT_EQ(fragctl_zero3_create(allocator_, allocator_, options, "local", nullptr), FRAGCTL_ERROR_INVALID_ARGUMENT);

  fragctl_allocator* device1 = make_allocator(1);
  EXPECT_EQ(fragctl_zero3_create(allocator_, device1, options, "local", &z_), FRAGCTL_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fragctl_last_error()).find("transient allocator is on sim device 1, the long-lived one on "
                                                   "sim device 0"),
            std::string::npos)
      << fragctl_last_error();
  EXPECT_EQ(z_, nullptr);
  EXPECT_EQ(fragctl_destroy(device1), FRAGCTL_OK) << fragctl_last_error();
  EXPECT_EQ(fragctl_zero3_create(allocator_, allocator_, "stage3_nonsense:1", "local", &z_),
            FRAGCTL_ERROR_INVALID_ARGUMENT);
  // The fixture's fragctl_destroy succeeds: no dependent was left counted.
  EXPECT_EQ(fragctl_destroy(allocator_), FRAGCTL_OK) << fragctl_last_error();
  allocator_ = nullptr;
}

}  // namespace
