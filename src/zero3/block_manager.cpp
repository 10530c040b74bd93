// Block manager: construction, gather, release, prefetch along the recorded
// order, steps. The lifecycle and budget rules are stated in
// fragctl/zero3/block_manager.hpp; the gradient half is in gradients.cpp.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "fmt/format.h"
#include "fragctl/log.hpp"
#include "zero3/manager_state.hpp"

namespace fragctl::zero3 {

std::string_view to_string(block_state s) noexcept {
  switch (s) {
    case block_state::not_available: return "not_available";
    case block_state::in_flight: return "in_flight";
    case block_state::available: return "available";
  }
  return "?";
}

block_manager::impl::impl(std::span<const block_spec> specs, const options& o, communicator& c,
                          device_allocator& p, device_allocator& t)
    : opts(o), comm(c), persistent(p), transient(t), backend(p.backend()),
      layout(make_layout(specs, c.size(), o.persistence_threshold, o.alignment, size_of(o.gradient_type))) {
  // Two backend objects of one runtime and device (two C API handles) share
  // the device's streams and events; only another runtime or device cannot.
  if (t.backend().name() != backend.name() || t.backend().device() != backend.device()) {
    throw invalid_argument("zero3: the persistent and transient allocators must share one backend (one device)");
  }
  if (o.gradient_type == data_type::uint8) throw invalid_argument("zero3: gradient_type must be bf16, fp16 or fp32");
  if (o.max_live_bytes < transient.allocation_size(layout.max_gathered_bytes)) {
    throw invalid_argument(fmt::format(
        "zero3: max_live_bytes {} is smaller than the largest gathered block ({} bytes, block '{}'), which could "
        "never be fetched",
        o.max_live_bytes, transient.allocation_size(layout.max_gathered_bytes),
        std::max_element(layout.blocks.begin(), layout.blocks.end(), [](const auto& a, const auto& b) {
          return a.gathered_bytes < b.gathered_bytes;
        })->name));
  }
  counters.rank = c.rank();
  counters.world_size = c.size();
  counters.communicator = std::string(c.name());
  counters.max_live_bytes = o.max_live_bytes;
  counters.prefetch_bytes = o.prefetch_bytes;
  try {
    comm_stream = backend.create_stream();
    scratch_event = backend.create_event();
    shards = allocate_long_lived(layout.shard_bytes);
    persistent_parameters = allocate_long_lived(layout.persistent_bytes);
    persistent_gradients = allocate_long_lived(layout.persistent_gradient_bytes);
    for (bucket& b : buckets) {
      b.data = allocate_long_lived(layout.max_bucket_bytes);
      b.reduced = backend.create_event();
    }
    blocks.resize(layout.blocks.size());
    for (block_runtime& rt : blocks) rt.gathered = backend.create_event();
    zero_long_lived();
  } catch (...) {
    teardown();
    throw;
  }
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    if (layout.blocks[b].gathered_bytes == 0) refresh_views(b);  // persistent-only blocks: always available
  }
}

block_manager::impl::~impl() { teardown(); }

void block_manager::impl::teardown() noexcept {
  if (comm_stream != nullptr) {
    try {
      comm.synchronize();
    } catch (const std::exception& e) {
      logger().warn("zero3: destroying the block manager after a failed collective: {}", e.what());
    }
    try {
      backend.synchronize_stream(comm_stream);
    } catch (const std::exception& e) {
      logger().warn("zero3: {}", e.what());
    }
  }
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    if (blocks[b].buffer != nullptr) transient.deallocate(blocks[b].buffer, layout.blocks[b].gathered_bytes, comm_stream);
    blocks[b].buffer = nullptr;
  }
  free_gradient_slices(nullptr);  // the comm stream is idle now
  // Every gathered buffer was freed on the comm stream: settle those frees
  // while the stream exists, so no allocator state refers to it afterwards.
  try {
    transient.release_cached();
  } catch (const std::exception& e) {
    logger().warn("zero3: releasing the gathered-block cache: {}", e.what());
  }
  try {
    persistent.release_cached();  // gradient slices freed on the comm stream by release_gradients
  } catch (const std::exception& e) {
    logger().warn("zero3: releasing the long-lived cache: {}", e.what());
  }
  free_long_lived(shards, layout.shard_bytes);
  free_long_lived(persistent_parameters, layout.persistent_bytes);
  free_long_lived(persistent_gradients, layout.persistent_gradient_bytes);
  for (bucket& b : buckets) free_long_lived(b.data, layout.max_bucket_bytes);
  if (zeros != nullptr) backend.free_host(zeros, zeros_bytes);
  zeros = nullptr;
  try {
    for (block_runtime& rt : blocks) {
      if (rt.gathered != nullptr) backend.destroy_event(rt.gathered);
      rt.gathered = nullptr;
    }
    for (bucket& b : buckets) {
      if (b.reduced != nullptr) backend.destroy_event(b.reduced);
      b.reduced = nullptr;
    }
    if (scratch_event != nullptr) backend.destroy_event(scratch_event);
    scratch_event = nullptr;
    if (comm_stream != nullptr) backend.destroy_stream(comm_stream);
    comm_stream = nullptr;
  } catch (const std::exception& e) {
    logger().warn("zero3: releasing events and streams: {}", e.what());
  }
}

