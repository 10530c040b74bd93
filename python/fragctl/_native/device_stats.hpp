// PyTorch-shaped device statistics (torch.cuda.memory_stats) from fragctl's
// counters: the allocators of one device summed, less the baseline that
// reset_accumulated_memory_stats took.
#pragma once

#include <vector>

#include <c10/cuda/CUDACachingAllocator.h>

#include "fragctl/fragctl.h"

namespace fragctl_torch {

/// The counters of `all` added field by field.
fragctl_counters sum_counters(const std::vector<fragctl_counters>& all);

/// PyTorch's DeviceStats from the summed counters `sum` of one device and the
/// `base` taken at the last resetAccumulatedStats (all zero before any).
/// fragctl has one pool of PyTorch's kinds: its figures go to "all" and
/// "large_pool"; blocks kept in a graph pool are counted as cached by fragctl
/// already.
c10::CachingDeviceAllocator::DeviceStats device_stats(const fragctl_counters& sum, const fragctl_counters& base);

}  // namespace fragctl_torch
