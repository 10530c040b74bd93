// The LD_PRELOAD layer (interpose/interposer.hpp) with fake "real" runtime
// functions and sim allocators: ownership, pass-through of foreign pointers
// and nullptr, cudaFree's synchronization, devices, streams, memory info and
// error codes, the default memory pool's statistics, all without a GPU.
#include "interpose/interposer.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fragctl/adaptors.hpp"
#include "fragctl/allocator_stack.hpp"
#include "fragctl/config.hpp"
#include "fragctl/error.hpp"
#include "fragctl/fragctl.h"
#include "fragctl/policy.hpp"
#include "fragctl/sim_backend.hpp"
#include "interpose/process_layers.hpp"
#include "support/log_capture.hpp"

namespace fragctl::interpose {
namespace {

// The fake runtime: what the layer calls, recorded.
struct fake_runtime {
  int current_device = 0;
  std::vector<std::string> calls;
  std::vector<void*> freed;                      // pointers the real free functions got
  std::vector<std::pair<void*, void*>> freed_async;  // (ptr, stream)
  std::size_t device_free = std::size_t{10} << 30;
  std::size_t device_total = std::size_t{80} << 30;
  int synchronize_result = success;
  std::function<void()> on_synchronize;
  std::map<std::string, int> lookups;
  std::vector<std::pair<void*, int>> pool_calls;  // (pool, attribute; -1: trim) the real pool functions got
  void* capturing_stream = nullptr;               // the stream that captures a graph, if any
  bool capture = false;
  std::vector<char> graph_memory = std::vector<char>(4096);  // what the real cudaMallocAsync hands out
  int peer_access_result = success;               // what the real cudaDeviceEnablePeerAccess returns
  int devices = 2;                                // default pools exist for devices [0, devices)
  std::vector<void*> destroyed_streams;           // what the real cudaStreamDestroy got
  std::function<void(void*)> on_stream_destroy;   // what the real cudaStreamDestroy does (a sim stream's end)
};
fake_runtime* fake = nullptr;

int fake_free(void* p) {
  fake->calls.push_back("free");
  fake->freed.push_back(p);
  return success;
}
int fake_free_async(void* p, void* s) {
  fake->calls.push_back("free_async");
  fake->freed_async.emplace_back(p, s);
  return success;
}
int fake_free_async_ptsz(void* p, void* s) {
  fake->calls.push_back("free_async_ptsz");
  fake->freed_async.emplace_back(p, s);
  return success;
}
int fake_mem_get_info(std::size_t* f, std::size_t* t) {
  *f = fake->device_free;
  *t = fake->device_total;
  return success;
}
int fake_get_device(int* d) {
  *d = fake->current_device;
  return success;
}
int fake_set_device(int d) {
  fake->calls.push_back("set_device " + std::to_string(d));
  fake->current_device = d;
  return success;
}
int fake_synchronize() {
  fake->calls.push_back("synchronize " + std::to_string(fake->current_device));
  if (fake->on_synchronize) fake->on_synchronize();
  return fake->synchronize_result;
}

// The default pool of device d is pool_base + d; every attribute reads 777.
const std::uintptr_t pool_base = 0xd000;
constexpr std::uint64_t real_pool_value = 777;
int fake_default_pool(void** pool, int d) {
  if (d < 0 || d >= fake->devices) {
    std::string call = "default_pool of no device ";  // the runtime's error stays behind
    call += std::to_string(d);
    fake->calls.push_back(call);
    return error_invalid_device;
  }
  *pool = reinterpret_cast<void*>(pool_base + static_cast<std::uintptr_t>(d));
  return success;
}
int fake_pool_get(void* pool, int attribute, void* value) {
  fake->pool_calls.emplace_back(pool, attribute);
  *static_cast<std::uint64_t*>(value) = real_pool_value;
  return success;
}
int fake_pool_set(void* pool, int attribute, void*) {
  fake->pool_calls.emplace_back(pool, attribute);
  return success;
}
int fake_pool_trim(void* pool, std::size_t) {
  fake->pool_calls.emplace_back(pool, -1);
  return success;
}

int fake_stream_is_capturing(void* stream, int* status) {
  *status = fake->capture && stream == fake->capturing_stream ? capture_status_active : 0;
  return success;
}
int fake_malloc_async(void** p, std::size_t, void* s) {
  fake->calls.push_back("malloc_async");
  *p = fake->graph_memory.data();
  (void)s;
  return success;
}

int fake_ipc_get_mem_handle(void* handle, void* ptr) {
  fake->calls.push_back("ipc_get_mem_handle");
  std::memset(handle, 0x2a, 64);
  (void)ptr;
  return success;
}

int fake_enable_peer_access(int peer, unsigned flags) {
  fake->calls.push_back("enable_peer_access " + std::to_string(peer) + " on " +
                        std::to_string(fake->current_device));
  (void)flags;
  return fake->peer_access_result;
}

int fake_stream_destroy(void* s) {
  fake->calls.push_back("stream_destroy");
  fake->destroyed_streams.push_back(s);
  if (fake->on_stream_destroy) fake->on_stream_destroy(s);
  return success;
}
int fake_get_device_count(int* count) {
  *count = fake->devices;
  return success;
}

int fake_pool_set_access(void* pool, const mem_access_desc* descs, std::size_t count) {
  // Appended in steps: GCC 12 at -O3 warns (-Wrestrict) on "literal" + std::string temporaries.
  std::string call = "pool_set_access ";
  call += std::to_string(reinterpret_cast<std::uintptr_t>(pool) - pool_base);
  for (std::size_t i = 0; i < count; ++i) {
    call += ' ';
    call += std::to_string(descs[i].location_id);
  }
  fake->calls.push_back(call);
  return success;
}

void* resolve_fake(const char* name) {
  ++fake->lookups[name];
  const std::string n = name;
  if (n == "cudaFree") return reinterpret_cast<void*>(&fake_free);
  if (n == "cudaFreeAsync") return reinterpret_cast<void*>(&fake_free_async);
  if (n == "cudaFreeAsync_ptsz") return reinterpret_cast<void*>(&fake_free_async_ptsz);
  if (n == "cudaMemGetInfo") return reinterpret_cast<void*>(&fake_mem_get_info);
  if (n == "cudaGetDevice") return reinterpret_cast<void*>(&fake_get_device);
  if (n == "cudaSetDevice") return reinterpret_cast<void*>(&fake_set_device);
  if (n == "cudaDeviceSynchronize") return reinterpret_cast<void*>(&fake_synchronize);
  if (n == "cudaDeviceGetDefaultMemPool") return reinterpret_cast<void*>(&fake_default_pool);
  if (n == "cudaMemPoolGetAttribute") return reinterpret_cast<void*>(&fake_pool_get);
  if (n == "cudaMemPoolSetAttribute") return reinterpret_cast<void*>(&fake_pool_set);
  if (n == "cudaMemPoolTrimTo") return reinterpret_cast<void*>(&fake_pool_trim);
  if (n == "cudaStreamIsCapturing") return reinterpret_cast<void*>(&fake_stream_is_capturing);
  if (n == "cudaMallocAsync") return reinterpret_cast<void*>(&fake_malloc_async);
  if (n == "cudaIpcGetMemHandle") return reinterpret_cast<void*>(&fake_ipc_get_mem_handle);
  if (n == "cudaDeviceEnablePeerAccess") return reinterpret_cast<void*>(&fake_enable_peer_access);
  if (n == "cudaMemPoolSetAccess") return reinterpret_cast<void*>(&fake_pool_set_access);
  if (n == "cudaGetDeviceCount") return reinterpret_cast<void*>(&fake_get_device_count);
  if (n == "cudaStreamDestroy") return reinterpret_cast<void*>(&fake_stream_destroy);
  return nullptr;
}

void* resolve_nothing(const char*) { return nullptr; }

void* const stream_a = reinterpret_cast<void*>(0x5000);
void* const stream_b = reinterpret_cast<void*>(0x6000);

class InterposerTest : public ::testing::Test {
 protected:
  void SetUp() override { fake = &runtime_; }
  void TearDown() override { fake = nullptr; }