void block_manager::impl::zero_long_lived() {
  std::size_t longest = 0;
  for (std::size_t b = 0; b < layout.blocks.size(); ++b) {
    bucket_padding.push_back(zero3::bucket_padding(layout, b));
    for (const byte_range& r : bucket_padding.back()) longest = std::max(longest, r.bytes);
  }
  const std::size_t largest = std::max(
      {layout.shard_bytes, layout.persistent_bytes, layout.persistent_gradient_bytes});
  zeros_bytes = std::max(longest, std::min(largest, zero_chunk_bytes));
  if (zeros_bytes == 0) return;
  zeros = backend.allocate_host(zeros_bytes);
  if (zeros == nullptr) throw out_of_memory(oom_details{.requested = zeros_bytes}, "zero3 pinned host zeros");
  std::memset(zeros, 0, zeros_bytes);
  zero(shards, {0, layout.shard_bytes}, comm_stream);
  zero(persistent_parameters, {0, layout.persistent_bytes}, comm_stream);
  zero(persistent_gradients, {0, layout.persistent_gradient_bytes}, comm_stream);
  // The caller writes parameters into the shards on its own streams next.
  backend.synchronize_stream(comm_stream);
}

void block_manager::impl::zero(void* buffer, byte_range range, stream_t stream) {
  auto* base = static_cast<unsigned char*>(buffer) + range.offset;
  for (std::size_t done = 0; done < range.bytes; done += zeros_bytes) {
    backend.memcpy_async(base + done, zeros, std::min(zeros_bytes, range.bytes - done), stream);
  }
}

void* block_manager::impl::allocate_long_lived(std::size_t bytes) {
  return bytes == 0 ? nullptr : persistent.allocate(bytes, nullptr);
}

void block_manager::impl::free_long_lived(void*& ptr, std::size_t bytes) noexcept {
  if (ptr != nullptr) persistent.deallocate(ptr, bytes, nullptr);
  ptr = nullptr;
}

void block_manager::impl::check_block(std::size_t block, const char* call) const {
  if (block >= blocks.size()) {
    throw invalid_argument(fmt::format("zero3 {}: block {} out of range ({} blocks)", call, block, blocks.size()));
  }
}

std::string block_manager::impl::tag(std::size_t block) const {
  return fmt::format("block {} '{}'", block, layout.blocks[block].name);
}

void block_manager::impl::comm_waits_for(stream_t stream) {
  if (stream == comm_stream) return;
  backend.record_event(scratch_event, stream);
  backend.wait_event(comm_stream, scratch_event);
}

void block_manager::impl::waits_for_comm(stream_t stream) {
  if (stream == comm_stream) return;
  backend.record_event(scratch_event, comm_stream);
  backend.wait_event(stream, scratch_event);
}

void block_manager::impl::refresh_views(std::size_t block) {
  const block_layout& l = layout.blocks[block];
  block_runtime& rt = blocks[block];
  rt.views.resize(l.parameters.size());
  for (std::size_t i = 0; i < l.parameters.size(); ++i) {
    const parameter_layout& p = l.parameters[i];
    void* base = p.persistent ? persistent_parameters : rt.buffer;
    rt.views[i] = {base == nullptr ? nullptr : static_cast<unsigned char*>(base) + p.offset, p.bytes()};
  }
}

