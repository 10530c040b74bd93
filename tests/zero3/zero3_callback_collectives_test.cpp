// The zero3 C API with the caller's collectives (fragctl_zero3_collectives),
// as fragctl.torch.zero3 drives it: two ranks as threads whose collectives
// exchange through host memory (sim backed), the trainable and persistent
// buffers an optimizer steps, and a collective that times out becoming
// FRAGCTL_ERROR_TIMEOUT with a message naming rank, operation and block.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fragctl/zero3/zero3.h"
#include "gtest/gtest.h"
#include "fragctl/fragctl.h"

namespace {

constexpr int ranks = 2;

// Where the ranks meet. A rank that leaves (its thread is done, or gave up
// after a failed check) makes every meeting it will not join fail at once
// instead of waiting for it; a meeting also fails after `deadline`. So a rank
// that fails early fails the others' collectives rather than hanging them.
class rendezvous {
 public:
  static constexpr std::chrono::seconds deadline{30};

  /// True once every rank has arrived; false when one left or at the deadline.
  bool arrive_and_wait() {
    std::unique_lock lock(mutex_);
    const std::uint64_t phase = phase_;
    if (++arrived_ == ranks) {
      arrived_ = 0;
      ++phase_;
      met_.notify_all();
      return true;
    }
    met_.wait_for(lock, deadline, [&] { return phase_ != phase || left_; });
    return phase_ != phase;
  }
  /// Called once by each rank when it is done, whether it passed or failed.
  void leave() {
    const std::lock_guard lock(mutex_);
    left_ = true;
    met_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable met_;
  int arrived_ = 0;
  std::uint64_t phase_ = 0;
  bool left_ = false;
};

// Two ranks' collectives over shared host memory: each rank posts its
// parts, both wait, each copies what it receives, both wait again.
struct exchange {
  rendezvous sync;
  const void* gather_send[ranks][4] = {};
  const float* scatter_send[ranks][4] = {};
  bool fail_reduce = false;
};

struct rank_context {
  exchange* x;
  int rank;
};

int all_gather(void* context, const fragctl_zero3_gather_part* parts, size_t count, void*, const char*) {
  auto& c = *static_cast<rank_context*>(context);
  for (size_t i = 0; i < count; ++i) c.x->gather_send[c.rank][i] = parts[i].send;
  if (!c.x->sync.arrive_and_wait()) return FRAGCTL_ERROR_COLLECTIVE;
  for (size_t i = 0; i < count; ++i) {
    for (int r = 0; r < ranks; ++r) {
      auto* dst = static_cast<unsigned char*>(parts[i].recv) + r * parts[i].bytes;
      if (dst != c.x->gather_send[r][i]) std::memcpy(dst, c.x->gather_send[r][i], parts[i].bytes);
    }
  }
  if (!c.x->sync.arrive_and_wait()) return FRAGCTL_ERROR_COLLECTIVE;
  return FRAGCTL_OK;
}

int reduce_scatter(void* context, const fragctl_zero3_scatter_part* parts, size_t count, int type, void*,
                   const char*) {
  auto& c = *static_cast<rank_context*>(context);
  if (c.x->fail_reduce) return FRAGCTL_ERROR_TIMEOUT;
  if (type != FRAGCTL_ZERO3_FLOAT32) return FRAGCTL_ERROR_COLLECTIVE;
  std::vector<std::vector<float>> sums(count);
  for (size_t i = 0; i < count; ++i) c.x->scatter_send[c.rank][i] = static_cast<const float*>(parts[i].send);
  if (!c.x->sync.arrive_and_wait()) return FRAGCTL_ERROR_COLLECTIVE;
  for (size_t i = 0; i < count; ++i) {
    sums[i].assign(parts[i].elements, 0.0f);
    for (int r = 0; r < ranks; ++r) {
      for (size_t e = 0; e < parts[i].elements; ++e) sums[i][e] += c.x->scatter_send[r][i][c.rank * parts[i].elements + e];
    }
  }
  // Every rank has read every send before any recv is written.
  if (!c.x->sync.arrive_and_wait()) return FRAGCTL_ERROR_COLLECTIVE;
  for (size_t i = 0; i < count; ++i) std::memcpy(parts[i].recv, sums[i].data(), sums[i].size() * sizeof(float));
  return FRAGCTL_OK;
}

/// A rank's allocator (fragctl_create), the manager's long-lived and
/// transient one; destroyed after the manager.
struct pool {
  pool() {
    EXPECT_EQ(fragctl_create("caching", "sim_backed:true,sim_capacity:256MiB", "sim", 0, &handle), FRAGCTL_OK)
        << fragctl_last_error();
  }
  ~pool() { EXPECT_EQ(fragctl_destroy(handle), FRAGCTL_OK) << fragctl_last_error(); }
  pool(const pool&) = delete;
  pool& operator=(const pool&) = delete;
  fragctl_allocator* handle = nullptr;
};

class zero3_callback : public ::testing::Test {};

// One rank's step: load "w" (rank-dependent shard contents), gather it, write
// gradient 1 + rank everywhere, reduce; returns what the test checks.
struct step_result {
  std::vector<float> gathered;          // "w" after the gather
  std::vector<float> gradient;          // this rank's gradient slice after the reduction
  std::vector<float> persistent_grad;   // "bias" gradient after finish
  size_t shard_elements = 0;
  int status = FRAGCTL_OK;
  std::string error;
};

step_result run_rank(exchange& x, int rank) {
  step_result out;
  rank_context ctx{&x, rank};
  fragctl_zero3_collectives c{rank, ranks, 5000, &ctx, all_gather, reduce_scatter};
  const pool memory;
  fragctl_zero3* z = nullptr;
  EXPECT_EQ(fragctl_zero3_create_with_collectives(
                memory.handle, memory.handle,
                "element_bytes:4,stage3_param_persistence_threshold:64,gradient_type:fp32", &c, &z),
            FRAGCTL_OK)
      << fragctl_last_error();
  const fragctl_zero3_param params[] = {{"bias", 16, 4, 1}, {"w", 1024, 4, 1}};
  EXPECT_EQ(fragctl_zero3_add_block(z, "layer", params, 2), FRAGCTL_OK);
  EXPECT_EQ(fragctl_zero3_start(z), FRAGCTL_OK) << fragctl_last_error();

  void* data = nullptr;
  void* grad = nullptr;
  EXPECT_EQ(fragctl_zero3_trainable_shard(z, 0, &data, &grad, &out.shard_elements), FRAGCTL_OK);
  for (size_t e = 0; e < out.shard_elements; ++e) static_cast<float*>(data)[e] = static_cast<float>(rank * 10000 + e);
  void* bias = nullptr;
  void* bias_grad = nullptr;
  EXPECT_EQ(fragctl_zero3_persistent(z, 0, 0, &bias, &bias_grad), FRAGCTL_OK);
  EXPECT_NE(bias, nullptr);
  void* none = &out;
  EXPECT_EQ(fragctl_zero3_persistent(z, 0, 1, &none, nullptr), FRAGCTL_OK);
  EXPECT_EQ(none, nullptr);  // "w" is partitioned

  void* views[2] = {};
  size_t sizes[2] = {};
  out.status = fragctl_zero3_fetch(z, 0, nullptr, views, sizes, 2);
  if (out.status != FRAGCTL_OK) {  // the other rank failed: no gathered block to read
    out.error = fragctl_last_error();
    ADD_FAILURE() << "rank " << rank << ": " << out.error;
    fragctl_zero3_destroy(z);
    return out;
  }
  const auto* w = static_cast<const float*>(views[1]);
  out.gathered.assign(w, w + 1024);
  void* grads[2] = {};
  size_t grad_sizes[2] = {};
  EXPECT_EQ(fragctl_zero3_begin_gradients(z, 0, nullptr, grads, grad_sizes, 2), FRAGCTL_OK);
  EXPECT_EQ(grads[0], bias_grad);
  for (int i = 0; i < 2; ++i) {
    for (size_t e = 0; e < grad_sizes[i] / 4; ++e) static_cast<float*>(grads[i])[e] = 1.0f + static_cast<float>(rank);
  }
  out.status = fragctl_zero3_reduce_gradients(z, 0, nullptr);
  if (out.status == FRAGCTL_OK) out.status = fragctl_zero3_finish_gradients(z, nullptr);
  out.error = fragctl_last_error();
  if (out.status == FRAGCTL_OK) {
    EXPECT_EQ(grad, nullptr);  // the gradient slice is allocated at the reduce: read its address now
    EXPECT_EQ(fragctl_zero3_trainable_shard(z, 0, nullptr, &grad, nullptr), FRAGCTL_OK);
    out.gradient.assign(static_cast<float*>(grad), static_cast<float*>(grad) + out.shard_elements);
    out.persistent_grad.assign(static_cast<float*>(bias_grad), static_cast<float*>(bias_grad) + 16);
    EXPECT_EQ(fragctl_zero3_release(z, 0, nullptr), FRAGCTL_OK);
    EXPECT_EQ(fragctl_zero3_end_step(z, nullptr), FRAGCTL_OK) << fragctl_last_error();
  }
  fragctl_zero3_destroy(z);
  return out;
}

// run_rank, then leaves the rendezvous (the other rank's waits then fail
// rather than hang if this one stopped early).
step_result run_rank_and_leave(exchange& x, int rank) {
  step_result out = run_rank(x, rank);
  x.sync.leave();
  return out;
}

TEST_F(zero3_callback, two_ranks_gather_and_reduce_through_the_callers_collectives) {
  exchange x;
  step_result results[ranks];
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) threads.emplace_back([&, r] { results[r] = run_rank_and_leave(x, r); });
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) {
    SCOPED_TRACE(r);
    const step_result& s = results[r];
    ASSERT_EQ(s.status, FRAGCTL_OK) << s.error;
    // "w" is 1024 floats after 16 bytes of padding-free alignment: T holds 1024
    // elements (4 KiB) padded to 2 x 512 bytes, 512 elements a rank.
    ASSERT_EQ(s.shard_elements, 512U);
    for (size_t e = 0; e < 1024; ++e) {
      ASSERT_EQ(s.gathered[e], static_cast<float>((e / 512) * 10000 + e % 512)) << e;
    }
    for (float g : s.gradient) ASSERT_EQ(g, 3.0f);         // 1 + 2 summed over the ranks
    for (float g : s.persistent_grad) ASSERT_EQ(g, 3.0f);  // replicated, summed
  }
}