  // Sim allocators per device, built on demand as the process defaults are.
  allocator_source source(const std::string& policy = "caching", const std::string& options = "") {
    return [this, policy, options](int device, bool create) -> device_allocator* {
      auto& slot = stacks_.at(static_cast<std::size_t>(device));
      if (!slot && create) {
        if (fail_build_) throw invalid_argument("FRAGCTL_CONF: unknown key \"bogus\"");
        // Backed: real host memory, so that addresses are unique across
        // devices as on a GPU (unified addressing); the map is keyed by them.
        auto cfg = parse_config("sim_capacity:1GiB,sim_backed:true" + options);
        cfg->backend = backend_kind::sim;
        cfg->policy = policy;
        cfg->device = device;
        slot = make_allocator(*cfg);
      }
      return slot ? &slot->allocator() : nullptr;
    };
  }
  stack_source stacks() {
    return [this](int device) { return stacks_.at(static_cast<std::size_t>(device)).get(); };
  }
  allocator_stats stats(int device) { return stacks_.at(static_cast<std::size_t>(device))->stats(); }
  bool built(int device) const { return stacks_.at(static_cast<std::size_t>(device)) != nullptr; }
  const sim_backend& sim_of(int device) const {
    return dynamic_cast<const sim_backend&>(stacks_.at(static_cast<std::size_t>(device))->allocator().backend());
  }
  // Device 0's arena memory, a block mapped before `grant` runs (with device
  // 1 current) and one mapped after: device 1 reaches neither before the
  // grant and both after it, and needs no allocator of its own.
  void expect_grant_to_device_1(interposer& layer, const std::function<void()>& grant) {
    constexpr std::size_t before_bytes = 3 << 20, after_bytes = 5 << 20;
    void* before = nullptr;
    ASSERT_EQ(layer.malloc(&before, before_bytes), success);
    EXPECT_FALSE(sim_of(0).accessible_from(1, before, before_bytes)) << "control: device 1 cannot reach it yet";
    runtime_.current_device = 1;
    grant();
    EXPECT_TRUE(sim_of(0).accessible_from(1, before, before_bytes)) << "spans mapped before";
    EXPECT_FALSE(built(1)) << "device 1's own allocator is not needed";
    runtime_.current_device = 0;
    void* after = nullptr;
    ASSERT_EQ(layer.malloc(&after, after_bytes), success);
    EXPECT_TRUE(sim_of(0).accessible_from(1, after, after_bytes)) << "and spans mapped later";
    EXPECT_EQ(layer.free_async(before, nullptr, stream_mode::legacy), success);
    EXPECT_EQ(layer.free_async(after, nullptr, stream_mode::legacy), success);
  }

