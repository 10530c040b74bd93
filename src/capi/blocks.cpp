// The C API's block and device queries and graph-pool calls (fragctl/fragctl.h):
// fragctl_block_info, fragctl_device_memory and its split, the attribution of
// device memory, fragctl_graph_pool_reclaim.
#include <cstdint>
#include <optional>

#include "capi/handle.hpp"
#include "core/json_io.hpp"
#include "core/stats_json.hpp"
#include "fmt/format.h"
#include "fragctl/allocator_stack.hpp"
#include "fragctl/backend.hpp"
#include "fragctl/device_memory.hpp"

using fragctl::capi::copy_out;
using fragctl::capi::fail;
using fragctl::capi::guarded;

extern "C" {

fragctl_status fragctl_block_info(fragctl_allocator* allocator, void* ptr, size_t* bytes, void** stream) {
  FRAGCTL_REQUIRE(allocator != nullptr && bytes != nullptr && stream != nullptr,
                  "fragctl_block_info: allocator, bytes or stream is NULL");
  FRAGCTL_NOT_IN_SPAN_CALLBACK(allocator, "fragctl_block_info");
  if (!allocator->stack->keeps_block_table()) {
    return fail(FRAGCTL_ERROR_STATE,
                fmt::format("fragctl_block_info: allocator {} keeps no live-block table (set block_table:true)",
                            allocator->stack->configuration().policy));
  }
  return guarded([&] {
    const std::optional<fragctl::block_record> block = allocator->stack->allocator().block_info(ptr);
    if (!block) return fail(FRAGCTL_ERROR_NOT_OWNED, fmt::format("fragctl_block_info: {} is not a live block", ptr));
    *bytes = block->bytes;
    *stream = block->stream;
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_device_memory(fragctl_allocator* allocator, size_t* free, size_t* total) {
  FRAGCTL_REQUIRE(allocator != nullptr && free != nullptr && total != nullptr,
                  "fragctl_device_memory: allocator, free or total is NULL");
  return guarded([&] {
    const fragctl::memory_info info = allocator->stack->backend().get_memory_info();
    *free = info.free;
    *total = info.total;
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_device_memory_split_json(fragctl_allocator* allocator, char** json) {
  FRAGCTL_REQUIRE(allocator != nullptr && json != nullptr,
                  "fragctl_device_memory_split_json: allocator or json is NULL");
  FRAGCTL_NOT_IN_SPAN_CALLBACK(allocator, "fragctl_device_memory_split_json");
  return guarded([&] {
    fragctl::allocator_stack& stack = *allocator->stack;
    const fragctl::memory_info info = stack.backend().get_memory_info();
    const fragctl::allocator_stats s = stack.stats();
    const fragctl::device_memory_split split = fragctl::device_memory_split_of(
        stack.backend(), s.reserved.current, info.free, info.total, s.device_memory.outside_at_start);
    *json = copy_out(fragctl::detail::dump_json(fragctl::detail::device_memory_split_to_json_value(split)));
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_attribute_device_memory(fragctl_allocator* allocator, const char* use, const char* label,
                                               size_t bytes) {
  FRAGCTL_REQUIRE(allocator != nullptr && use != nullptr && label != nullptr,
                  "fragctl_attribute_device_memory: allocator, use or label is NULL");
  const std::optional<fragctl::device_memory_use> kind = fragctl::parse_device_memory_use(use);
  if (!kind) {
    return fail(FRAGCTL_ERROR_INVALID_ARGUMENT,
                fmt::format("fragctl_attribute_device_memory: unknown use \"{}\"; accepted: nccl", use));
  }
  return guarded([&] {
    fragctl::attribute_device_memory(allocator->stack->backend(), *kind, label, bytes);
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_process_device_memory_outside(fragctl_allocator* allocator, size_t* bytes) {
  FRAGCTL_REQUIRE(allocator != nullptr && bytes != nullptr,
                  "fragctl_process_device_memory_outside: allocator or bytes is NULL");
  const std::size_t outside = fragctl::process_memory_outside_fragctl(allocator->stack->backend());
  if (outside == SIZE_MAX) {
    return fail(FRAGCTL_ERROR_STATE, fmt::format("fragctl_process_device_memory_outside: the {} backend has no "
                                                 "per-process device memory figures (NVML)",
                                                 allocator->stack->backend().name()));
  }
  *bytes = outside;
  return FRAGCTL_OK;
}

fragctl_status fragctl_graph_pool_reclaim(fragctl_allocator* allocator, void* ptr) {
  FRAGCTL_REQUIRE(allocator != nullptr, "fragctl_graph_pool_reclaim: allocator is NULL");
  FRAGCTL_NOT_IN_SPAN_CALLBACK(allocator, "fragctl_graph_pool_reclaim");
  return guarded([&] {
    if (allocator->stack->graph_pool_reclaim(ptr)) return FRAGCTL_OK;
    return fail(FRAGCTL_ERROR_NOT_OWNED,
                fmt::format("fragctl_graph_pool_reclaim: {} is not a block kept in this graph pool", ptr));
  });
}

}  // extern "C"
