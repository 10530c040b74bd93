// ZeRO-3 layout: the offsets of fragctl/zero3/layout.hpp, computed once.
#include "fragctl/zero3/layout.hpp"

#include <algorithm>
#include <bit>

#include "absl/container/flat_hash_set.h"
#include "fmt/format.h"
#include "fragctl/device_allocator.hpp"
#include "fragctl/error.hpp"
#include "fragctl/types.hpp"

namespace fragctl::zero3 {

namespace {

// Limits that keep the layout's arithmetic within 64 bits: a model's
// parameters hold at most max_request_bytes (2^62, every size option's
// limit too); with 1 GiB alignment and 2^31 ranks, the padding of up to 2^31
// parameters stays below 2^61 more.
constexpr std::size_t max_model_bytes = max_request_bytes;

bool valid_element_size(std::size_t n) { return n == 1 || n == 2 || n == 4 || n == 8; }

// Rounds up to a multiple of `m`, which need not be a power of two (ranks x alignment).
std::size_t round_up_multiple(std::size_t n, std::size_t m) { return (n + m - 1) / m * m; }

void check_arguments(std::span<const block_spec> blocks, int ranks, std::size_t alignment,
                     std::size_t gradient_element_bytes) {
  if (blocks.empty()) throw invalid_argument("zero3: no blocks registered");
  if (ranks < 1) throw invalid_argument(fmt::format("zero3: world size {} is not positive", ranks));
  if (alignment < min_alignment || !std::has_single_bit(alignment) || alignment % 8 != 0 || alignment > max_alignment) {
    throw invalid_argument(fmt::format("zero3: alignment {} is not a power of two from {} bytes to 1 GiB", alignment,
                                       min_alignment));
  }
  if (gradient_element_bytes != 2 && gradient_element_bytes != 4) {
    throw invalid_argument(
        fmt::format("zero3: gradient element size {} is not 2 (bf16/fp16) or 4 (fp32)", gradient_element_bytes));
  }
  absl::flat_hash_set<std::string> names;
  std::size_t model_bytes = 0;
  for (const block_spec& b : blocks) {
    if (b.parameters.empty()) throw invalid_argument(fmt::format("zero3: block '{}' has no parameters", b.name));
    if (!names.insert(b.name).second) throw invalid_argument(fmt::format("zero3: two blocks are named '{}'", b.name));
    for (const parameter_spec& p : b.parameters) {
      if (p.elements == 0) {
        throw invalid_argument(fmt::format("zero3: parameter '{}' of block '{}' has no elements", p.name, b.name));
      }
      if (!valid_element_size(p.element_bytes)) {
        throw invalid_argument(fmt::format("zero3: parameter '{}' of block '{}': element size {} is not 1, 2, 4 or 8",
                                           p.name, b.name, p.element_bytes));
      }
      // Every size the layout derives (shards, gradients, padding) stays far
      // from wrapping: a parameter of 2^63 + 1 two-byte elements had a
      // 2-byte view.
      if (p.elements > max_model_bytes / 8 || (model_bytes += p.elements * p.element_bytes) > max_model_bytes) {
        throw invalid_argument(fmt::format(
            "zero3: parameter '{}' of block '{}': {} elements of {} bytes; a model's parameters hold at most 2^62 "
            "bytes (2^59 elements each)",
            p.name, b.name, p.elements, p.element_bytes));
      }
    }
  }
}

// Lays out the partitioned parameters of one group and returns its used size.
// `unit` is the size offsets are counted in (the element size for T, 1 for F).
std::size_t place_group(block_layout& block, bool trainable, std::size_t unit, std::size_t alignment,
                        std::size_t gradient_element_bytes) {
  const std::size_t align_units = alignment / unit;
  std::size_t cursor = 0;  // in units
  for (parameter_layout& p : block.parameters) {
    if (p.persistent || p.trainable != trainable) continue;
    cursor = round_up(cursor, align_units);
    p.offset = cursor * unit;  // relative to the group; the caller adds the group's offset
    if (trainable) p.gradient_offset = cursor * gradient_element_bytes;
    cursor += p.bytes() / unit;
  }
  return cursor * unit;
}

}  // namespace

model_layout make_layout(std::span<const block_spec> blocks, int ranks, std::size_t persistence_threshold,
                         std::size_t alignment, std::size_t gradient_element_bytes) {
  check_arguments(blocks, ranks, alignment, gradient_element_bytes);
  model_layout m;
  m.ranks = ranks;
  m.alignment = alignment;
  m.gradient_element_bytes = gradient_element_bytes;
  m.persistence_threshold = persistence_threshold;
  const auto n = static_cast<std::size_t>(ranks);
  std::size_t persistent_gradient_used = 0;

  for (const block_spec& spec : blocks) {
    block_layout b;
    b.name = spec.name;
    for (const parameter_spec& p : spec.parameters) {
      parameter_layout l;
      l.name = p.name;
      l.elements = p.elements;
      l.element_bytes = p.element_bytes;
      l.trainable = p.trainable;
      l.persistent = p.elements < persistence_threshold;
      if (l.trainable && !l.persistent) {
        if (b.trainable_element_bytes != 0 && b.trainable_element_bytes != l.element_bytes) {
          throw invalid_argument(fmt::format(
              "zero3: block '{}' mixes trainable parameters of {} and {} bytes per element ('{}'); the gradient "
              "shard maps element for element onto the parameter shard, so they must share one size",
              b.name, b.trainable_element_bytes, l.element_bytes, l.name));
        }
        b.trainable_element_bytes = l.element_bytes;
      }
      m.parameter_elements += l.elements;
      if (l.trainable) m.trainable_elements += l.elements;
      if (l.persistent) {
        m.persistent_elements += l.elements;
        l.offset = round_up(m.persistent_bytes, alignment);
        m.persistent_bytes = l.offset + l.bytes();
        if (l.trainable) {
          l.gradient_offset = round_up(persistent_gradient_used, alignment);
          persistent_gradient_used = l.gradient_offset + l.elements * gradient_element_bytes;
        }
      }
      b.parameters.push_back(std::move(l));
    }

    // T in elements, F in bytes; each padded so it splits into aligned slices.
    const std::size_t t_unit = b.trainable_element_bytes == 0 ? 1 : b.trainable_element_bytes;
    b.trainable.used_bytes = place_group(b, true, t_unit, alignment, gradient_element_bytes);
    b.frozen.used_bytes = place_group(b, false, 1, alignment, gradient_element_bytes);
    b.trainable.shard_bytes = round_up_multiple(b.trainable.used_bytes, n * alignment) / n;
    b.frozen.shard_bytes = round_up_multiple(b.frozen.used_bytes, n * alignment) / n;
    b.trainable.gathered_offset = 0;
    b.frozen.gathered_offset = b.trainable.shard_bytes * n;
    for (parameter_layout& p : b.parameters) {
      if (!p.persistent && !p.trainable) p.offset += b.frozen.gathered_offset;
    }
    b.shard_bytes = b.trainable.shard_bytes + b.frozen.shard_bytes;
    b.gathered_bytes = b.shard_bytes * n;
    b.shard_offset = m.shard_bytes;
    m.shard_bytes += b.shard_bytes;
    b.gradient_shard_bytes = b.trainable_shard_elements() * gradient_element_bytes;
    b.gradient_shard_offset = m.gradient_shard_bytes;
    m.gradient_shard_bytes += b.gradient_shard_bytes;
    b.bucket_bytes = b.gradient_shard_bytes * n;
    m.trainable_shard_elements += b.trainable_shard_elements();
    m.max_gathered_bytes = std::max(m.max_gathered_bytes, b.gathered_bytes);
    m.max_bucket_bytes = std::max(m.max_bucket_bytes, b.bucket_bytes);
    m.blocks.push_back(std::move(b));
  }
  m.persistent_bytes = round_up(m.persistent_bytes, alignment);
  m.persistent_gradient_bytes = round_up_multiple(persistent_gradient_used, n * alignment);
  return m;
}

std::vector<byte_range> bucket_padding(const model_layout& layout, std::size_t block) {
  if (block >= layout.blocks.size()) {
    throw invalid_argument(fmt::format("zero3: block {} out of range ({} blocks)", block, layout.blocks.size()));
  }
  const block_layout& b = layout.blocks[block];
  std::vector<byte_range> out;
  std::size_t cursor = 0;  // end of the last gradient placed; place_group placed them in increasing order
  auto gap_to = [&](std::size_t end) {
    if (end > cursor) out.push_back({cursor, end - cursor});
  };
  for (const parameter_layout& p : b.parameters) {
    if (p.persistent || !p.trainable) continue;
    gap_to(p.gradient_offset);
    cursor = p.gradient_offset + p.elements * layout.gradient_element_bytes;
  }
  gap_to(b.bucket_bytes);
  return out;
}

parameter_slice slice_of(const model_layout& layout, std::size_t block, std::size_t param, int rank) {
  if (block >= layout.blocks.size()) {
    throw invalid_argument(fmt::format("zero3: block {} out of range ({} blocks)", block, layout.blocks.size()));
  }
  const block_layout& b = layout.blocks[block];
  if (param >= b.parameters.size()) {
    throw invalid_argument(
        fmt::format("zero3: parameter {} out of range (block '{}' has {})", param, b.name, b.parameters.size()));
  }
  if (rank < 0 || rank >= layout.ranks) {
    throw invalid_argument(fmt::format("zero3: rank {} out of range (world size {})", rank, layout.ranks));
  }
  const parameter_layout& p = b.parameters[param];
  if (p.persistent) {
    throw invalid_argument(fmt::format("zero3: parameter '{}' of block '{}' is persistent (whole on every rank)",
                                       p.name, b.name));
  }
  const sharded_group& g = p.trainable ? b.trainable : b.frozen;
  const std::size_t shard_in_block = p.trainable ? 0 : b.trainable.shard_bytes;
  const std::size_t lo = g.gathered_offset + static_cast<std::size_t>(rank) * g.shard_bytes;
  const std::size_t hi = lo + g.shard_bytes;
  const std::size_t first = std::max(lo, p.offset);
  const std::size_t last = std::min(hi, p.offset + p.bytes());
  parameter_slice s;
  if (first >= last) return s;
  s.parameter_offset = first - p.offset;
  s.bytes = last - first;
  s.shard_offset = b.shard_offset + shard_in_block + (first - lo);
  return s;
}

}  // namespace fragctl::zero3
