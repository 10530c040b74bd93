// ZeRO-3 layout: shards are padded, aligned and cover the gathered buffer;
// persistent and frozen parameters are placed as specified; bad input is
// named.
#include <set>

#include "fragctl/error.hpp"
#include "fragctl/zero3/layout.hpp"
#include "gtest/gtest.h"
#include "zero3/zero3_harness.hpp"

namespace fragctl::zero3 {
namespace {

class layout_ranks : public ::testing::TestWithParam<int> {};

TEST_P(layout_ranks, shards_are_equal_aligned_and_tile_the_gathered_buffer) {
  const int ranks = GetParam();
  const auto blocks = testing::small_model(3);
  const model_layout l = make_layout(blocks, ranks, 64, 512, 4);
  ASSERT_EQ(l.blocks.size(), 5U);
  std::size_t shard_total = 0;
  for (const block_layout& b : l.blocks) {
    EXPECT_EQ(b.gathered_bytes, b.shard_bytes * static_cast<std::size_t>(ranks)) << b.name;
    EXPECT_EQ(b.trainable.shard_bytes % 512, 0U) << b.name;
    EXPECT_EQ(b.frozen.shard_bytes % 512, 0U) << b.name;
    EXPECT_EQ(b.shard_offset % 512, 0U) << b.name;
    EXPECT_EQ(b.shard_offset, shard_total);
    shard_total += b.shard_bytes;
    EXPECT_GE(b.trainable.shard_bytes * static_cast<std::size_t>(ranks), b.trainable.used_bytes);
    EXPECT_LT(b.trainable.shard_bytes * static_cast<std::size_t>(ranks), b.trainable.used_bytes + 512 * static_cast<std::size_t>(ranks));
    // Partitioned parameters: aligned, inside their group, not overlapping.
    std::set<std::pair<std::size_t, std::size_t>> spans;
    for (const parameter_layout& p : b.parameters) {
      if (p.persistent) continue;
      EXPECT_EQ(p.offset % 512, 0U) << p.name;
      const sharded_group& g = p.trainable ? b.trainable : b.frozen;
      EXPECT_GE(p.offset, g.gathered_offset);
      EXPECT_LE(p.offset + p.bytes(), g.gathered_offset + g.shard_bytes * static_cast<std::size_t>(ranks));
      for (const auto& [lo, hi] : spans) EXPECT_TRUE(p.offset >= hi || p.offset + p.bytes() <= lo) << p.name;
      spans.insert({p.offset, p.offset + p.bytes()});
    }
  }
  EXPECT_EQ(l.shard_bytes, shard_total);
}

TEST_P(layout_ranks, every_byte_of_a_parameter_is_held_by_exactly_one_rank) {
  const int ranks = GetParam();
  const auto blocks = testing::small_model(2);
  const model_layout l = make_layout(blocks, ranks, 64, 512, 2);
  for (std::size_t b = 0; b < l.blocks.size(); ++b) {
    for (std::size_t p = 0; p < l.blocks[b].parameters.size(); ++p) {
      const parameter_layout& param = l.blocks[b].parameters[p];
      if (param.persistent) {
        EXPECT_THROW((void)slice_of(l, b, p, 0), invalid_argument);
        continue;
      }
      std::vector<int> owners(param.bytes(), 0);
      for (int r = 0; r < ranks; ++r) {
        const parameter_slice s = slice_of(l, b, p, r);
        for (std::size_t i = 0; i < s.bytes; ++i) ++owners[s.parameter_offset + i];
        if (s.bytes > 0) {
          const block_layout& bl = l.blocks[b];
          EXPECT_GE(s.shard_offset, bl.shard_offset);
          EXPECT_LE(s.shard_offset + s.bytes, bl.shard_offset + bl.shard_bytes);
        }
      }
      for (int n : owners) ASSERT_EQ(n, 1) << param.name << " of " << l.blocks[b].name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ranks, layout_ranks, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& p) { return std::to_string(p.param) + "_ranks"; });

TEST(zero3_layout, persistence_threshold_and_frozen_parameters) {
  const auto blocks = testing::small_model(1);
  const model_layout l = make_layout(blocks, 2, 64, 512, 4);
  const block_layout& layer = l.blocks[1];
  ASSERT_EQ(layer.parameters.size(), 6U);
  EXPECT_TRUE(layer.parameters[0].persistent);   // norm1: 30 < 64 elements
  EXPECT_FALSE(layer.parameters[1].persistent);  // q
  EXPECT_TRUE(layer.parameters[5].persistent);   // norm2
  const parameter_layout& frozen = layer.parameters[3];
  EXPECT_FALSE(frozen.trainable);
  EXPECT_EQ(frozen.gradient_offset, no_offset);
  EXPECT_GE(frozen.offset, layer.frozen.gathered_offset);
  // The gradient shard covers the trainable slice only, in fp32.
  EXPECT_EQ(layer.gradient_shard_bytes, layer.trainable_shard_elements() * 4);
  EXPECT_EQ(layer.bucket_bytes, layer.gradient_shard_bytes * 2);
  EXPECT_EQ(layer.trainable_shard_elements() * 2, layer.trainable.shard_bytes);
  // Trainable gradients sit at the same element offsets as their parameters.
  for (const parameter_layout& p : layer.parameters) {
    if (p.trainable && !p.persistent) {
      EXPECT_EQ(p.gradient_offset / 4, p.offset / 2) << p.name;
    }
  }
  // Persistent: whole, aligned, outside the gathered buffer; trainable ones have gradients.
  EXPECT_EQ(layer.parameters[0].offset % 512, 0U);
  EXPECT_NE(layer.parameters[0].gradient_offset, no_offset);
  EXPECT_EQ(l.persistent_gradient_bytes % (2 * 512), 0U);
  EXPECT_EQ(l.parameter_elements, 1000U + (30 + 700 + 333 + 517 + 1234 + 31) + 40 + 999);
  EXPECT_EQ(l.persistent_elements, 30U + 31 + 40);
}

TEST(zero3_layout, a_block_of_frozen_or_persistent_parameters_has_no_bucket) {
  const std::vector<block_spec> blocks = {{"frozen", {{"w", 4096, 2, false}}}, {"norm", {{"g", 10, 2, true}}}};
  const model_layout l = make_layout(blocks, 3, 64, 512, 2);
  EXPECT_EQ(l.blocks[0].bucket_bytes, 0U);
  EXPECT_EQ(l.blocks[0].gradient_shard_bytes, 0U);
  EXPECT_GT(l.blocks[0].gathered_bytes, 0U);
  EXPECT_EQ(l.blocks[1].gathered_bytes, 0U);
  EXPECT_EQ(l.persistent_gradient_bytes, 3U * 512);
}

TEST(zero3_layout, bad_input_names_block_and_parameter) {
  const auto message = [](const std::vector<block_spec>& blocks) -> std::string {
    try {
      (void)make_layout(blocks, 2, 64, 512, 2);
    } catch (const invalid_argument& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(message({}).find("no blocks"), std::string::npos);
  EXPECT_NE(message({{"a", {}}}).find("block 'a' has no parameters"), std::string::npos);
  EXPECT_NE(message({{"a", {{"w", 10, 2, true}}}, {"a", {{"w", 10, 2, true}}}}).find("two blocks are named 'a'"),
            std::string::npos);
  EXPECT_NE(message({{"a", {{"w", 0, 2, true}}}}).find("parameter 'w' of block 'a' has no elements"),
            std::string::npos);
  EXPECT_NE(message({{"a", {{"w", 10, 3, true}}}}).find("element size 3"), std::string::npos);
  EXPECT_NE(message({{"a", {{"w", 1000, 2, true}, {"v", 1000, 4, true}}}}).find("mixes trainable parameters"),
            std::string::npos);
  EXPECT_THROW((void)make_layout(testing::small_model(1), 2, 64, 256, 2), invalid_argument);
  EXPECT_THROW((void)make_layout(testing::small_model(1), 2, 64, 512, 8), invalid_argument);
  EXPECT_THROW((void)make_layout(testing::small_model(1), 0, 64, 512, 2), invalid_argument);
}

// Regression (red team): sizes that wrap 64 bits were laid out: a parameter
// of 2^63 + 1 two-byte elements got a 2-byte view, one of SIZE_MAX elements
// a null one. Each is refused naming the parameter; the largest model the
// limit allows is laid out.
TEST(zero3_layout, parameters_whose_bytes_wrap_are_refused_naming_them) {
  const auto message = [](const std::vector<block_spec>& blocks, std::size_t alignment = 512) -> std::string {
    try {
      (void)make_layout(blocks, 2, 64, alignment, 2);
    } catch (const invalid_argument& e) {
      return e.what();
    }
    return "no error";
  };
  constexpr std::size_t two_62 = std::size_t{1} << 62;
  for (const auto& [elements, bytes] : {std::pair{(std::size_t{1} << 63) + 1, std::size_t{2}},
                                        std::pair{SIZE_MAX, std::size_t{1}}, std::pair{two_62 / 8 + 1, std::size_t{8}}}) {
    SCOPED_TRACE(elements);
    EXPECT_NE(message({{"a", {{"w", elements, bytes, true}}}}).find("parameter 'w' of block 'a'"), std::string::npos);
  }
  // Each parameter within the limit, the model beyond it.
  EXPECT_NE(message({{"a", {{"w", two_62 / 8, 8, false}}}, {"b", {{"v", 512, 2, false}}}}).find("parameter 'v'"),
            std::string::npos);
  EXPECT_NE(message({{"a", {{"w", 10, 2, true}}}}, std::size_t{1} << 31).find("alignment"), std::string::npos);
  // Control: 2^59 elements of 8 bytes (2^62 bytes), frozen, are laid out.
  const std::vector<block_spec> largest = {{"a", {{"w", two_62 / 8, 8, false}}}};
  const model_layout l = make_layout(largest, 2, 64, 512, 2);
  EXPECT_EQ(l.blocks[0].gathered_bytes, two_62);
}

}  // namespace
}  // namespace fragctl::zero3