TEST_F(zero3_callback, a_collective_past_its_deadline_is_a_timeout_naming_rank_operation_and_block) {
  exchange x;
  x.fail_reduce = true;
  step_result results[ranks];
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) threads.emplace_back([&, r] { results[r] = run_rank_and_leave(x, r); });
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) {
    EXPECT_EQ(results[r].status, FRAGCTL_ERROR_TIMEOUT);
    const std::string& e = results[r].error;
    EXPECT_NE(e.find("zero3 rank " + std::to_string(r)), std::string::npos) << e;
    EXPECT_NE(e.find("reduce_scatter"), std::string::npos) << e;
    EXPECT_NE(e.find("layer"), std::string::npos) << e;
    EXPECT_NE(e.find("5000 ms"), std::string::npos) << e;
  }
}

TEST_F(zero3_callback, missing_functions_are_refused) {
  fragctl_zero3_collectives c{0, 1, 1000, nullptr, nullptr, reduce_scatter};
  const pool memory;
  fragctl_zero3* z = nullptr;
  EXPECT_EQ(fragctl_zero3_create_with_collectives(memory.handle, memory.handle, "", &c, &z),
            FRAGCTL_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(z, nullptr);
  EXPECT_NE(std::string(fragctl_last_error()).find("all_gather"), std::string::npos);
  EXPECT_EQ(fragctl_zero3_create_with_collectives(memory.handle, memory.handle, "", nullptr, &z),
            FRAGCTL_ERROR_INVALID_ARGUMENT);
  c.all_gather = all_gather;
  c.rank = 1;
  EXPECT_EQ(fragctl_zero3_create_with_collectives(memory.handle, memory.handle, "", &c, &z),
            FRAGCTL_ERROR_INVALID_ARGUMENT);
}

}  // namespace
