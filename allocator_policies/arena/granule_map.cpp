#include "allocator_policies/arena/granule_map.hpp"

#include <algorithm>
#include <bit>

#include "fmt/format.h"
#include "fragctl/error.hpp"
#include "fragctl/log.hpp"

namespace fragctl::arena_detail {

granule_map::granule_map(device_backend& backend, stream_clock& clock, std::uintptr_t base,
                         std::size_t bytes, std::size_t granularity, std::size_t physical_limit)
    : backend_(backend),
      clock_(clock),
      base_(base),
      granularity_(granularity),
      shift_(static_cast<unsigned>(std::countr_zero(granularity))),
      limit_(physical_limit) {
  const std::size_t count = bytes >> shift_;
  if (count >= nil - 1) {
    throw invalid_argument(fmt::format("arena: {} granules of {} bytes are too many; raise the granularity "
                                       "or lower arena_size",
                                       count, granularity));
  }
  granules_.resize(count);
  handles_.assign(count, 0);
  sentinel_ = static_cast<std::uint32_t>(count);
  lru_prev_.assign(count + 1, nil);
  lru_next_.assign(count + 1, nil);
  lru_prev_[sentinel_] = lru_next_[sentinel_] = sentinel_;
  pool_.reserve(std::min(count, limit_ >> shift_));
}

granule_map::~granule_map() {
  try {
    for (std::size_t g = 0; g < handles_.size(); ++g) {
      if (handles_[g] == 0) continue;
      backend_.unmap(address(g), granularity_);
      backend_.release_physical(physical_handle{handles_[g]}, granularity_);
    }
    for (physical_handle h : pool_) backend_.release_physical(h, granularity_);
  } catch (const std::exception& e) {
    logger().error("arena: releasing physical memory failed: {}", e.what());
  }
}

void granule_map::lru_push(std::size_t g) noexcept {
  const std::uint32_t last = lru_prev_[sentinel_];
  lru_prev_[g] = last;
  lru_next_[g] = sentinel_;
  lru_next_[last] = static_cast<std::uint32_t>(g);
  lru_prev_[sentinel_] = static_cast<std::uint32_t>(g);
  ++cached_;
}

void granule_map::lru_remove(std::size_t g) noexcept {
  lru_next_[lru_prev_[g]] = lru_next_[g];
  lru_prev_[lru_next_[g]] = lru_prev_[g];
  lru_prev_[g] = lru_next_[g] = nil;
  --cached_;
}

bool granule_map::idle(std::size_t g, std::uint64_t& refreshed) {
  const free_stamp stamp = granules_[g].stamp;
  if (clock_.complete(stamp)) return true;
  if (stamp.stream == free_stamp::multi) {
    if (refreshed & (std::uint64_t{1} << 63)) return false;
    refreshed |= std::uint64_t{1} << 63;
    clock_.refresh_all();
  } else {
    const std::uint64_t bit = stamp.stream < 63 ? std::uint64_t{1} << stamp.stream : 0;
    if (refreshed & bit) return false;
    refreshed |= bit;
    clock_.refresh(stamp.stream);
  }
  return clock_.complete(stamp);
}

void granule_map::unmap_to_pool(std::size_t g) {
  pool_.reserve(pool_.size() + 1);
  backend_.unmap(address(g), granularity_);
  pool_.push_back(physical_handle{handles_[g]});
  handles_[g] = 0;
  granules_[g].stamp = free_stamp{};
  lru_remove(g);
  --mapped_;
}

void granule_map::trim(std::size_t keep, std::uint64_t before) {
  // A granule freed on a GPU stream stays in flight for a while; a few of
  // those are skipped, then trimming waits for a later call.
  constexpr int max_skipped = 8;
  std::uint64_t refreshed = 0;
  int skipped = 0;
  for (std::uint32_t g = lru_next_[sentinel_];
       g != sentinel_ && cached_bytes() > keep && granules_[g].cached_at <= before;) {
    const std::uint32_t next = lru_next_[g];
    if (idle(g, refreshed)) {
      unmap_to_pool(g);
    } else if (++skipped > max_skipped) {
      break;
    }
    g = next;
  }
}

bool granule_map::fill_pool(std::size_t need, std::size_t lo, std::size_t hi) {
  std::uint64_t refreshed = 0;
  for (std::uint32_t g = lru_next_[sentinel_]; pool_.size() < need && g != sentinel_;) {
    const std::uint32_t next = lru_next_[g];
    if ((g < lo || g > hi) && idle(g, refreshed)) unmap_to_pool(g);
    g = next;
  }
  while (pool_.size() < need && (created_ + 1) * granularity_ <= limit_) {
    pool_.reserve(pool_.size() + 1);
    const std::optional<physical_handle> h = backend_.create_physical(granularity_);
    if (!h) break;
    pool_.push_back(*h);
    ++created_;
  }
  return pool_.size() >= need;
}

void granule_map::unmap_fresh(std::size_t lo, std::size_t hi) noexcept {
  for (std::size_t g = lo; g < hi; ++g) {
    try {
      backend_.unmap(address(g), granularity_);
    } catch (...) {
      // The mapping stays where it is; the granule keeps its handle.
      continue;
    }
    pool_.push_back(physical_handle{handles_[g]});  // capacity reserved in map_range
    handles_[g] = 0;
    lru_remove(g);
    --mapped_;
  }
}

bool granule_map::map_range(std::uintptr_t addr, std::size_t bytes, bool wait) {
  const std::size_t lo = first(addr);
  const std::size_t hi = last_of(addr, bytes);
  const auto need = static_cast<std::size_t>(
      std::count(handles_.begin() + static_cast<std::ptrdiff_t>(lo),
                 handles_.begin() + static_cast<std::ptrdiff_t>(hi) + 1, std::uint64_t{0}));
  if (need == 0) return true;
  if (!fill_pool(need, lo, hi)) {
    if (!wait) return false;
    clock_.synchronize_all();
    if (!fill_pool(need, lo, hi)) return false;
  }
  pool_.reserve(pool_.size() + need);
  for (std::size_t g = lo; g <= hi;) {
    if (handles_[g] != 0) {
      ++g;
      continue;
    }
    const std::size_t run = g;
    for (; g <= hi && handles_[g] == 0; ++g) {
      const physical_handle h = pool_.back();
      if (!backend_.map(address(g), granularity_, h)) {
        unmap_fresh(run, g);
        return false;
      }
      pool_.pop_back();
      handles_[g] = h.value;
      granules_[g].stamp = free_stamp{};
      ++mapped_;
      lru_push(g);
    }
    if (!backend_.set_access(address(run), (g - run) * granularity_)) {
      unmap_fresh(run, g);
      return false;
    }
  }
  return true;
}

void granule_map::release_unused() {
  while (lru_next_[sentinel_] != sentinel_) unmap_to_pool(lru_next_[sentinel_]);
  while (!pool_.empty()) {
    backend_.release_physical(pool_.back(), granularity_);
    pool_.pop_back();
    --created_;
  }
}

std::size_t granule_map::mapped_runs() const noexcept {
  std::size_t runs = 0;
  for (std::size_t g = 0; g < handles_.size(); ++g) {
    if (handles_[g] != 0 && (g == 0 || handles_[g - 1] == 0)) ++runs;
  }
  return runs;
}

std::size_t granule_map::longest_mapped(std::uintptr_t addr, std::size_t bytes) const noexcept {
  std::size_t best = 0, run = 0;
  const std::uintptr_t end = addr + bytes;
  for (std::size_t g = first(addr), last = last_of(addr, bytes); g <= last; ++g) {
    const std::uintptr_t lo = std::max(addr, base_ + (g << shift_));
    const std::uintptr_t hi = std::min(end, base_ + ((g + 1) << shift_));
    run = handles_[g] != 0 ? run + (hi - lo) : 0;
    best = std::max(best, run);
  }
  return best;
}

}  // namespace fragctl::arena_detail