void block_manager::impl::gather(std::size_t block, bool prefetch, stream_t home) {
  const block_layout& l = layout.blocks[block];
  block_runtime& rt = blocks[block];
  const std::size_t charge = transient.allocation_size(l.gathered_bytes);
  rt.buffer = transient.allocate(l.gathered_bytes, home);
  rt.charged = charge;
  live += charge;
  peak = std::max(peak, live);
  auto* base = static_cast<unsigned char*>(rt.buffer);
  const auto* shard = static_cast<const unsigned char*>(shards) + l.shard_offset;
  gather_part parts[2];
  std::size_t n = 0;
  if (l.trainable.shard_bytes > 0) {
    parts[n++] = {shard, base + l.trainable.gathered_offset, l.trainable.shard_bytes};
  }
  if (l.frozen.shard_bytes > 0) {
    parts[n++] = {shard + l.trainable.shard_bytes, base + l.frozen.gathered_offset, l.frozen.shard_bytes};
  }
  try {
    comm_waits_for(home);  // the buffer may be memory `home` used until now
    comm.all_gather(std::span<const gather_part>(parts, n), comm_stream, tag(block));
    backend.record_event(rt.gathered, comm_stream);
  } catch (...) {
    transient.deallocate(rt.buffer, l.gathered_bytes, comm_stream);
    rt.buffer = nullptr;
    live -= charge;
    throw;
  }
  refresh_views(block);
  ++counters.gathers;
  ++step_gathers;
  counters.all_gather_bytes += l.gathered_bytes;
  step_all_gather_bytes += l.gathered_bytes;
  if (prefetch) {
    rt.prefetched = true;
    ahead += charge;
    ++counters.prefetches;
  }
}

void block_manager::impl::free_buffer(std::size_t block, stream_t stream) noexcept {
  block_runtime& rt = blocks[block];
  if (rt.buffer == nullptr) return;
  try {
    if (stream != comm_stream) backend.wait_event(stream, rt.gathered);  // a no-op after its fetch on `stream`
  } catch (const std::exception& e) {
    // The device wait could not be queued (a broken stream): keep the buffer
    // out of reuse rather than risk reusing memory the all-gather still writes.
    logger().error("zero3: releasing {}: {}; its buffer is not reused", tag(block), e.what());
    return;
  }
  transient.deallocate(rt.buffer, layout.blocks[block].gathered_bytes, stream);
  rt.buffer = nullptr;
  live -= rt.charged;
  if (rt.prefetched) {
    rt.prefetched = false;
    ahead -= rt.charged;
    ++counters.prefetch_dropped;
  }
  rt.charged = 0;
  for (view& v : rt.views) v = {};
}

void block_manager::impl::make_room(std::size_t block, std::size_t charge) {
  while (live + charge > opts.max_live_bytes) {
    // Drop the gathered-ahead block that would be used last.
    std::size_t victim = blocks.size();
    std::size_t victim_rank = 0;
    for (std::size_t b = 0; b < blocks.size(); ++b) {
      if (!blocks[b].prefetched || blocks[b].consumers > 0) continue;
      const auto at = std::find(trace.begin() + static_cast<std::ptrdiff_t>(std::min(cursor, trace.size())),
                                trace.end(), b);
      const auto distance = static_cast<std::size_t>(at - trace.begin());
      if (victim == blocks.size() || distance > victim_rank) {
        victim = b;
        victim_rank = distance;
      }
    }
    if (victim == blocks.size()) {
      std::string held;
      for (std::size_t b = 0; b < blocks.size(); ++b) {
        if (blocks[b].buffer != nullptr) held += fmt::format("{}{}", held.empty() ? "" : ", ", tag(b));
      }
      throw budget_error(fmt::format(
          "zero3 rank {}: fetch of {} needs {} gathered bytes, but max_live_bytes is {} and {} bytes are held by "
          "blocks in use ({}); release blocks earlier or raise max_live_bytes",
          comm.rank(), tag(block), charge, opts.max_live_bytes, live, held));
    }
    free_buffer(victim, comm_stream);  // gathered ahead, never fetched: its last use is the all-gather
  }
}

bool block_manager::impl::used_next(std::size_t block) const {
  // Not bounded by prefetch_bytes: keeping gathers nothing, and the bytes
  // are live already (max_live_bytes holds them either way).
  return opts.prefetch && opts.prefetch_bytes > 0 && !recording && cursor < trace.size() && trace[cursor] == block;
}

void block_manager::impl::keep_ahead(std::size_t block, stream_t stream) {
  block_runtime& rt = blocks[block];
  try {
    comm_waits_for(stream);
    backend.record_event(rt.gathered, comm_stream);
  } catch (...) {
    free_buffer(block, stream);
    throw;
  }
  rt.prefetched = true;
  ahead += rt.charged;
  ++counters.prefetch_kept;
}