  fake_runtime runtime_;
  std::array<std::unique_ptr<allocator_stack>, 4> stacks_;
  bool fail_build_ = false;
};

TEST_F(InterposerTest, MallocServesFromFragctlAndRecordsOwnership) {
  interposer layer(cuda_runtime, &resolve_fake, false, source());
  void* p = nullptr;
  ASSERT_EQ(layer.malloc(&p, 3 << 20), success);
  ASSERT_NE(p, nullptr);
  const auto block = layer.find(p);
  ASSERT_TRUE(block.has_value());
  EXPECT_EQ(block->size, std::size_t{3} << 20);
  EXPECT_EQ(block->device, 0);
  EXPECT_EQ(block->stream, nullptr);
  EXPECT_EQ(stats(0).requested.current, std::size_t{3} << 20);
  EXPECT_TRUE(runtime_.freed.empty());
  EXPECT_EQ(layer.free_async(p, nullptr, stream_mode::legacy), success);
}

TEST_F(InterposerTest, IpcHandlesOfArenaMemoryAreRefusedNotPassedToTheRuntime) {
  interposer layer(cuda_runtime, &resolve_fake, false, source("arena"));
  void* p = nullptr;
  ASSERT_EQ(layer.malloc(&p, 3 << 20), success);
  char handle[64] = {};
  EXPECT_EQ(layer.ipc_get_mem_handle(handle, p), error_invalid_value) << "mapped memory has no runtime handle";
  EXPECT_EQ(layer.ipc_get_mem_handle(handle, static_cast<char*>(p) + 4096), error_invalid_value)
      << "nor does the inside of a block";
  EXPECT_TRUE(runtime_.calls.empty()) << "the runtime never saw it";
  int foreign = 0;
  EXPECT_EQ(layer.ipc_get_mem_handle(handle, &foreign), success) << "memory fragctl does not hold goes through";
  EXPECT_EQ(runtime_.calls, std::vector<std::string>{"ipc_get_mem_handle"});
  EXPECT_EQ(layer.free_async(p, nullptr, stream_mode::legacy), success);
}

TEST_F(InterposerTest, IpcHandlesOfCachingBlocksPassOnlyAtTheStartOfASegment) {
  interposer layer(cuda_runtime, &resolve_fake, false, source("caching"));
  void* first = nullptr;
  void* second = nullptr;
  ASSERT_EQ(layer.malloc(&first, 4096), success);
  ASSERT_EQ(layer.malloc(&second, 4096), success);  // in the same small segment, after `first`
  char handle[64] = {};
  EXPECT_EQ(layer.ipc_get_mem_handle(handle, second), error_invalid_value)
      << "the importer would open the segment's start, not this block";
  EXPECT_TRUE(runtime_.calls.empty());
  EXPECT_EQ(layer.ipc_get_mem_handle(handle, first), success) << "the segment's first block is its start";
  EXPECT_EQ(runtime_.calls, std::vector<std::string>{"ipc_get_mem_handle"});
  EXPECT_EQ(layer.free_async(first, nullptr, stream_mode::legacy), success);
  EXPECT_EQ(layer.free_async(second, nullptr, stream_mode::legacy), success);
}

// cudaDeviceEnablePeerAccess(peer) on device D (issue 30, item 4): the real
// function first, then peer's arena grants D every span it mapped and maps
// later, as the native route's enablePeerAccess does.
TEST_F(InterposerTest, EnablingPeerAccessGrantsThePeersArenaToTheCurrentDevice) {
  interposer layer(cuda_runtime, &resolve_fake, false, source("arena", ",sim_devices:2"));
  expect_grant_to_device_1(layer, [&] {
    EXPECT_EQ(layer.device_enable_peer_access(0, 0), success);
    EXPECT_EQ(runtime_.calls, std::vector<std::string>{"enable_peer_access 0 on 1"}) << "the runtime's call first";
  });
  // Enabled already (a call after a failed grant, or twice): the grant is
  // made again and the runtime's code returned.
  runtime_.current_device = 1;
  runtime_.peer_access_result = error_peer_access_already_enabled;
  EXPECT_EQ(layer.device_enable_peer_access(0, 0), error_peer_access_already_enabled);
  EXPECT_EQ(runtime_.calls.size(), 2u);
}

// PyTorch's cudaMallocAsync backend enables a peer with cudaMemPoolSetAccess
// on the default pool of the device whose memory is read (seen on 2x H100:
// without this, a kernel on cuda:1 reading cuda:0's arena memory faulted).
TEST_F(InterposerTest, SettingAccessOnADefaultPoolGrantsThatDevicesArena) {
  interposer layer(cuda_runtime, &resolve_fake, false, source("arena", ",sim_devices:2"));
  // A pool that is no device's default pool: passed through, no allocator
  // built or granted, and no runtime call failed on the way (its error
  // would stay for the program's next cudaGetLastError).
  const mem_access_desc to_1{mem_location_type_device, 1, 3};
  EXPECT_EQ(layer.mem_pool_set_access(reinterpret_cast<void*>(pool_base + 9), &to_1, 1), success);
  EXPECT_EQ(runtime_.calls.back(), "pool_set_access 9 1");
  EXPECT_FALSE(built(0)) << "a pool of the program's own is the runtime's alone";
  for (const std::string& call : runtime_.calls) {
    EXPECT_EQ(call.find("of no device"), std::string::npos) << "a failed runtime call left its error: " << call;
  }
  void* pool0 = nullptr;
  ASSERT_EQ(fake_default_pool(&pool0, 0), success);
  expect_grant_to_device_1(layer, [&] {
    // Device 0's default pool (PyTorch's CUDAGuard(dev) makes device 1 current).
    const mem_access_desc descs[] = {{mem_location_type_device, 0, 3}, {mem_location_type_device, 1, 3}};
    EXPECT_EQ(layer.mem_pool_set_access(pool0, descs, 2), success);
    EXPECT_EQ(runtime_.calls.back(), "pool_set_access 0 0 1") << "the runtime's call first, unchanged";
  });
}

TEST_F(InterposerTest, PeerAccessTheRuntimeRefusesGrantsNothing) {
  interposer layer(cuda_runtime, &resolve_fake, false, source("arena", ",sim_devices:2"));
  runtime_.peer_access_result = error_invalid_device;
  runtime_.current_device = 1;
  EXPECT_EQ(layer.device_enable_peer_access(0, 0), error_invalid_device);
  EXPECT_FALSE(built(0)) << "no allocator built for a refused call";
  runtime_.current_device = 0;
  void* p = nullptr;
  ASSERT_EQ(layer.malloc(&p, 1 << 20), success);
  EXPECT_FALSE(sim_of(0).accessible_from(1, p, 1 << 20));
  EXPECT_EQ(layer.free_async(p, nullptr, stream_mode::legacy), success);
}

TEST_F(InterposerTest, APeerFragctlCannotGrantIsAnErrorCodeWithALogLine) {
  interposer layer(cuda_runtime, &resolve_fake, false, source("arena"));  // a machine of one sim device
  runtime_.current_device = 1;
  const fragctl::testing::log_capture log;
  EXPECT_EQ(layer.device_enable_peer_access(0, 0), error_unknown);
  EXPECT_NE(log.text().find("DeviceEnablePeerAccess(0): granting device 1 access"), std::string::npos)
      << log.text();
}

TEST_F(InterposerTest, PeerAccessWithoutARuntimeIsNotInitialized) {
  interposer layer(cuda_runtime, &resolve_nothing, false, source("arena"));
  EXPECT_EQ(layer.device_enable_peer_access(1, 0), error_not_initialized);
  EXPECT_FALSE(built(1));
}

// Pause and resume on the LD_PRELOAD route: the layer serves from the
// process-default allocators, which the C API reaches with
// fragctl_default_allocator, so a program under LD_PRELOAD pauses the
// memory its cudaMalloc calls got (docs/interop.md).
TEST_F(InterposerTest, TheCApiPausesTheProcessDefaultAllocatorTheLayerServesFrom) {
  ASSERT_EQ(fragctl_configure_defaults("arena", "sim_capacity:1GiB,sim_backed:true", "sim"), FRAGCTL_OK)
      << fragctl_last_error();
  interposer layer(cuda_runtime, &resolve_fake, false, process_default_allocators(), process_default_stacks());
  constexpr std::size_t bytes = 3 << 20;
  void* p = nullptr;
  ASSERT_EQ(layer.malloc(&p, bytes), success);
  std::memset(p, 0x3c, bytes);
  fragctl_allocator* a = nullptr;
  ASSERT_EQ(fragctl_default_allocator(0, 0, &a), FRAGCTL_OK);
  ASSERT_NE(a, nullptr) << "the layer built device 0's default allocator";
  ASSERT_EQ(fragctl_pause(a, FRAGCTL_PAUSE_KEEP_HOST), FRAGCTL_OK) << fragctl_last_error();
  void* q = nullptr;
  EXPECT_NE(layer.malloc(&q, 4096), success) << "the layer's allocator is the one paused";
  EXPECT_EQ(q, nullptr);
  ASSERT_EQ(fragctl_resume(a), FRAGCTL_OK) << fragctl_last_error();
  EXPECT_EQ(static_cast<unsigned char*>(p)[bytes - 1], 0x3c) << "the same address, the same bytes";
  EXPECT_EQ(layer.free_async(p, nullptr, stream_mode::legacy), success);
}

TEST_F(InterposerTest, FreeSynchronizesTheDeviceBeforeTheBlockIsReleased) {
  interposer layer(cuda_runtime, &resolve_fake, false, source());
  void* p = nullptr;
  ASSERT_EQ(layer.malloc(&p, 1 << 20), success);
  std::size_t live_at_synchronize = 0;
  runtime_.on_synchronize = [&] { live_at_synchronize = stats(0).requested.current; };
  ASSERT_EQ(layer.free(p), success);
  EXPECT_EQ(runtime_.calls, std::vector<std::string>{"synchronize 0"});
  EXPECT_EQ(live_at_synchronize, std::size_t{1} << 20);  // still held while the device drained
  EXPECT_EQ(stats(0).requested.current, 0u);
  EXPECT_EQ(stats(0).frees, 1u);
  EXPECT_FALSE(layer.find(p).has_value());
  EXPECT_TRUE(runtime_.freed.empty());  // the real cudaFree never saw it
}

TEST_F(InterposerTest, NullAndForeignPointersGoToTheRealFunctions) {
  interposer layer(cuda_runtime, &resolve_fake, false, source());
  int foreign = 0;
  EXPECT_EQ(layer.free(nullptr), success);
  EXPECT_EQ(layer.free(&foreign), success);
  EXPECT_EQ(runtime_.freed, (std::vector<void*>{nullptr, &foreign}));
  EXPECT_EQ(layer.free_async(&foreign, stream_a, stream_mode::legacy), success);
  EXPECT_EQ(layer.free_async(nullptr, nullptr, stream_mode::per_thread), success);
  ASSERT_EQ(runtime_.freed_async.size(), 2u);
  EXPECT_EQ(runtime_.freed_async[0], std::make_pair(static_cast<void*>(&foreign), stream_a));
  EXPECT_EQ(runtime_.calls.back(), "free_async_ptsz");  // the _ptsz form goes to the real _ptsz form
  EXPECT_EQ(runtime_.freed_async[1].second, nullptr);   // the caller's stream, untouched
  EXPECT_FALSE(built(0));  // pass-through builds no allocator
}

// A second free of a block (free then free, free_async then free, free then
// free_async) finds a pointer the layer no longer owns but into memory
// fragctl still holds: a caching segment's start, the arena's fallback
// block, a mapped span. Before, it went to the real function, which on a
// GPU frees that memory under fragctl (cudaFree takes the primary context's
// cuMemAlloc memory), and the next cudaMalloc was served from it.
TEST_F(InterposerTest, ASecondFreeOfAFragctlBlockNeverReachesTheRealFunction) {
  for (const char* options : {"", ",sim_virtual_memory:false"}) {
    for (const std::string policy : {"caching", "arena"}) {
      SCOPED_TRACE(policy + options);
      stacks_ = {};
      runtime_ = {};
      interposer layer(cuda_runtime, &resolve_fake, false, source(policy, options));
      void* p = nullptr;
      ASSERT_EQ(layer.malloc(&p, 1 << 20), success);
      ASSERT_EQ(layer.free_async(p, stream_a, stream_mode::legacy), success);
      EXPECT_EQ(layer.free(p), error_invalid_value);
      EXPECT_EQ(layer.free_async(p, stream_a, stream_mode::legacy), error_invalid_value);
      EXPECT_TRUE(runtime_.freed.empty()) << "the real cudaFree was given fragctl's memory";
      EXPECT_TRUE(runtime_.freed_async.empty()) << "the real cudaFreeAsync was given fragctl's memory";
      EXPECT_EQ(stats(0).frees, 1u);
      EXPECT_EQ(stats(0).requested.current, 0u);
      // fragctl goes on as before, the block's memory its own.
      void* q = nullptr;
      ASSERT_EQ(layer.malloc(&q, 1 << 20), success);
      ASSERT_EQ(layer.free(q), success);
      EXPECT_EQ(stats(0).requested.current, 0u);
      // Positive control: memory fragctl does not hold still goes to the real function.
      int foreign = 0;
      EXPECT_EQ(layer.free(&foreign), success);
      EXPECT_EQ(runtime_.freed, std::vector<void*>{&foreign});
    }
  }
}

// cudaStreamDestroy: the allocator waits for the stream and forgets it
// (stream_ending), the layer's records of its live blocks name the default
// stream, then the real function destroys it (here: the sim stream). After,
// nothing fragctl does names the destroyed stream: the free of a block
// allocated on it, reuse on another stream, the trim. A stream fragctl
// never met goes straight through.
TEST_F(InterposerTest, StreamDestroyTellsTheAllocatorFirstThenTheRuntime) {
  for (const char* policy : {"arena", "caching", "buckets:caching"}) {
    SCOPED_TRACE(policy);
    stacks_ = {};
    runtime_.destroyed_streams.clear();
    interposer layer(cuda_runtime, &resolve_fake, false, source(policy));
    EXPECT_EQ(layer.stream_destroy(stream_b), success);  // nothing allocated yet
    void* warm = nullptr;
    ASSERT_EQ(layer.malloc(&warm, 4096), success);  // builds device 0's allocator
    auto& device = const_cast<sim_backend&>(sim_of(0));
    const stream_t s = device.create_stream();
    runtime_.on_stream_destroy = [&](void* gone) { device.destroy_stream(gone); };
    void* p = nullptr;
    ASSERT_EQ(layer.malloc_async(&p, 1 << 20, s, stream_mode::legacy), success);
    ASSERT_EQ(layer.free_async(p, s, stream_mode::legacy), success);
    void* of_default = nullptr;
    ASSERT_EQ(layer.malloc(&of_default, 1 << 20), success);
    ASSERT_EQ(layer.free_async(of_default, s, stream_mode::legacy), success);
    void* live = nullptr;
    ASSERT_EQ(layer.malloc_async(&live, 4096, s, stream_mode::legacy), success);
    testing::log_capture log;
    EXPECT_EQ(layer.stream_destroy(s), success);
    runtime_.on_stream_destroy = nullptr;
    EXPECT_EQ(runtime_.destroyed_streams, (std::vector<void*>{stream_b, s}));
    // A live block of the ended stream: cudaFree frees it on the default stream.
    ASSERT_TRUE(layer.find(live).has_value());
    EXPECT_EQ(layer.find(live)->stream, nullptr);
    EXPECT_EQ(layer.free(live), success);
    void* q = nullptr;
    ASSERT_EQ(layer.malloc_async(&q, 1 << 20, stream_b, stream_mode::legacy), success);
    ASSERT_EQ(layer.free_async(q, stream_b, stream_mode::legacy), success);
    ASSERT_EQ(layer.free(warm), success);
    EXPECT_NO_THROW(stacks_[0]->allocator().release_cached());
    EXPECT_EQ(stats(0).requested.current, 0u);
    EXPECT_EQ(device.destroyed_stream_calls(), 0u) << "fragctl named the stream after cudaStreamDestroy";
    EXPECT_EQ(log.text().find("could not"), std::string::npos) << log.text();
  }
}

// A cudaFree on one thread waits for the device; meanwhile another thread
// destroys the block's stream s (the wait holds no lock, so the destroy
// runs to its end). The free then takes the block's record, which names
// the default stream by now: it must not reach the allocator naming s,
// which the allocator forgot (it would record an event on the destroyed
// stream).
TEST_F(InterposerTest, AFreeInFlightWhileItsStreamIsDestroyedNeverNamesTheStream) {
  for (const char* policy : {"caching", "arena"}) {
    SCOPED_TRACE(policy);
    stacks_ = {};
    interposer layer(cuda_runtime, &resolve_fake, false, source(policy));
    void* warm = nullptr;
    ASSERT_EQ(layer.malloc(&warm, 4096), success);
    auto& device = const_cast<sim_backend&>(sim_of(0));
    const stream_t s = device.create_stream();
    runtime_.on_stream_destroy = [&](void* gone) { device.destroy_stream(gone); };
    void* p = nullptr;
    ASSERT_EQ(layer.malloc_async(&p, 1 << 20, s, stream_mode::legacy), success);
    std::thread destroyer;
    std::atomic<bool> destroyed{false};
    runtime_.on_synchronize = [&] {
      if (destroyer.joinable()) return;
      destroyer = std::thread([&] {
        EXPECT_EQ(layer.stream_destroy(s), success);
        destroyed = true;
      });
      // Time for the destroy to run to its end, had the free not held it off.
      for (int i = 0; i < 50 && !destroyed; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    };
    EXPECT_EQ(layer.free(p), success);
    destroyer.join();
    runtime_.on_synchronize = nullptr;
    runtime_.on_stream_destroy = nullptr;
    ASSERT_EQ(layer.free(warm), success);
    EXPECT_NO_THROW(stacks_[0]->allocator().release_cached());
    EXPECT_EQ(device.destroyed_stream_calls(), 0u) << "the free named the stream the allocator had forgotten";
  }
}

// Only a stream the layer named to fragctl is waited for: a library's own
// stream (NCCL's, whose work ncclCommAbort may leave never ending) goes to
// the runtime at once, as without fragctl. A stream a block was allocated
// or freed on is waited for once, then is a stranger again.
TEST_F(InterposerTest, AStreamFragctlNeverMetIsDestroyedWithoutAWait) {
  interposer layer(cuda_runtime, &resolve_fake, false, source("arena"));
  void* warm = nullptr;
  ASSERT_EQ(layer.malloc(&warm, 4096), success);
  const sim_backend& device = sim_of(0);
  const auto waits = [&] { return device.counters().of(backend_call::synchronize_stream); };
  const std::uint64_t before = waits();
  EXPECT_EQ(layer.stream_destroy(stream_b), success);
  EXPECT_EQ(waits(), before) << "a stream fragctl never met was waited for";
  void* p = nullptr;
  ASSERT_EQ(layer.malloc(&p, 4096), success);
  ASSERT_EQ(layer.free_async(p, stream_a, stream_mode::legacy), success);  // freed on it: met
  EXPECT_EQ(layer.stream_destroy(stream_a), success);
  const std::uint64_t after_met = waits();
  EXPECT_GT(after_met, before) << "the stream a block was freed on was not waited for";
  EXPECT_EQ(layer.stream_destroy(stream_a), success);  // the handle again: a new stream, never met
  EXPECT_EQ(waits(), after_met);
  EXPECT_EQ(runtime_.destroyed_streams, (std::vector<void*>{stream_b, stream_a, stream_a}));
  ASSERT_EQ(layer.free(warm), success);
}

// A cudaFree waiting for the device while another thread destroys a stream:
// the wait holds no lock, so the destroy runs to its end meanwhile, and a
// third thread's cudaFreeAsync goes through. Had the free held the
// stream's end off across its wait, the destroy would wait for the device
// (whatever it waits for: a deadlock where that is the destroying thread),
// and with a lock that lets writers go first, every later free behind it.
// The device's wait here ends when the destroy has, or after 2 s.
TEST_F(InterposerTest, AFreeWaitingForTheDeviceHoldsNoOtherFreeBehindAStreamDestroy) {
  interposer layer(cuda_runtime, &resolve_fake, false, source("caching"));
  void* warm = nullptr;
  ASSERT_EQ(layer.malloc(&warm, 4096), success);
  auto& device = const_cast<sim_backend&>(sim_of(0));
  const stream_t s = device.create_stream();
  runtime_.on_stream_destroy = [&](void* gone) { device.destroy_stream(gone); };
  void* p = nullptr;
  void* q = nullptr;
  ASSERT_EQ(layer.malloc_async(&p, 1 << 20, s, stream_mode::legacy), success);
  ASSERT_EQ(layer.malloc_async(&q, 4096, nullptr, stream_mode::legacy), success);
  std::atomic<bool> waiting{false};
  std::atomic<bool> destroyed{false};
  std::atomic<bool> capped{false};
  runtime_.on_synchronize = [&] {
    waiting = true;
    const auto cap = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (!destroyed && std::chrono::steady_clock::now() < cap) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    capped = !destroyed;
  };
  std::thread first([&] { EXPECT_EQ(layer.free(p), success); });
  while (!waiting) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::thread destroyer([&] {
    EXPECT_EQ(layer.stream_destroy(s), success);
    destroyed = true;
  });
  EXPECT_EQ(layer.free_async(q, nullptr, stream_mode::legacy), success);
  first.join();
  destroyer.join();
  runtime_.on_synchronize = nullptr;
  runtime_.on_stream_destroy = nullptr;
  EXPECT_FALSE(capped) << "the stream's destroy waited for a free's device wait";
  ASSERT_EQ(layer.free(warm), success);
  EXPECT_EQ(device.destroyed_stream_calls(), 0u);
}

// The same race where the window is narrowest: between the free taking the
// block's record and the allocator freeing it (here: the allocator's free
// starts the destroy on another thread and gives it time before it goes
// on). The destroy must wait for the free to finish; had it forgotten the
// stream meanwhile, the free would reach the policy naming it.
class destroy_during_free final : public forwarding_adaptor {
 public:
  explicit destroy_during_free(std::unique_ptr<device_allocator> upstream)
      : forwarding_adaptor(std::move(upstream), "destroy_during_free") {}
  std::function<void()> during;

 private:
  free_result do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override {
    if (during) std::exchange(during, nullptr)();
    return upstream().try_deallocate(ptr, bytes, stream);
  }
};

TEST_F(InterposerTest, AStreamDestroyWaitsForAFreeBetweenItsRecordAndItsFree) {
  auto backend = std::make_unique<sim_backend>();
  sim_backend& device = *backend;
  auto allocator = std::make_unique<destroy_during_free>(make_policy("caching", config{}, device));
  allocator_source source = [&](int d, bool) -> device_allocator* { return d == 0 ? allocator.get() : nullptr; };
  interposer layer(cuda_runtime, &resolve_fake, false, source);
  const stream_t s = device.create_stream();
  runtime_.on_stream_destroy = [&](void* gone) { device.destroy_stream(gone); };
  void* p = nullptr;
  ASSERT_EQ(layer.malloc_async(&p, 1 << 20, s, stream_mode::legacy), success);
  std::thread destroyer;
  std::atomic<bool> destroyed{false};
  allocator->during = [&] {
    destroyer = std::thread([&] {
      EXPECT_EQ(layer.stream_destroy(s), success);
      destroyed = true;
    });
    for (int i = 0; i < 50 && !destroyed; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  };
  EXPECT_EQ(layer.free_async(p, s, stream_mode::legacy), success);
  destroyer.join();
  runtime_.on_stream_destroy = nullptr;
  allocator->release_cached();
  EXPECT_EQ(device.destroyed_stream_calls(), 0u) << "the free reached the policy naming a stream it had forgotten";
  allocator.reset();
}

// An allocator whose forgetting runs out of host memory (caching re-files
// its free blocks in new entries): it forgot nothing, so the stream must
// live on. cudaStreamDestroy leaves it undestroyed and answers
// cudaErrorMemoryAllocation with a log line; the program's next call on
// the stream stays valid. (Destroyed, the stream would die under the
// allocator that still names it.)
class forgetting_fails final : public forwarding_adaptor {
 public:
  explicit forgetting_fails(std::unique_ptr<device_allocator> upstream)
      : forwarding_adaptor(std::move(upstream), "forgetting_fails") {}
  bool fail = true;

 private:
  void do_stream_ending(stream_t stream) override {
    if (fail) throw std::bad_alloc();
    forget_stream(upstream(), stream);
    ++forgotten;
  }

 public:
  int forgotten = 0;
};

TEST_F(InterposerTest, AStreamTheAllocatorCouldNotForgetIsNotDestroyed) {
  auto backend = std::make_unique<sim_backend>();
  sim_backend& device = *backend;
  auto allocator = std::make_unique<forgetting_fails>(make_policy("caching", config{}, device));
  allocator_source source = [&](int d, bool) -> device_allocator* { return d == 0 ? allocator.get() : nullptr; };
  interposer layer(cuda_runtime, &resolve_fake, false, source);
  const stream_t s = device.create_stream();
  void* p = nullptr;
  ASSERT_EQ(layer.malloc_async(&p, 1 << 20, s, stream_mode::legacy), success);
  ASSERT_EQ(layer.free_async(p, s, stream_mode::legacy), success);
  testing::log_capture log;
  EXPECT_EQ(layer.stream_destroy(s), error_out_of_memory);
  EXPECT_TRUE(runtime_.destroyed_streams.empty()) << "the stream was destroyed under the allocator";
  EXPECT_NE(log.text().find("not destroyed: out of host memory"), std::string::npos) << log.text();
  allocator->fail = false;
  EXPECT_EQ(layer.stream_destroy(s), success);
  EXPECT_EQ(allocator->forgotten, 1) << "the retry went to the runtime without the allocator forgetting the stream";
  EXPECT_EQ(runtime_.destroyed_streams, std::vector<void*>{s});
  allocator.reset();
  device.destroy_stream(s);
}

TEST_F(InterposerTest, AsyncCallsAreStreamOrderedOnTheGivenStream) {
  interposer layer(cuda_runtime, &resolve_fake, false, source());
  void* p = nullptr;
  ASSERT_EQ(layer.malloc_async(&p, 1 << 20, stream_a, stream_mode::legacy), success);
  EXPECT_EQ(layer.find(p)->stream, stream_a);
  ASSERT_EQ(layer.free_async(p, stream_a, stream_mode::legacy), success);
  EXPECT_TRUE(runtime_.calls.empty());  // no synchronization
  void* again = nullptr;
  ASSERT_EQ(layer.malloc_async(&again, 1 << 20, stream_a, stream_mode::legacy), success);
  EXPECT_EQ(again, p);  // reused at once on the same stream
  ASSERT_EQ(layer.free_async(again, stream_a, stream_mode::legacy), success);
  EXPECT_EQ(stats(0).requested.current, 0u);
}

TEST_F(InterposerTest, StreamHandlesAreCanonical) {
  EXPECT_EQ(interposer::canonical_stream(nullptr, stream_mode::legacy), nullptr);
  EXPECT_EQ(interposer::canonical_stream(legacy_stream, stream_mode::legacy), nullptr);
  EXPECT_EQ(interposer::canonical_stream(legacy_stream, stream_mode::per_thread), nullptr);
  EXPECT_EQ(interposer::canonical_stream(nullptr, stream_mode::per_thread), per_thread_stream);
  EXPECT_EQ(interposer::canonical_stream(stream_b, stream_mode::per_thread), stream_b);

  interposer layer(cuda_runtime, &resolve_fake, false, source());
  void* p = nullptr;
  ASSERT_EQ(layer.malloc_async(&p, 4096, nullptr, stream_mode::per_thread), success);
  EXPECT_EQ(layer.find(p)->stream, per_thread_stream);
  void* q = nullptr;
  ASSERT_EQ(layer.malloc_async(&q, 4096, legacy_stream, stream_mode::legacy), success);
  EXPECT_EQ(layer.find(q)->stream, nullptr);
  EXPECT_EQ(layer.free_async(p, nullptr, stream_mode::per_thread), success);
  EXPECT_EQ(layer.free_async(q, legacy_stream, stream_mode::legacy), success);
  EXPECT_EQ(layer.owned_count(), 0u);
}

TEST_F(InterposerTest, EachDeviceHasItsAllocatorAndFreeFollowsTheBlock) {
  interposer layer(cuda_runtime, &resolve_fake, false, source());
  void* on0 = nullptr;
  void* on1 = nullptr;
  ASSERT_EQ(layer.malloc(&on0, 1 << 20), success);
  runtime_.current_device = 1;
  ASSERT_EQ(layer.malloc(&on1, 2 << 20), success);
  EXPECT_EQ(layer.find(on1)->device, 1);
  EXPECT_EQ(stats(1).requested.current, std::size_t{2} << 20);
  EXPECT_EQ(stats(0).requested.current, std::size_t{1} << 20);

  // Device 1 is current; freeing device 0's block synchronizes device 0.
  ASSERT_EQ(layer.free(on0), success);
  EXPECT_EQ(runtime_.calls, (std::vector<std::string>{"set_device 0", "synchronize 0", "set_device 1"}));
  EXPECT_EQ(runtime_.current_device, 1);
  EXPECT_EQ(stats(0).requested.current, 0u);
  // An async free goes to the block's allocator whatever device is current.
  runtime_.current_device = 0;
  ASSERT_EQ(layer.free_async(on1, stream_a, stream_mode::legacy), success);
  EXPECT_EQ(stats(1).requested.current, 0u);
}

TEST_F(InterposerTest, MemGetInfoCountsTheCacheAsFree) {
  interposer layer(cuda_runtime, &resolve_fake, false, source());
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  ASSERT_EQ(layer.mem_get_info(&free_bytes, &total_bytes), success);
  EXPECT_EQ(free_bytes, runtime_.device_free);  // no allocator yet: the real figures
  EXPECT_EQ(total_bytes, runtime_.device_total);
  EXPECT_FALSE(built(0));

  void* p = nullptr;
  ASSERT_EQ(layer.malloc_async(&p, 30 << 20, stream_a, stream_mode::legacy), success);
  ASSERT_EQ(layer.free_async(p, stream_a, stream_mode::legacy), success);
  const std::size_t cached = stacks_[0]->allocator().state().cached_free;
  ASSERT_GT(cached, 0u);
  ASSERT_EQ(layer.mem_get_info(&free_bytes, &total_bytes), success);
  EXPECT_EQ(free_bytes, runtime_.device_free + cached);

  runtime_.device_free = runtime_.device_total;  // never reports more than total
  ASSERT_EQ(layer.mem_get_info(&free_bytes, &total_bytes), success);
  EXPECT_EQ(free_bytes, total_bytes);
  EXPECT_EQ(layer.mem_get_info(nullptr, &total_bytes), error_invalid_value);
}

TEST_F(InterposerTest, ErrorsAreRuntimeCodes) {
  interposer layer(cuda_runtime, &resolve_fake, false, source());
  void* p = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(layer.malloc(&p, std::size_t{4} << 30), error_out_of_memory);  // sim has 1 GiB
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(stats(0).ooms, 1u);
  EXPECT_EQ(layer.malloc(nullptr, 16), error_invalid_value);
  EXPECT_EQ(layer.malloc(&p, 0), success);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(layer.owned_count(), 0u);

  fail_build_ = true;
  runtime_.current_device = 2;
  EXPECT_EQ(layer.malloc(&p, 16), error_not_initialized);
  EXPECT_EQ(layer.malloc_async(&p, 16, stream_a, stream_mode::legacy), error_not_initialized);
}

// Issue 18: cudaMalloc(SIZE_MAX) returned 3 (initialization error), as every
// invalid_argument did, and used up the layer's once-only build-failure log.
TEST_F(InterposerTest, OversizedRequestIsOutOfMemoryAndLeavesTheBuildFailureLog) {
  interposer layer(cuda_runtime, &resolve_fake, false, source());
  void* p = reinterpret_cast<void*>(0x1);
  {
    const fragctl::testing::log_capture log;
    EXPECT_EQ(layer.malloc(&p, SIZE_MAX), error_out_of_memory);
    EXPECT_EQ(p, nullptr);
    EXPECT_EQ(layer.malloc_async(&p, (std::size_t{1} << 62) + 1, stream_a, stream_mode::legacy),
              error_out_of_memory);
    EXPECT_NE(log.text().find("larger than any device"), std::string::npos) << log.text();
  }
  EXPECT_EQ(layer.malloc(&p, 16), success);  // the allocator of device 0 works
  EXPECT_EQ(layer.free(p), success);

  fail_build_ = true;
  runtime_.current_device = 1;
  const fragctl::testing::log_capture log;
  EXPECT_EQ(layer.malloc(&p, 16), error_not_initialized);
  EXPECT_NE(log.text().find("unknown key"), std::string::npos)
      << "the first build failure is still logged at error level: " << log.text();
}

TEST_F(InterposerTest, FreeReportsASynchronizationErrorAndStillFrees) {
  interposer layer(cuda_runtime, &resolve_fake, false, source());
  void* p = nullptr;
  ASSERT_EQ(layer.malloc(&p, 4096), success);
  runtime_.synchronize_result = 719;  // cudaErrorLaunchFailure: sticky, from earlier work
  EXPECT_EQ(layer.free(p), 719);
  EXPECT_EQ(stats(0).requested.current, 0u);
  EXPECT_EQ(layer.owned_count(), 0u);
}

TEST_F(InterposerTest, RealFunctionsAreLookedUpLazilyAndOnce) {
  interposer layer(cuda_runtime, &resolve_fake, false, source());
  EXPECT_TRUE(runtime_.lookups.empty());
  for (int i = 0; i < 3; ++i) {
    void* p = nullptr;
    ASSERT_EQ(layer.malloc(&p, 4096), success);
    ASSERT_EQ(layer.free(p), success);
  }
  EXPECT_EQ(runtime_.lookups["cudaGetDevice"], 1);
  EXPECT_EQ(runtime_.lookups["cudaDeviceSynchronize"], 1);
  EXPECT_EQ(runtime_.lookups.count("cudaFree"), 0u);  // never needed
}

TEST_F(InterposerTest, WithoutARuntimeOwnBlocksStillWork) {
  interposer layer(cuda_runtime, &resolve_nothing, false, source());
  void* p = nullptr;
  ASSERT_EQ(layer.malloc(&p, 4096), success);  // device 0 when cudaGetDevice is missing
  EXPECT_EQ(layer.free(p), success);
  EXPECT_EQ(stats(0).frees, 1u);
  EXPECT_EQ(layer.free(nullptr), success);
  int foreign = 0;
  EXPECT_EQ(layer.free(&foreign), error_invalid_value);
  std::size_t f = 0;
  std::size_t t = 0;
  EXPECT_EQ(layer.mem_get_info(&f, &t), success);  // from the backend
  EXPECT_EQ(t, std::size_t{1} << 30);
}

TEST_F(InterposerTest, HipUsesTheHipNames) {
  std::vector<std::string> asked;
  static std::vector<std::string>* names = nullptr;
  names = &asked;
  interposer layer(hip_runtime, [](const char* name) -> void* {
    names->emplace_back(name);
    return nullptr;
  }, false, source());
  void* p = nullptr;
  ASSERT_EQ(layer.malloc(&p, 4096), success);
  ASSERT_EQ(layer.free(p), success);
  EXPECT_EQ(asked.front(), "hipGetDevice");
  EXPECT_NE(std::find(asked.begin(), asked.end(), "hipDeviceSynchronize"), asked.end());
  names = nullptr;
}

std::uint64_t attribute(interposer& layer, void* pool, int attribute) {
  std::uint64_t value = 0;
  EXPECT_EQ(layer.mem_pool_get_attribute(pool, attribute, &value), success);
  return value;
}

TEST_F(InterposerTest, DefaultPoolStatisticsAreFragctls) {
  interposer layer(cuda_runtime, &resolve_fake, false, source(), stacks());
  void* pool = nullptr;
  ASSERT_EQ(layer.device_get_default_mem_pool(&pool, 1), success);
  EXPECT_EQ(pool, reinterpret_cast<void*>(pool_base + 1));  // the real handle
  EXPECT_EQ(attribute(layer, pool, pool_attr_used_mem_current), 0u);  // no allocator yet
  EXPECT_FALSE(built(1));

  runtime_.current_device = 1;
  void* p = nullptr;
  ASSERT_EQ(layer.malloc_async(&p, 3 << 20, stream_a, stream_mode::legacy), success);
  allocator_stats s = stats(1);
  EXPECT_EQ(attribute(layer, pool, pool_attr_used_mem_current), s.allocated.current);
  EXPECT_EQ(attribute(layer, pool, pool_attr_reserved_mem_current), s.reserved.current);
  ASSERT_EQ(layer.free_async(p, stream_a, stream_mode::legacy), success);
  EXPECT_EQ(attribute(layer, pool, pool_attr_used_mem_current), 0u);
  EXPECT_EQ(attribute(layer, pool, pool_attr_used_mem_high), s.allocated.current);
  EXPECT_EQ(attribute(layer, pool, pool_attr_reserved_mem_high), s.reserved.current);

  // Setting a high to 0 starts a new window at the current figures.
  std::uint64_t zero = 0;
  std::uint64_t one = 1;
  EXPECT_EQ(layer.mem_pool_set_attribute(pool, pool_attr_used_mem_high, &one), error_invalid_value);
  ASSERT_EQ(layer.mem_pool_set_attribute(pool, pool_attr_used_mem_high, &zero), success);
  EXPECT_EQ(attribute(layer, pool, pool_attr_used_mem_high), 0u);
  const std::uint64_t cache = attribute(layer, pool, pool_attr_reserved_mem_current);
  EXPECT_GE(cache, std::uint64_t{3} << 20);
  EXPECT_EQ(attribute(layer, pool, pool_attr_reserved_mem_high), cache);

  // Trim releases fragctl's cache, then trims the real pool.
  ASSERT_EQ(layer.mem_pool_trim_to(pool, 0), success);
  EXPECT_EQ(attribute(layer, pool, pool_attr_reserved_mem_current), 0u);
  EXPECT_EQ(stats(1).reserved.current, 0u);
  EXPECT_EQ(runtime_.pool_calls, (std::vector<std::pair<void*, int>>{{pool, -1}}));
  EXPECT_EQ(layer.mem_pool_get_attribute(pool, pool_attr_used_mem_current, nullptr), error_invalid_value);
}

TEST_F(InterposerTest, OtherPoolsAndAttributesAreTheRuntimes) {
  interposer layer(cuda_runtime, &resolve_fake, false, source(), stacks());
  void* pool = nullptr;
  ASSERT_EQ(layer.device_get_default_mem_pool(&pool, 0), success);
  void* other = reinterpret_cast<void*>(pool_base + 9);  // never given as a default pool
  std::uint64_t threshold = 1 << 30;
  EXPECT_EQ(attribute(layer, other, pool_attr_used_mem_current), real_pool_value);
  EXPECT_EQ(attribute(layer, pool, pool_attr_release_threshold), real_pool_value);
  EXPECT_EQ(layer.mem_pool_set_attribute(pool, pool_attr_release_threshold, &threshold), success);
  EXPECT_EQ(layer.mem_pool_set_attribute(pool, pool_attr_used_mem_current, &threshold), success);  // the runtime says
  EXPECT_EQ(layer.mem_pool_trim_to(other, 0), success);
  EXPECT_EQ(runtime_.pool_calls,
            (std::vector<std::pair<void*, int>>{{other, pool_attr_used_mem_current},
                                                {pool, pool_attr_release_threshold},
                                                {pool, pool_attr_release_threshold},
                                                {pool, pool_attr_used_mem_current},
                                                {other, -1}}));

  // Without a stack source every pool is the runtime's.
  interposer plain(cuda_runtime, &resolve_fake, false, source());
  ASSERT_EQ(plain.device_get_default_mem_pool(&pool, 0), success);
  EXPECT_EQ(attribute(plain, pool, pool_attr_used_mem_current), real_pool_value);
  EXPECT_FALSE(built(0));
}

TEST(FindInLoadedLibrary, FindsASymbolOfALoadedLibraryByFileName) {
  // libc is loaded in every test program; it has strlen.
  void* fn = find_in_loaded_library("libc.so", "strlen");
  ASSERT_NE(fn, nullptr);
  EXPECT_EQ(reinterpret_cast<std::size_t (*)(const char*)>(fn)("four"), 4u);
  EXPECT_EQ(find_in_loaded_library("libc.so", "no_such_symbol_anywhere"), nullptr);
  EXPECT_EQ(find_in_loaded_library("libnosuchlibrary", "strlen"), nullptr);
}

// Issue 15: under LD_PRELOAD an allocation while a stream captures a CUDA
// graph must become the graph's allocation node (the real cudaMallocAsync),
// not a fragctl block that a later allocation could reuse under the graph.
TEST_F(InterposerTest, AllocationsWhileAStreamCapturesGoToTheRealRuntime) {
  interposer layer(cuda_runtime, &resolve_fake, false, source());
  runtime_.capturing_stream = stream_a;
  runtime_.capture = true;
  void* graph = nullptr;
  ASSERT_EQ(layer.malloc_async(&graph, 1 << 20, stream_a, stream_mode::legacy), success);
  EXPECT_EQ(graph, runtime_.graph_memory.data());
  EXPECT_FALSE(layer.find(graph).has_value());
  EXPECT_FALSE(built(0));  // fragctl was not asked
  // Another stream, not capturing: fragctl's.
  void* other = nullptr;
  ASSERT_EQ(layer.malloc_async(&other, 1 << 20, stream_b, stream_mode::legacy), success);
  EXPECT_TRUE(layer.find(other).has_value());
  // The graph's pointer is freed by the runtime, as any pointer fragctl did not hand out.
  EXPECT_EQ(layer.free_async(graph, stream_a, stream_mode::legacy), success);
  ASSERT_EQ(runtime_.freed_async.size(), 1U);
  EXPECT_EQ(runtime_.freed_async[0].first, graph);
  EXPECT_EQ(layer.free_async(other, stream_b, stream_mode::legacy), success);
}

TEST_F(InterposerTest, FreeingAFragctlBlockInsideACaptureIsRefusedAndTheBlockStaysLive) {
  interposer layer(cuda_runtime, &resolve_fake, false, source());
  void* p = nullptr;
  ASSERT_EQ(layer.malloc_async(&p, 1 << 20, stream_a, stream_mode::legacy), success);
  runtime_.capturing_stream = stream_a;
  runtime_.capture = true;
  EXPECT_EQ(layer.free_async(p, stream_a, stream_mode::legacy), error_stream_capture_unsupported);
  EXPECT_TRUE(layer.find(p).has_value());
  EXPECT_EQ(stats(0).requested.current, std::size_t{1} << 20);  // not handed back to the cache
  runtime_.capture = false;  // capture ended: the free goes through
  EXPECT_EQ(layer.free_async(p, stream_a, stream_mode::legacy), success);
  EXPECT_EQ(stats(0).requested.current, 0U);
}

}  // namespace
}  // namespace fragctl::interpose
