// ZeRO-3 partitioning: where every parameter, shard and gradient lives.
//
// A model is registered as blocks (usually one per layer) of parameters, in
// execution order. Each block is laid out once, the same way on every rank:
//
//   gathered buffer of a block  = [ T: trainable partitioned | F: frozen partitioned ]
//   shard of rank r             = [ T slice r                | F slice r            ]
//
// T and F are each one flat, padded group split into `ranks` equal slices;
// slice r of a group is the bytes [r * shard, (r + 1) * shard) of that group
// in the gathered buffer, so one all-gather per group rebuilds the block with
// no copy. Parameters sit at offsets aligned to `alignment` bytes; each
// group's total is padded to ranks * alignment, so every shard is aligned too.
//
// T is laid out in elements (all trainable partitioned parameters of a block
// share one element size): its gradients use the same element offsets in the
// gradient element type, so the gradient shard of rank r, the fp32 master
// shard an optimizer keeps and the T slice of the parameter shard describe the
// same elements, and the optimizer step is local. F has no gradient and no
// optimizer-facing buffer.
//
// Parameters with fewer elements than the persistence threshold are
// *persistent*: stored whole on every rank, never gathered or released. Their
// gradients (trainable ones) sit in one flat replicated buffer summed across
// ranks once per step (reduce-scatter then all-gather, i.e. an all-reduce),
// so each rank updates them identically, as data parallelism does.
#pragma once

#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace fragctl::zero3 {

/// One parameter as the user registers it.
struct parameter_spec {
  std::string name;
  std::size_t elements = 0;       ///< number of elements (> 0)
  std::size_t element_bytes = 2;  ///< 1, 2, 4 or 8 (2 for bf16/fp16)
  bool trainable = true;          ///< frozen parameters get no gradient
};

/// A group of parameters gathered and released together, e.g. one layer.
struct block_spec {
  std::string name;
  std::vector<parameter_spec> parameters;  ///< in execution order
};

inline constexpr std::size_t no_offset = std::numeric_limits<std::size_t>::max();

/// The largest alignment of parameters, shards and gradient views (the
/// `alignment` option): larger ones would let the layout's sizes wrap.
inline constexpr std::size_t max_alignment = std::size_t{1} << 30;

/// Where one parameter lives. Offsets are bytes.
struct parameter_layout {
  std::string name;
  std::size_t elements = 0;
  std::size_t element_bytes = 0;
  bool trainable = true;
  bool persistent = false;  ///< whole on every rank (below the persistence threshold)
  /// Partitioned: offset in the block's gathered buffer. Persistent: offset in
  /// the model's persistent parameter buffer.
  std::size_t offset = 0;
  /// Partitioned trainable: offset in the block's gradient bucket (the T
  /// region in the gradient element type). Persistent trainable: offset in the
  /// model's persistent gradient buffer. Frozen: no_offset.
  std::size_t gradient_offset = no_offset;

  [[nodiscard]] std::size_t bytes() const noexcept { return elements * element_bytes; }
};

/// One evenly split group of a block (T or F).
struct sharded_group {
  std::size_t gathered_offset = 0;  ///< where the group starts in the gathered buffer
  std::size_t shard_bytes = 0;      ///< bytes of the group each rank holds
  std::size_t used_bytes = 0;       ///< bytes holding parameters (the rest is padding)
};

struct block_layout {
  std::string name;
  std::vector<parameter_layout> parameters;  ///< in registration order
  sharded_group trainable;                   ///< T
  sharded_group frozen;                      ///< F
  std::size_t trainable_element_bytes = 0;   ///< element size of T (0 when T is empty)
  std::size_t gathered_bytes = 0;            ///< T + F gathered: ranks * shard_bytes
  std::size_t shard_bytes = 0;               ///< T + F slice one rank holds
  std::size_t shard_offset = 0;              ///< where this block's shard starts in the model shard buffer
  std::size_t gradient_shard_bytes = 0;      ///< T slice in the gradient element type
  std::size_t gradient_shard_offset = 0;     ///< where it starts in the model gradient shard buffer
  std::size_t bucket_bytes = 0;              ///< T gathered in the gradient element type

  /// Elements of the T slice each rank owns (= its fp32 master elements).
  [[nodiscard]] std::size_t trainable_shard_elements() const noexcept {
    return trainable_element_bytes == 0 ? 0 : trainable.shard_bytes / trainable_element_bytes;
  }
};

/// The whole model, for one world size.
struct model_layout {
  int ranks = 1;
  std::size_t alignment = 512;
  std::size_t gradient_element_bytes = 2;
  std::size_t persistence_threshold = 0;
  std::vector<block_layout> blocks;
  std::size_t shard_bytes = 0;                 ///< every block's shard, one buffer
  std::size_t gradient_shard_bytes = 0;        ///< every block's gradient shard, one buffer
  std::size_t persistent_bytes = 0;            ///< every persistent parameter, one buffer
  std::size_t persistent_gradient_bytes = 0;   ///< persistent trainable gradients, padded to ranks * alignment
  std::size_t max_gathered_bytes = 0;          ///< largest block's gathered buffer
  std::size_t max_bucket_bytes = 0;            ///< largest block's gradient bucket
  std::size_t parameter_elements = 0;          ///< every parameter (Psi in the ZeRO paper)
  std::size_t trainable_elements = 0;
  std::size_t persistent_elements = 0;
  std::size_t trainable_shard_elements = 0;    ///< sum of T slices this rank owns
};

/// Lays out `blocks` for `ranks` ranks. `persistence_threshold` is in elements
/// (a parameter with fewer elements stays whole); `alignment` is a power of two
/// of at least 512 bytes and a multiple of every element size; the gradient
/// element size is 2 or 4. Throws invalid_argument naming the block and
/// parameter for: no blocks, an empty block, duplicate block names, zero
/// elements, an element size other than 1/2/4/8, or trainable partitioned
/// parameters of one block with different element sizes.
[[nodiscard]] model_layout make_layout(std::span<const block_spec> blocks, int ranks,
                                       std::size_t persistence_threshold, std::size_t alignment,
                                       std::size_t gradient_element_bytes);

/// Bytes [offset, offset + bytes) of a buffer.
struct byte_range {
  std::size_t offset = 0;
  std::size_t bytes = 0;
};

/// The bytes of block `block`'s reduce bucket (its first bucket_bytes) that
/// hold no gradient: the alignment gaps between its trainable partitioned
/// parameters and the tail padding, in increasing order.
/// A reduce-scatter sums these bytes into the gradient shard's padding, so
/// they must be zero. Throws invalid_argument for a block out of range.
[[nodiscard]] std::vector<byte_range> bucket_padding(const model_layout& layout, std::size_t block);

/// The part of one partitioned parameter a rank holds in its shard.
struct parameter_slice {
  std::size_t parameter_offset = 0;  ///< first byte of the parameter in this slice
  std::size_t bytes = 0;             ///< 0 when the rank holds none of it
  std::size_t shard_offset = 0;      ///< where those bytes are in the model shard buffer
};

/// Which bytes of parameter `param` of block `block` rank `rank` holds. A
/// parameter may span several ranks' slices (the split is flat, like
/// DeepSpeed's and FSDP's). Persistent parameters are not sliced: throws
/// invalid_argument for them and for indices out of range.
[[nodiscard]] parameter_slice slice_of(const model_layout& layout, std::size_t block, std::size_t param,
                                       int rank);

}  // namespace fragctl::zero3