void block_manager::impl::follow_trace(std::size_t block) {
  if (recording) {
    trace.push_back(block);
    return;
  }
  if (cursor < trace.size() && trace[cursor] == block) {
    ++cursor;
    return;
  }
  // Out of the recorded order: stop prefetching and record the order anew.
  ++counters.trace_misses;
  trace.resize(std::min(cursor, trace.size()));
  trace.push_back(block);
  recording = true;
}

void block_manager::impl::prefetch_ahead(stream_t home) {
  if (!opts.prefetch || opts.prefetch_bytes == 0 || recording) return;
  for (std::size_t i = cursor; i < trace.size() && ahead < opts.prefetch_bytes; ++i) {
    const std::size_t b = trace[i];
    if (blocks[b].buffer != nullptr || layout.blocks[b].gathered_bytes == 0) continue;
    const std::size_t charge = transient.allocation_size(layout.blocks[b].gathered_bytes);
    if (live + charge > opts.max_live_bytes) {
      ++counters.prefetch_deferred;
      return;  // issued at a later call, once a release made room
    }
    gather(b, true, home);
  }
}

// --- block_manager ----------------------------------------------------------------

block_manager::block_manager(std::span<const block_spec> blocks, const options& opts, communicator& comm,
                             device_allocator& persistent, device_allocator& transient)
    : impl_(std::make_unique<impl>(blocks, opts, comm, persistent, transient)) {
  impl_->gradients = std::make_unique<gradient_state>(*this);
}

block_manager::~block_manager() = default;

const model_layout& block_manager::layout() const noexcept { return impl_->layout; }
const options& block_manager::configuration() const noexcept { return impl_->opts; }
std::size_t block_manager::block_count() const noexcept { return impl_->blocks.size(); }
stream_t block_manager::comm_stream() const noexcept { return impl_->comm_stream; }

std::optional<std::size_t> block_manager::find_block(std::string_view name) const {
  for (std::size_t b = 0; b < impl_->layout.blocks.size(); ++b) {
    if (impl_->layout.blocks[b].name == name) return b;
  }
  return std::nullopt;
}

view block_manager::shard_buffer() const noexcept { return {impl_->shards, impl_->layout.shard_bytes}; }

block_manager::parameter_part block_manager::shard_of(std::size_t block, std::size_t param) const {
  impl_->check_block(block, "shard_of");
  const block_layout& l = impl_->layout.blocks[block];
  if (param < l.parameters.size() && l.parameters[param].persistent) {
    return {0, persistent_parameter(block, param)};
  }
  const parameter_slice s = slice_of(impl_->layout, block, param, impl_->comm.rank());
  if (s.bytes == 0) return {};
  return {s.parameter_offset, {static_cast<unsigned char*>(impl_->shards) + s.shard_offset, s.bytes}};
}

view block_manager::persistent_parameter(std::size_t block, std::size_t param) const {
  impl_->check_block(block, "persistent_parameter");
  const block_layout& l = impl_->layout.blocks[block];
  if (param >= l.parameters.size() || !l.parameters[param].persistent) {
    throw invalid_argument(fmt::format("zero3: parameter {} of block '{}' is not a persistent parameter", param, l.name));
  }
  const parameter_layout& p = l.parameters[param];
  return {static_cast<unsigned char*>(impl_->persistent_parameters) + p.offset, p.bytes()};
}

view block_manager::gradient_shard(std::size_t block) const {
  impl_->check_block(block, "gradient_shard");
  const block_layout& l = impl_->layout.blocks[block];
  if (l.gradient_shard_bytes == 0) return {};
  return {impl_->blocks[block].gradient, l.gradient_shard_bytes};
}

view block_manager::persistent_gradient(std::size_t block, std::size_t param) const {
  impl_->check_block(block, "persistent_gradient");
  const block_layout& l = impl_->layout.blocks[block];
  if (param >= l.parameters.size() || !l.parameters[param].persistent || !l.parameters[param].trainable) {
    throw invalid_argument(
        fmt::format("zero3: parameter {} of block '{}' is not a persistent trainable parameter", param, l.name));
  }
  const parameter_layout& p = l.parameters[param];
  return {static_cast<unsigned char*>(impl_->persistent_gradients) + p.gradient_offset,
          p.elements * impl_->layout.gradient_element_bytes};
}

