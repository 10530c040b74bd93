// PyTorch-shaped device statistics from fragctl's counters (device_stats.hpp).
#include "device_stats.hpp"

#include <algorithm>
#include <array>
#include <cstdint>

namespace fragctl_torch {

namespace {

namespace cda = c10::CachingDeviceAllocator;
using counter = std::uint64_t fragctl_counters::*;

// The counters PyTorch's statistics are made of, each added up across the
// allocators of a device.
constexpr std::array<counter, 20> summed = {
    &fragctl_counters::requested,          &fragctl_counters::requested_window_peak,
    &fragctl_counters::requested_total,    &fragctl_counters::requested_freed_total,
    &fragctl_counters::allocated,          &fragctl_counters::allocated_window_peak,
    &fragctl_counters::allocated_total,    &fragctl_counters::allocated_freed_total,
    &fragctl_counters::reserved,           &fragctl_counters::reserved_window_peak,
    &fragctl_counters::reserved_total,     &fragctl_counters::reserved_freed_total,
    &fragctl_counters::allocations,        &fragctl_counters::frees,
    &fragctl_counters::live_blocks_window_peak, &fragctl_counters::ooms,
    &fragctl_counters::retries,            &fragctl_counters::device_allocations,
    &fragctl_counters::device_frees,       &fragctl_counters::segments,
};

// A PyTorch Stat from fragctl's counters: current and window peak as they
// are, the totals since the baseline.
struct stat_source {
  cda::StatArray cda::DeviceStats::*target;
  counter current, peak, allocated, freed;
};

constexpr std::array<stat_source, 6> byte_and_block_stats = {{
    {&cda::DeviceStats::allocation, nullptr, &fragctl_counters::live_blocks_window_peak, &fragctl_counters::allocations,
     &fragctl_counters::frees},
    {&cda::DeviceStats::active, nullptr, &fragctl_counters::live_blocks_window_peak, &fragctl_counters::allocations,
     &fragctl_counters::frees},
    {&cda::DeviceStats::allocated_bytes, &fragctl_counters::allocated, &fragctl_counters::allocated_window_peak,
     &fragctl_counters::allocated_total, &fragctl_counters::allocated_freed_total},
    {&cda::DeviceStats::active_bytes, &fragctl_counters::allocated, &fragctl_counters::allocated_window_peak,
     &fragctl_counters::allocated_total, &fragctl_counters::allocated_freed_total},
    {&cda::DeviceStats::requested_bytes, &fragctl_counters::requested, &fragctl_counters::requested_window_peak,
     &fragctl_counters::requested_total, &fragctl_counters::requested_freed_total},
    {&cda::DeviceStats::reserved_bytes, &fragctl_counters::reserved, &fragctl_counters::reserved_window_peak,
     &fragctl_counters::reserved_total, &fragctl_counters::reserved_freed_total},
}};

std::int64_t i64(std::uint64_t v) { return static_cast<std::int64_t>(v); }

// fragctl has no small pool of PyTorch's kind: "all" and "large_pool" alike.
void fill(cda::StatArray& a, const cda::Stat& s) {
  a[static_cast<std::size_t>(cda::StatType::AGGREGATE)] = s;
  a[static_cast<std::size_t>(cda::StatType::LARGE_POOL)] = s;
}

}  // namespace

fragctl_counters sum_counters(const std::vector<fragctl_counters>& all) {
  fragctl_counters sum{};
  sum.struct_size = sizeof sum;
  for (const fragctl_counters& c : all) {
    for (counter field : summed) sum.*field += c.*field;
  }
  return sum;
}

cda::DeviceStats device_stats(const fragctl_counters& sum, const fragctl_counters& base) {
  cda::DeviceStats s;
  for (const stat_source& source : byte_and_block_stats) {
    // Live blocks have no counter of their own: allocations less frees.
    const std::uint64_t current = source.current != nullptr ? sum.*source.current : sum.allocations - sum.frees;
    fill(s.*source.target, cda::Stat{i64(current), i64(sum.*source.peak),
                                     i64(sum.*source.allocated - base.*source.allocated),
                                     i64(sum.*source.freed - base.*source.freed)});
  }
  fill(s.segment, {i64(sum.segments), i64(sum.segments), i64(sum.device_allocations - base.device_allocations),
                   i64(sum.device_frees - base.device_frees)});
  const std::int64_t cached = std::max<std::int64_t>(0, i64(sum.reserved) - i64(sum.allocated));
  fill(s.inactive_split_bytes, {cached, cached, 0, 0});
  s.num_alloc_retries = i64(sum.retries - base.retries);
  s.num_ooms = i64(sum.ooms - base.ooms);
  s.num_device_alloc = i64(sum.device_allocations - base.device_allocations);
  s.num_device_free = i64(sum.device_frees - base.device_frees);
  return s;
}

}  // namespace fragctl_torch
