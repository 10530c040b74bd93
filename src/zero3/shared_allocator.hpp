// Giving a C API block manager (fragctl_zero3, fragctl/zero3/zero3.h) an
// allocator it does not own. For the surfaces layer, which owns the handles
// such allocators come in (fragctl_zero3_use_allocator in src/capi); marked
// `shared` in layers.txt.
#pragma once

#include "fragctl/device_allocator.hpp"
#include "fragctl/zero3/zero3.h"

namespace fragctl::zero3 {

/// Called once when the manager stops using the allocator given to it.
using allocator_release = void (*)(void* context) noexcept;

/// Makes `allocator` the persistent and the transient allocator of the
/// unstarted manager `z`: shards, gradient slices, reduce buckets and
/// gathered blocks all come from it, and the two allocators `z` built from
/// the environment are destroyed. `allocator` must outlive `z`; on success
/// `z` calls `release(context)` exactly once, when it is destroyed or when a
/// later call of this function replaces the allocator. A second call before
/// start replaces the first allocator.
///
/// Returns FRAGCTL_ZERO3_OK, or FRAGCTL_ZERO3_INVALID_ARGUMENT (last error
/// set; `release` is then not called) when `z` or `allocator` is NULL, `z`
/// is started, or the allocator's backend is not the manager's (another
/// runtime, or another device). Never throws.
fragctl_zero3_status use_allocator(fragctl_zero3* z, device_allocator* allocator, allocator_release release,
                                   void* context) noexcept;

}  // namespace fragctl::zero3
