// Options of the ZeRO-3 block manager, with the names DeepSpeed users know.
//
// DeepSpeed counts parameters (elements); the manager budgets bytes. The
// DeepSpeed-named keys of parse_options take element counts and convert them
// with `element_bytes` (2 for bf16/fp16), so a DeepSpeed config carries over:
//
//   stage3_prefetch_bucket_size        5e7 elements -> prefetch_bytes  = 1e8 bytes
//   stage3_max_live_parameters         1e9 elements -> max_live_bytes  = 2e9 bytes
//   stage3_param_persistence_threshold 1e5 elements -> persistence_threshold
//
// docs/zero3.md has one row per key.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "fragctl/config.hpp"
#include "fragctl/zero3/communicator.hpp"

namespace fragctl::zero3 {

/// Bytes per element of the DeepSpeed counts (bf16/fp16) unless parse_options
/// is given element_bytes.
inline constexpr std::size_t default_element_bytes = 2;

/// DeepSpeed's defaults, in its units (elements).
inline constexpr std::size_t deepspeed_prefetch_bucket_size = 50'000'000;
inline constexpr std::size_t deepspeed_max_live_parameters = 1'000'000'000;
inline constexpr std::size_t deepspeed_param_persistence_threshold = 100'000;
/// DeepSpeed's reduce_bucket_size: the most trainable elements above the
/// persistence threshold one block may have (fragctl.torch.zero3 checks it;
/// one block's gradients fill one reduce bucket).
inline constexpr std::size_t deepspeed_reduce_bucket_size = 500'000'000;

struct options {
  /// Bytes of blocks gathered ahead of use (DeepSpeed stage3_prefetch_bucket_size
  /// x element size). 0 turns prefetching off.
  std::size_t prefetch_bytes = deepspeed_prefetch_bucket_size * default_element_bytes;
  /// Hard cap on gathered bytes live at once, counted at the transient
  /// allocator's allocation_size (DeepSpeed stage3_max_live_parameters x element size).
  std::size_t max_live_bytes = deepspeed_max_live_parameters * default_element_bytes;
  /// Parameters with fewer elements stay whole on every rank
  /// (stage3_param_persistence_threshold).
  std::size_t persistence_threshold = deepspeed_param_persistence_threshold;
  /// Alignment of every parameter, shard and gradient view (a power of two, >= 512).
  std::size_t alignment = 512;
  /// Element type of gradients in the reduce bucket and the gradient shard:
  /// bf16/fp16, or fp32 to reduce (sum across ranks) in fp32.
  data_type gradient_type = data_type::bfloat16;
  /// Record the fetch order of the first step and prefetch along it afterwards.
  bool prefetch = true;

  bool operator==(const options&) const = default;
};

/// One documented key of parse_options: the same row as a FRAGCTL_CONF
/// option's, its default_value formatted from a default-constructed options.
using option_row = fragctl::option_info;

/// Every key parse_options accepts, in documentation order.
[[nodiscard]] const std::vector<option_row>& option_rows();

/// Applies "key:value,key:value" on top of `base`. Keys: the DeepSpeed names
/// (element counts such as 5e7, converted with element_bytes), and
/// prefetch_bytes / max_live_bytes (sizes: "100MB", "2GiB"), alignment,
/// gradient_type, prefetch, element_bytes (applies to the DeepSpeed keys that
/// follow it). Errors name the key and what it accepts.
[[nodiscard]] absl::StatusOr<options> parse_options(std::string_view text, options base = {});

}  // namespace fragctl::zero3
