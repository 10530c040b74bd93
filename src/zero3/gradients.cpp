// Block manager, gradient half: two contiguous reduce buckets taken in turn,
// reduce-scattered into each block's gradient slice on the communication
// stream, and the persistent gradients summed across ranks once per step.
// A block's slice is allocated at its first reduce after construction or
// release_gradients, so gradients exist from backward to release, not
// during forward (FSDP2's lifetime).
//
// Ordering, all on the device: the user's stream waits for a bucket's
// previous reduce-scatter before refilling it (the bucket's `reduced` event);
// the communication stream waits for the filling stream before reducing; the
// stream given to finish_gradients waits for the communication stream.
// Slices are allocated on the reducing stream (the communication stream then
// waits for it) and freed on the releasing stream (after it waits for the
// communication stream), so an allocator shared with that stream's other
// users reuses them in stream order, without a host wait.
#include <algorithm>

#include "fmt/format.h"
#include "zero3/manager_state.hpp"

namespace fragctl::zero3 {

std::span<const view> block_manager::begin_gradients(std::size_t block, stream_t stream) {
  impl& m = *impl_;
  m.check_block(block, "begin_gradients");
  m.comm.check();
  impl::block_runtime& rt = m.blocks[block];
  if (rt.bucket >= 0) {
    throw invalid_argument(fmt::format("zero3 rank {}: {} already holds a reduce bucket", m.comm.rank(), m.tag(block)));
  }
  int k = m.next_bucket;
  if (m.buckets[static_cast<std::size_t>(k)].holder >= 0) k = 1 - k;
  impl::bucket& bucket = m.buckets[static_cast<std::size_t>(k)];
  if (bucket.holder >= 0) {
    throw invalid_argument(fmt::format(
        "zero3 rank {}: begin_gradients({}) while {} and {} hold both reduce buckets; reduce one first",
        m.comm.rank(), m.tag(block), m.tag(static_cast<std::size_t>(m.buckets[0].holder)),
        m.tag(static_cast<std::size_t>(m.buckets[1].holder))));
  }
  const block_layout& l = m.layout.blocks[block];
  if (l.bucket_bytes > 0) m.backend.wait_event(stream, bucket.reduced);
  for (const byte_range& r : m.bucket_padding[block]) m.zero(bucket.data, r, stream);
  bucket.holder = static_cast<int>(block);
  rt.bucket = k;
  m.next_bucket = 1 - k;

  const std::size_t element = m.layout.gradient_element_bytes;
  rt.gradient_views.resize(l.parameters.size());
  for (std::size_t i = 0; i < l.parameters.size(); ++i) {
    const parameter_layout& p = l.parameters[i];
    if (!p.trainable) {
      rt.gradient_views[i] = {};
      continue;
    }
    void* base = p.persistent ? m.persistent_gradients : bucket.data;
    rt.gradient_views[i] = {static_cast<unsigned char*>(base) + p.gradient_offset, p.elements * element};
  }
  return rt.gradient_views;
}

void block_manager::reduce_gradients(std::size_t block, stream_t stream) {
  impl& m = *impl_;
  m.check_block(block, "reduce_gradients");
  impl::block_runtime& rt = m.blocks[block];
  if (rt.bucket < 0) {
    throw invalid_argument(
        fmt::format("zero3 rank {}: reduce_gradients({}) without begin_gradients", m.comm.rank(), m.tag(block)));
  }
  impl::bucket& bucket = m.buckets[static_cast<std::size_t>(rt.bucket)];
  const block_layout& l = m.layout.blocks[block];
  if (l.bucket_bytes > 0) {
    void* slice = m.gradient_slice(block, stream);
    m.comm_waits_for(stream);
    const scatter_part part{bucket.data, slice, l.gradient_shard_bytes / m.layout.gradient_element_bytes};
    m.comm.reduce_scatter(std::span<const scatter_part>(&part, 1), m.opts.gradient_type, m.comm_stream,
                          m.tag(block));
    m.backend.record_event(bucket.reduced, m.comm_stream);
    ++m.counters.reduce_scatters;
    m.counters.reduce_scatter_bytes += l.bucket_bytes;
    m.step_reduce_scatter_bytes += l.bucket_bytes;
  }
  bucket.holder = -1;
  rt.bucket = -1;
  for (view& v : rt.gradient_views) v = {};
}

void* block_manager::impl::gradient_slice(std::size_t block, stream_t stream) {
  block_runtime& rt = blocks[block];
  if (rt.gradient == nullptr) {
    const std::size_t bytes = layout.blocks[block].gradient_shard_bytes;
    rt.gradient = persistent.allocate(bytes, stream);
    gradient_live += bytes;
    gradient_peak = std::max(gradient_peak, gradient_live);
  }
  return rt.gradient;
}

void block_manager::impl::free_gradient_slices(stream_t stream) noexcept {
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    if (blocks[b].gradient == nullptr) continue;
    persistent.deallocate(blocks[b].gradient, layout.blocks[b].gradient_shard_bytes, stream);
    blocks[b].gradient = nullptr;
  }
  gradient_live = 0;
}

void block_manager::impl::check_no_bucket_held(const char* call) const {
  for (const bucket& b : buckets) {
    if (b.holder >= 0) {
      throw invalid_argument(fmt::format(
          "zero3 rank {}: {} while {} holds a reduce bucket (its reduce_gradients has not been called); call "
          "reduce_gradients first",
          comm.rank(), call, tag(static_cast<std::size_t>(b.holder))));
    }
  }
}

void block_manager::release_gradients(stream_t stream) {
  impl& m = *impl_;
  m.comm.check();
  m.check_no_bucket_held("release_gradients");
  if (m.gradient_live == 0) return;
  m.waits_for_comm(stream);  // the reduces wrote the slices on the comm stream
  m.free_gradient_slices(stream);
}

void block_manager::finish_gradients(stream_t stream) {
  impl& m = *impl_;
  m.check_no_bucket_held("finish_gradients");
  m.comm.check();
  const std::size_t bytes = m.layout.persistent_gradient_bytes;
  if (bytes > 0) {
    m.comm_waits_for(stream);
    const std::size_t element = m.layout.gradient_element_bytes;
    const std::size_t segment = bytes / static_cast<std::size_t>(m.comm.size());
    auto* base = static_cast<unsigned char*>(m.persistent_gradients);
    unsigned char* mine = base + static_cast<std::size_t>(m.comm.rank()) * segment;
    const scatter_part rs{base, mine, segment / element};
    m.comm.reduce_scatter(std::span<const scatter_part>(&rs, 1), m.opts.gradient_type, m.comm_stream,
                          "persistent gradients");
    const gather_part ag{mine, base, segment};
    m.comm.all_gather(std::span<const gather_part>(&ag, 1), m.comm_stream, "persistent gradients");
    ++m.counters.reduce_scatters;
    m.counters.reduce_scatter_bytes += bytes;
    m.step_reduce_scatter_bytes += bytes;
  }
  if (stream != m.comm_stream) {
    m.backend.record_event(m.scratch_event, m.comm_stream);
    m.backend.wait_event(stream, m.scratch_event);
  }
}

}  // namespace fragctl::zero3
