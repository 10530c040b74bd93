// CUDA graph private pools over fragctl's graph_pool allocators (graph_pools.hpp).
#include "graph_pools.hpp"

#include <algorithm>
#include <utility>

#include <c10/util/Exception.h>

#include "c_api.hpp"

namespace fragctl_torch {

namespace cca = c10::cuda::CUDACachingAllocator;

std::unordered_map<void*, std::size_t> live_blocks(fragctl_allocator* allocator) {
  std::unordered_map<void*, std::size_t> live;
  check(api.fragctl_memory_map(
            allocator,
            [](const fragctl_map_segment* segment, void* context) {
              auto& out = *static_cast<std::unordered_map<void*, std::size_t>*>(context);
              for (std::size_t i = 0; i < segment->block_count; ++i) {
                const fragctl_map_block& b = segment->blocks[i];
                if (b.use == FRAGCTL_BLOCK_LIVE) out.emplace(reinterpret_cast<void*>(b.address), b.requested);
              }
            },
            &live),
        "memory map of a graph pool");
  return live;
}

namespace {
thread_local std::string armed_region;  // graph_pools::arm_region
}  // namespace

void graph_pools::arm_region(std::string tag) { armed_region = std::move(tag); }

void graph_pools::configure(std::string options, std::string backend) {
  const std::lock_guard lock(mutex_);
  options_ = std::move(options);
  backend_ = std::move(backend);
}

fragctl_allocator* graph_pools::region_allocator(const std::string& tag, c10::DeviceIndex device) {
  const std::lock_guard lock(mutex_);
  for (const auto& [id, p] : pools_) {
    if (!p.region.empty() && p.region == tag && p.ref.device == device) return p.ref.allocator;
  }
  return nullptr;
}

graph_pools::pool& graph_pools::pool_of(c10::DeviceIndex device, c10::MempoolId_t id) {
  auto [it, created] = pools_.try_emplace(id);
  pool& p = it->second;
  if (created) {
    p.ref.device = device;
    p.ref.id = id;
    // A region is an arena (it pauses) with a live-block table (frees find their size there);
    // a graph or MemPool pool keeps its freed blocks (graph_pool).
    p.region = std::exchange(armed_region, std::string());
    const bool region = !p.region.empty();
    std::string options = options_;
    if (region) {
      if (!options.empty()) options += ',';
      options += "block_table:true";
    }
    const fragctl_status status =
        api.fragctl_create(region ? "arena" : "graph_pool:caching", options.empty() ? nullptr : options.c_str(),
                           backend_.empty() ? nullptr : backend_.c_str(), device, &p.ref.allocator);
    if (status != FRAGCTL_OK) {
      pools_.erase(it);
      check(status, "graph pool allocator");
    }
    if (on_allocator_) on_allocator_(p.ref.allocator, device, id, true);
    any_.store(true, std::memory_order_release);
  }
  TORCH_CHECK(p.ref.device == device, "fragctl: pool (", id.first, ", ", id.second, ") belongs to device ",
              p.ref.device, ", not ", device);
  return p;
}

void graph_pools::begin_capture(c10::DeviceIndex device, c10::MempoolId_t id,
                                std::function<bool(cudaStream_t)> filter) {
  const std::lock_guard lock(mutex_);
  ++pool_of(device, id).use_count;
  captures_.push_back({device, id, std::move(filter)});
  capturing_.store(true, std::memory_order_release);
}

void graph_pools::end_capture(c10::DeviceIndex device, c10::MempoolId_t id) {
  const std::lock_guard lock(mutex_);
  const auto it = std::find_if(captures_.begin(), captures_.end(),
                               [&](const capture& c) { return c.device == device && c.id == id; });
  TORCH_CHECK(it != captures_.end(), "fragctl: endAllocateToPool for a pool that is not being allocated to");
  captures_.erase(it);
  capturing_.store(!captures_.empty(), std::memory_order_release);
}

void graph_pools::release(c10::DeviceIndex device, c10::MempoolId_t id) {
  const std::lock_guard lock(mutex_);
  const auto it = pools_.find(id);
  if (it == pools_.end()) return;
  TORCH_CHECK(it->second.ref.device == device, "fragctl: releasePool on device ", device, " of a pool of device ",
              it->second.ref.device);
  if (--it->second.use_count <= 0) retire_locked(id);
}

void graph_pools::add_user(c10::DeviceIndex device, c10::MempoolId_t id) {
  const std::lock_guard lock(mutex_);
  ++pool_of(device, id).use_count;
}

void graph_pools::set_use_on_oom(c10::DeviceIndex device, c10::MempoolId_t id, bool use_on_oom) {
  const std::lock_guard lock(mutex_);
  const auto it = pools_.find(id);
  if (it == pools_.end()) {
    TORCH_CHECK(!use_on_oom, "fragctl: setUseOnOOM for pool (", id.first, ", ", id.second, "), which does not exist");
    return;
  }
  TORCH_CHECK(it->second.ref.device == device, "fragctl: setUseOnOOM on device ", device, " of a pool of device ",
              it->second.ref.device);
  it->second.use_on_oom = use_on_oom;
}

std::vector<pool_ref> graph_pools::use_on_oom_pools(c10::DeviceIndex device) {
  const std::lock_guard lock(mutex_);
  std::vector<pool_ref> out;
  for (const auto& [id, p] : pools_) {
    if (p.use_on_oom && p.ref.device == device) out.push_back(p.ref);
  }
  return out;
}

int graph_pools::use_count(c10::MempoolId_t id) {
  const std::lock_guard lock(mutex_);
  const auto it = pools_.find(id);
  return it == pools_.end() ? 0 : it->second.use_count;
}

std::optional<pool_ref> graph_pools::capturing_pool(c10::DeviceIndex device, cudaStream_t stream) {
  const std::lock_guard lock(mutex_);
  for (const capture& c : captures_) {
    if (c.device == device && c.filter(stream)) return pools_.at(c.id).ref;
  }
  return std::nullopt;
}

std::optional<block_owner> graph_pools::owner_of(void* ptr) {
  if (!any_.load(std::memory_order_acquire)) return std::nullopt;
  const std::lock_guard lock(mutex_);
  for (const auto& [id, p] : pools_) {
    std::size_t bytes = 0;
    void* stream = nullptr;
    if (api.fragctl_block_info(p.ref.allocator, ptr, &bytes, &stream) == FRAGCTL_OK) {
      return block_owner{p.ref.allocator, p.ref.device, id, bytes, static_cast<cudaStream_t>(stream)};
    }
  }
  return std::nullopt;
}

void graph_pools::retire_if_unused(c10::MempoolId_t id) {
  const std::lock_guard lock(mutex_);
  retire_locked(id);
}

// Destroys a pool nobody uses any more once its last live block is freed.
void graph_pools::retire_locked(c10::MempoolId_t id) {
  const auto it = pools_.find(id);
  if (it == pools_.end() || it->second.use_count > 0) return;
  const fragctl_counters c = counters_of(it->second.ref.allocator);
  if (c.allocations != c.frees) return;  // blocks still live
  (void)api.fragctl_destroy(it->second.ref.allocator);  // the pool's memory goes back to the device
  if (on_allocator_) on_allocator_(it->second.ref.allocator, it->second.ref.device, id, false);
  pools_.erase(it);
  any_.store(!pools_.empty(), std::memory_order_release);
}

std::vector<pool_ref> graph_pools::pools(c10::DeviceIndex device, c10::MempoolId_t id) {
  const std::lock_guard lock(mutex_);
  std::vector<pool_ref> out;
  for (const auto& [pid, p] : pools_) {
    if ((device < 0 || p.ref.device == device) && (id == c10::MempoolId_t{0, 0} || id == pid)) out.push_back(p.ref);
  }
  return out;
}

bool graph_pools::live_blocks_are(c10::DeviceIndex device, c10::MempoolId_t id,
                                  const std::unordered_set<void*>& expected) {
  const std::lock_guard lock(mutex_);
  const auto it = pools_.find(id);
  if (it == pools_.end()) return expected.empty();
  TORCH_CHECK(it->second.ref.device == device, "fragctl: pool of another device");
  const auto live = live_blocks(it->second.ref.allocator);
  return live.size() == expected.size() &&
         std::all_of(live.begin(), live.end(), [&](const auto& b) { return expected.count(b.first) != 0; });
}

std::shared_ptr<pool_checkpoint> graph_pools::checkpoint(c10::DeviceIndex device, c10::MempoolId_t id) {
  const std::lock_guard lock(mutex_);
  auto state = std::make_shared<pool_checkpoint>();
  state->device = device;
  state->id = id;
  const auto it = pools_.find(id);
  if (it != pools_.end()) {
    for (const auto& [ptr, bytes] : live_blocks(it->second.ref.allocator)) state->live.push_back(ptr);
  }
  return state;
}

cca::CheckpointDelta graph_pools::restore(const pool_checkpoint& state, c10::DeleterFnPtr deleter) {
  const std::lock_guard lock(mutex_);
  fragctl_allocator* a = pool_of(state.device, state.id).ref.allocator;
  cca::CheckpointDelta delta;
  const std::unordered_set<void*> wanted(state.live.begin(), state.live.end());
  const auto live = live_blocks(a);
  // Live now, not in the checkpoint: freed into the pool.
  for (const auto& [ptr, requested] : live) {
    if (wanted.count(ptr) != 0) continue;
    std::size_t bytes = 0;
    void* stream = nullptr;
    check(api.fragctl_block_info(a, ptr, &bytes, &stream), "graph pool checkpoint");
    check(api.fragctl_free(a, ptr, bytes, stream), "graph pool checkpoint");
    delta.ptrs_freed.push_back(ptr);
  }
  // In the checkpoint, not live now: live again at the same address.
  for (void* ptr : state.live) {
    if (live.count(ptr) != 0) continue;
    TORCH_CHECK(api.fragctl_graph_pool_reclaim(a, ptr) == FRAGCTL_OK,
                "fragctl: cannot restore the graph pool's checkpoint: block ", ptr,
                " was handed to another owner since (a cross-stream free inside the pool): ",
                api.fragctl_last_error());
    delta.dataptrs_allocd.emplace_back(ptr, ptr, deleter, c10::Device(c10::DeviceType::CUDA, state.device));
  }
  return delta;
}

}  // namespace fragctl_torch