std::span<const view> block_manager::fetch(std::size_t block, stream_t stream) {
  impl& m = *impl_;
  m.check_block(block, "fetch");
  m.comm.check();
  ++m.counters.fetches;
  m.follow_trace(block);
  impl::block_runtime& rt = m.blocks[block];
  const block_layout& l = m.layout.blocks[block];
  if (l.gathered_bytes > 0) {
    if (rt.buffer == nullptr) {
      const std::size_t charge = m.transient.allocation_size(l.gathered_bytes);
      m.make_room(block, charge);
      m.gather(block, false, stream);
    } else if (rt.prefetched) {
      ++m.counters.prefetch_hits;
      ++m.step_prefetch_hits;
    }
    if (rt.prefetched) {
      rt.prefetched = false;
      m.ahead -= rt.charged;
    }
    if (!m.backend.query_event(rt.gathered)) ++m.counters.pending_at_fetch;
    m.backend.wait_event(stream, rt.gathered);
  }
  ++rt.consumers;
  m.prefetch_ahead(stream);
  return rt.views;
}

void block_manager::release(std::size_t block, stream_t stream) {
  impl& m = *impl_;
  m.check_block(block, "release");
  impl::block_runtime& rt = m.blocks[block];
  if (rt.consumers == 0) {
    throw invalid_argument(fmt::format("zero3 rank {}: release of {}, which has no consumer (never fetched, or "
                                       "released already)",
                                       m.comm.rank(), m.tag(block)));
  }
  if (--rt.consumers == 0 && m.layout.blocks[block].gathered_bytes > 0) {
    if (m.used_next(block)) {
      m.keep_ahead(block, stream);
    } else {
      m.free_buffer(block, stream);
    }
  }
  m.prefetch_ahead(stream);
}

block_state block_manager::state(std::size_t block) {
  impl& m = *impl_;
  m.check_block(block, "state");
  if (m.layout.blocks[block].gathered_bytes == 0) return block_state::available;
  const impl::block_runtime& rt = m.blocks[block];
  if (rt.buffer == nullptr) return block_state::not_available;
  return m.backend.query_event(rt.gathered) ? block_state::available : block_state::in_flight;
}

int block_manager::consumers(std::size_t block) const {
  impl_->check_block(block, "consumers");
  return impl_->blocks[block].consumers;
}

view block_manager::gathered(std::size_t block) const {
  impl_->check_block(block, "gathered");
  const impl::block_runtime& rt = impl_->blocks[block];
  if (rt.buffer == nullptr) return {};
  return {rt.buffer, impl_->layout.blocks[block].gathered_bytes};
}

void block_manager::wait(std::size_t block) {
  impl& m = *impl_;
  m.check_block(block, "wait");
  if (m.layout.blocks[block].gathered_bytes == 0) return;
  if (m.blocks[block].buffer == nullptr) {
    throw invalid_argument(fmt::format("zero3: wait for {}, which is not gathered", m.tag(block)));
  }
  const auto started = std::chrono::steady_clock::now();
  m.backend.synchronize_event(m.blocks[block].gathered);
  m.wait_ns += static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started).count());
  m.comm.check();
}

void block_manager::end_step(stream_t stream) {
  impl& m = *impl_;
  for (std::size_t b = 0; b < m.blocks.size(); ++b) {
    if (m.blocks[b].consumers > 0) {
      throw invalid_argument(fmt::format("zero3 rank {}: end_step with {} still in use by {} consumer(s); release "
                                         "it first",
                                         m.comm.rank(), m.tag(b), m.blocks[b].consumers));
    }
    if (m.blocks[b].bucket >= 0) {
      throw invalid_argument(
          fmt::format("zero3 rank {}: end_step with {} holding a reduce bucket; call reduce_gradients first",
                      m.comm.rank(), m.tag(b)));
    }
  }
  for (std::size_t b = 0; b < m.blocks.size(); ++b) {
    if (m.blocks[b].prefetched) m.free_buffer(b, m.comm_stream);
  }
  m.comm_waits_for(stream);
  if (!m.trace.empty()) m.recording = false;
  m.cursor = 0;
  ++m.counters.steps;
  m.counters.last_step_all_gather_bytes = std::exchange(m.step_all_gather_bytes, 0);
  m.counters.last_step_reduce_scatter_bytes = std::exchange(m.step_reduce_scatter_bytes, 0);
  m.counters.last_step_gathers = std::exchange(m.step_gathers, 0);
  m.counters.last_step_prefetch_hits = std::exchange(m.step_prefetch_hits, 0);
  m.gradients->step_ended();
}

void block_manager::synchronize() {
  impl_->comm.synchronize();
  impl_->comm.check();
}

}  // namespace fragctl::zero3
