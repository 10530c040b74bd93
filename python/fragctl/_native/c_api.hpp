// The C API (fragctl/fragctl.h) as the native PyTorch backend reaches it:
// resolved with dlsym from the libfragctl.so the Python package loaded, so
// there is one set of process-default allocators whichever way memory is
// reached. FRAGCTL_TORCH_C_API is the one list of the entry points used here;
// each one's type is the header's (decltype), and CTest `c_entry_points`
// (tools/check_entry_points.py) checks every name against the headers.
#pragma once

#include <string>

#include "fragctl/fragctl.h"

namespace fragctl_torch {

#define FRAGCTL_TORCH_C_API(X)   \
  X(fragctl_default_allocator)   \
  X(fragctl_create)              \
  X(fragctl_destroy)             \
  X(fragctl_malloc)              \
  X(fragctl_free)                \
  X(fragctl_block_info)          \
  X(fragctl_record_stream)       \
  X(fragctl_release_cached)      \
  X(fragctl_get_counters)        \
  X(fragctl_reset_peaks)         \
  X(fragctl_set_limit)           \
  X(fragctl_memory_map)          \
  X(fragctl_device_memory)       \
  X(fragctl_graph_pool_reclaim)  \
  X(fragctl_enable_peer_access)  \
  X(fragctl_watch_spans)         \
  X(fragctl_spans)               \
  X(fragctl_export_block)        \
  X(fragctl_import_block)        \
  X(fragctl_close_block)         \
  X(fragctl_last_error)

struct c_api {
#define FRAGCTL_TORCH_FN(name) decltype(&::name) name = nullptr;
  FRAGCTL_TORCH_C_API(FRAGCTL_TORCH_FN)
#undef FRAGCTL_TORCH_FN

  /// Resolves every entry point from the libfragctl.so at `path` (the loaded
  /// copy if there is one); throws (TORCH_CHECK) naming a missing one.
  void load(const std::string& path);
};

/// The entry points, loaded once by the module's `allocator` function.
extern c_api api;

/// Throws (TORCH_CHECK) with fragctl's message unless `status` is FRAGCTL_OK.
void check(fragctl_status status, const char* what);

/// The allocator's counters.
fragctl_counters counters_of(fragctl_allocator* allocator);

/// Free and total memory of the allocator's device, from its backend.
struct device_memory {
  size_t free = 0;
  size_t total = 0;
};
device_memory memory_of(fragctl_allocator* allocator);

}  // namespace fragctl_torch
