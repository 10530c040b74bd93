// The C API's block and device queries and graph-pool calls (fragctl/fragctl.h):
// fragctl_block_info, fragctl_device_memory, fragctl_graph_pool_reclaim.
#include <optional>

#include "capi/handle.hpp"
#include "fmt/format.h"
#include "fragctl/allocator_stack.hpp"
#include "fragctl/backend.hpp"

using fragctl::capi::fail;
using fragctl::capi::guarded;

extern "C" {

fragctl_status fragctl_block_info(fragctl_allocator* allocator, void* ptr, size_t* bytes, void** stream) {
  FRAGCTL_REQUIRE(allocator != nullptr && bytes != nullptr && stream != nullptr,
                  "fragctl_block_info: allocator, bytes or stream is NULL");
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

fragctl_status fragctl_graph_pool_reclaim(fragctl_allocator* allocator, void* ptr) {
  FRAGCTL_REQUIRE(allocator != nullptr, "fragctl_graph_pool_reclaim: allocator is NULL");
  return guarded([&] {
    if (allocator->stack->graph_pool_reclaim(ptr)) return FRAGCTL_OK;
    return fail(FRAGCTL_ERROR_NOT_OWNED,
                fmt::format("fragctl_graph_pool_reclaim: {} is not a block kept in this graph pool", ptr));
  });
}

}  // extern "C"
