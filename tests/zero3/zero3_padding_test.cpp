// Regression (issue 20 review): the padding of shards and reduce buckets held
// stale bytes, which a reduce-scatter summed into the gradient shard's padding,
// a gather returned, and a norm over the flat shards counted. On sim with 1 to
// 4 thread ranks, over memory the allocator hands out dirty: every byte of a
// shard or gathered block that no parameter holds is zero, and the squared
// norm of the gradient shards over all ranks equals the unsharded gradient's.
#include <algorithm>
#include <atomic>
#include <cstring>

#include "gtest/gtest.h"
#include "zero3/zero3_harness.hpp"

namespace fragctl::zero3 {
namespace {

using namespace std::chrono_literals;
using testing::load_parameters;
using testing::rank_env;
using testing::run_ranks;
using testing::small_model;
using testing::small_options;

constexpr unsigned char dirt = 0xA5;

/// Leaves `count` blocks of `bytes` of dirt in the allocator's cache, where
/// the manager's long-lived buffers will be carved from.
void dirty(device_allocator& a, std::size_t bytes, int count) {
  std::vector<void*> blocks;
  for (int i = 0; i < count; ++i) {
    blocks.push_back(a.allocate(bytes, nullptr));
    std::memset(blocks.back(), dirt, bytes);
  }
  for (void* p : blocks) a.deallocate(p, bytes, nullptr);
}

/// Bytes of [base, base + bytes) outside `held` (offsets from base) that are not zero.
std::size_t dirty_padding(const unsigned char* base, std::size_t bytes, std::vector<byte_range> held) {
  std::vector<bool> mask(bytes, false);
  for (const byte_range& r : held) std::fill_n(mask.begin() + static_cast<std::ptrdiff_t>(r.offset), r.bytes, true);
  std::size_t n = 0;
  for (std::size_t i = 0; i < bytes; ++i) n += !mask[i] && base[i] != 0;
  return n;
}

class padding_ranks : public ::testing::TestWithParam<int> {};

TEST_P(padding_ranks, shards_gathered_blocks_and_gradient_shards_hold_zero_padding) {
  const int ranks = GetParam();
  std::atomic<std::size_t> partitioned_elements{0};
  std::atomic<std::size_t> unit_gradients{0};  // gradient-shard elements equal to `ranks` (the sum of ones)
  std::atomic<std::size_t> nonzero_gradients{0};
  run_ranks(ranks, 10s, [&](rank_env& env) {
    dirty(*env.persistent, 256 * KiB, 8);  // the caching policy's small pool (2 MiB segments)
    dirty(*env.persistent, 4 * MiB, 1);    // and its large pool
    block_manager m(small_model(3), small_options(), *env.comm, *env.persistent, *env.transient);
    load_parameters(m);
    const model_layout& layout = m.layout();
    const auto* shards = static_cast<const unsigned char*>(m.shard_buffer().data);
    std::vector<byte_range> held;
    for (std::size_t b = 0; b < layout.blocks.size(); ++b) {
      for (std::size_t p = 0; p < layout.blocks[b].parameters.size(); ++p) {
        if (layout.blocks[b].parameters[p].persistent) continue;
        const block_manager::parameter_part part = m.shard_of(b, p);
        if (part.data.data != nullptr) {
          held.push_back(
              {static_cast<std::size_t>(static_cast<const unsigned char*>(part.data.data) - shards), part.data.bytes});
        }
      }
    }
    EXPECT_EQ(dirty_padding(shards, layout.shard_bytes, held), 0U) << "shard padding, rank " << env.comm->rank();

    const stream_t compute = env.backend.create_stream();
    for (std::size_t b = m.block_count(); b-- > 0;) {  // backward order: buckets are reused by other blocks
      const std::span<const view> params = m.fetch(b, compute);
      const block_layout& l = layout.blocks[b];
      if (l.gathered_bytes > 0) {
        std::vector<byte_range> in_block;
        for (const parameter_layout& p : l.parameters) {
          if (!p.persistent) in_block.push_back({p.offset, p.bytes()});
        }
        const auto* gathered = [&] {
          for (std::size_t p = 0; p < l.parameters.size(); ++p) {
            if (!l.parameters[p].persistent)
              return static_cast<const unsigned char*>(params[p].data) - l.parameters[p].offset;
          }
          return static_cast<const unsigned char*>(nullptr);
        }();
        EXPECT_EQ(dirty_padding(gathered, l.gathered_bytes, in_block), 0U) << "gathered " << l.name;
      }
      const std::span<const view> grads = m.begin_gradients(b, compute);
      for (std::size_t p = 0; p < grads.size(); ++p) {
        const parameter_layout& param = l.parameters[p];
        if (!param.trainable) continue;
        if (!param.persistent && env.comm->rank() == 0) partitioned_elements += param.elements;
        for (std::size_t i = 0; i < param.elements; ++i) {
          const float one = 1.0F;
          std::memcpy(static_cast<unsigned char*>(grads[p].data) + 4 * i, &one, 4);
        }
      }
      m.reduce_gradients(b, compute);
      m.release(b, compute);
    }
    m.finish_gradients(compute);
    env.backend.synchronize_stream(compute);
    for (std::size_t b = 0; b < m.block_count(); ++b) {
      const view g = m.gradient_shard(b);
      for (std::size_t i = 0; i < g.bytes / 4; ++i) {
        float v = 0;
        std::memcpy(&v, static_cast<const unsigned char*>(g.data) + 4 * i, 4);
        unit_gradients += v == static_cast<float>(ranks);
        nonzero_gradients += v != 0;
      }
    }
    m.end_step(compute);
    env.backend.destroy_stream(compute);
  });
  // Every rank wrote 1 into every gradient: the sum over ranks is `ranks` in
  // each partitioned element and zero in the padding, so the squared norm over
  // the shards, ranks^2 x nonzero, is the unsharded one, ranks^2 x elements.
  EXPECT_GT(partitioned_elements.load(), 0U);
  EXPECT_EQ(unit_gradients.load(), partitioned_elements.load());
  EXPECT_EQ(nonzero_gradients.load(), partitioned_elements.load());
}

INSTANTIATE_TEST_SUITE_P(ranks, padding_ranks, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& p) { return std::to_string(p.param) + "_ranks"; });

TEST(bucket_padding, covers_the_bucket_outside_the_trainable_partitioned_gradients) {
  for (int ranks : {1, 3}) {
    const model_layout l = make_layout(small_model(2), ranks, 64, 512, 4);
    for (std::size_t b = 0; b < l.blocks.size(); ++b) {
      std::vector<byte_range> parts = bucket_padding(l, b);
      for (const parameter_layout& p : l.blocks[b].parameters) {
        if (p.trainable && !p.persistent) parts.push_back({p.gradient_offset, p.elements * 4});
      }
      std::sort(parts.begin(), parts.end(), [](const auto& x, const auto& y) { return x.offset < y.offset; });
      std::size_t cursor = 0;
      for (const byte_range& r : parts) {
        EXPECT_EQ(r.offset, cursor) << l.blocks[b].name << ", " << ranks << " ranks";
        EXPECT_GT(r.bytes, 0U);
        cursor = r.offset + r.bytes;
      }
      EXPECT_EQ(cursor, l.blocks[b].bucket_bytes) << l.blocks[b].name;
    }
  }
  EXPECT_THROW((void)bucket_padding(make_layout(small_model(1), 1, 64, 512, 4), 9), invalid_argument);
}

}  // namespace
}  // namespace fragctl::zero3
