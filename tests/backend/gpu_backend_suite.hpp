// The body of the GPU backend tests that cuda_backend_test.cpp and
// hip_backend_test.cpp run, each for its runtime (a gpu_runtime value and
// one INSTANTIATE_TEST_SUITE_P line): the mirror backends must behave alike.
// Every test that needs a GPU skips, saying why, where the runtime cannot
// open device 0 (no driver or runtime, or one without a device, as in CI);
// the error-message test runs exactly there instead. Include it from one
// test program each.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <thread>

#include "fmt/format.h"
#include "fragctl/backend.hpp"
#include "fragctl/error.hpp"

namespace fragctl::testing {

/// What differs between the runtimes, as the tests see it.
struct gpu_runtime {
  const char* name;   ///< device_backend::name(): "cuda", "hip"
  const char* label;  ///< in messages: "CUDA", "HIP"
  std::unique_ptr<device_backend> (*make)(int device);
  const char* invalid_device_code;  ///< code_name() for a device that does not exist
  const char* error_prefix;         ///< every runtime error's code_name() starts so
  const char* free_call;            ///< the runtime call that frees device memory

  friend std::ostream& operator<<(std::ostream& out, const gpu_runtime& r) { return out << r.name; }
};

/// Opens device 0 of `runtime`, or returns nullptr and says why.
inline std::unique_ptr<device_backend> open_device_0(const gpu_runtime& runtime, std::string& why) {
  try {
    return runtime.make(0);
  } catch (const backend_error& e) {
    why = e.what();
    return nullptr;
  }
}

inline bool aligned(const void* p, std::size_t to) { return reinterpret_cast<std::uintptr_t>(p) % to == 0; }

/// Fills `bytes` at `p` with 32-bit words that depend on `seed` and position.
inline void fill_pattern(void* p, std::size_t bytes, std::uint32_t seed) {
  auto* words = static_cast<std::uint32_t*>(p);
  for (std::size_t i = 0; i < bytes / 4; ++i) words[i] = seed * 0x9E3779B9u + static_cast<std::uint32_t>(i);
}

/// Index of the first word that differs from fill_pattern(seed), or -1.
inline std::int64_t first_mismatch(const void* p, std::size_t bytes, std::uint32_t seed) {
  const auto* words = static_cast<const std::uint32_t*>(p);
  for (std::size_t i = 0; i < bytes / 4; ++i) {
    if (words[i] != seed * 0x9E3779B9u + static_cast<std::uint32_t>(i)) return static_cast<std::int64_t>(i);
  }
  return -1;
}

/// Tests that run where the runtime has no device.
class gpu_backend_unavailable : public ::testing::TestWithParam<gpu_runtime> {};

TEST_P(gpu_backend_unavailable, error_is_one_line_naming_what_is_missing) {
  std::string why;
  if (open_device_0(GetParam(), why) != nullptr) GTEST_SKIP() << "a " << GetParam().label << " device is present";
  EXPECT_EQ(why.find('\n'), std::string::npos) << why;
  EXPECT_EQ(why.rfind(fmt::format("{} backend: ", GetParam().name), 0), 0u) << why;
  try {
    (void)GetParam().make(0);
    FAIL() << "opening device 0 succeeded on the second try";
  } catch (const backend_error& e) {
    EXPECT_EQ(std::string(e.what()), why) << "the load outcome is remembered";
    EXPECT_FALSE(e.code_name().empty());
  }
}

/// Tests on device 0; skipped, saying why, where it cannot be opened.
class gpu_backend_test : public ::testing::TestWithParam<gpu_runtime> {
 protected:
  void SetUp() override {
    std::string why;
    backend_ = open_device_0(GetParam(), why);
    if (backend_ == nullptr) GTEST_SKIP() << "no " << GetParam().label << " device: " << why;
  }

  std::unique_ptr<device_backend> backend_;
};

TEST_P(gpu_backend_test, describes_itself) {
  EXPECT_EQ(backend_->name(), GetParam().name);
  EXPECT_EQ(backend_->device(), 0);
  const std::size_t g = backend_->granularity();
  EXPECT_GE(g, 4 * KiB);
  EXPECT_EQ(g & (g - 1), 0u) << "granularity " << g << " is not a power of two";
}

TEST_P(gpu_backend_test, missing_device_is_a_one_line_error) {
  try {
    (void)GetParam().make(4096);
    FAIL() << "device 4096 exists?";
  } catch (const backend_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(fmt::format("no {} device 4096 (", GetParam().label)), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    EXPECT_EQ(e.code_name(), GetParam().invalid_device_code);
  }
  EXPECT_THROW((void)GetParam().make(-1), backend_error);
}

TEST_P(gpu_backend_test, raw_allocations_are_counted_and_aligned) {
  void* p = backend_->allocate(MiB);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(aligned(p, min_alignment));
  backend_counters c = backend_->counters();
  EXPECT_EQ(c.held_bytes, MiB);
  EXPECT_EQ(c.of(backend_call::allocate), 1u);
  backend_->free(p, MiB);
  c = backend_->counters();
  EXPECT_EQ(c.held_bytes, 0u);
  EXPECT_EQ(c.peak_held_bytes, MiB);
  EXPECT_EQ(c.of(backend_call::free), 1u);
  EXPECT_EQ(c.memory_calls(), 2u);

  for (const std::size_t bytes : {std::size_t{1}, std::size_t{100}, std::size_t{513}, 4 * KiB, 3 * MiB + 1}) {
    void* q = backend_->allocate(bytes);
    ASSERT_NE(q, nullptr) << bytes;
    EXPECT_TRUE(aligned(q, min_alignment)) << bytes << " bytes at " << q;
    backend_->free(q, bytes);
  }
  EXPECT_EQ(backend_->counters().held_bytes, 0u);
}

TEST_P(gpu_backend_test, out_of_memory_returns_null) {
  EXPECT_EQ(backend_->allocate(std::size_t{1} << 50), nullptr);
  const backend_counters c = backend_->counters();
  EXPECT_EQ(c.failed_allocations, 1u);
  EXPECT_EQ(c.held_bytes, 0u);
}

TEST_P(gpu_backend_test, memcpy_round_trips_through_pinned_memory) {
  constexpr std::size_t bytes = 8 * MiB + 4096;
  void* host = backend_->allocate_host(bytes);
  void* back = backend_->allocate_host(bytes);
  ASSERT_NE(host, nullptr);
  ASSERT_NE(back, nullptr);
  EXPECT_EQ(backend_->counters().host_bytes, 2 * bytes);
  void* device = backend_->allocate(bytes);
  ASSERT_NE(device, nullptr);

  fill_pattern(host, bytes, 7);
  std::memset(back, 0, bytes);
  backend_->memcpy_async(device, host, bytes, nullptr);
  backend_->memcpy_async(back, device, bytes, nullptr);
  backend_->synchronize_stream(nullptr);
  EXPECT_EQ(first_mismatch(back, bytes, 7), -1);

  backend_->free(device, bytes);
  backend_->free_host(host, bytes);
  backend_->free_host(back, bytes);
  EXPECT_EQ(backend_->counters().host_bytes, 0u);
}

// The page-stitching primitive: data lives in the physical handle, so mapping
// the same handles elsewhere (here swapped) moves the data with them.
TEST_P(gpu_backend_test, remapped_handles_carry_their_data) {
  if (!backend_->supports_virtual_memory()) GTEST_SKIP() << "device has no virtual memory management";
  const std::size_t g = backend_->granularity();
  void* base = backend_->reserve_address(4 * g);
  ASSERT_NE(base, nullptr);
  EXPECT_TRUE(aligned(base, g));
  auto* va = static_cast<char*>(base);
  const auto first = backend_->create_physical(g);
  const auto second = backend_->create_physical(g);
  ASSERT_TRUE(first.has_value());
  ASSERT_TRUE(second.has_value());
  EXPECT_NE(first->value, 0u);
  EXPECT_NE(*first, *second);
  EXPECT_EQ(backend_->counters().held_bytes, 2 * g);

  ASSERT_TRUE(backend_->map(va, g, *first));
  ASSERT_TRUE(backend_->map(va + g, g, *second));
  ASSERT_TRUE(backend_->set_access(va, 2 * g));  // one call over two mappings

  void* host = backend_->allocate_host(2 * g);
  ASSERT_NE(host, nullptr);
  auto* h = static_cast<char*>(host);
  fill_pattern(h, g, 1);
  fill_pattern(h + g, g, 2);
  backend_->memcpy_async(va, host, 2 * g, nullptr);
  backend_->synchronize_stream(nullptr);
  backend_->unmap(va, g);
  backend_->unmap(va + g, g);

  ASSERT_TRUE(backend_->map(va + 2 * g, g, *second));
  ASSERT_TRUE(backend_->map(va + 3 * g, g, *first));
  ASSERT_TRUE(backend_->set_access(va + 2 * g, 2 * g));
  std::memset(host, 0, 2 * g);
  backend_->memcpy_async(host, va + 2 * g, 2 * g, nullptr);
  backend_->synchronize_stream(nullptr);
  EXPECT_EQ(first_mismatch(h, g, 2), -1) << "second handle's data did not follow it";
  EXPECT_EQ(first_mismatch(h + g, g, 1), -1) << "first handle's data did not follow it";

  backend_->unmap(va + 2 * g, g);
  backend_->unmap(va + 3 * g, g);
  backend_->release_physical(*first, g);
  backend_->release_physical(*second, g);
  backend_->release_address(base, 4 * g);
  backend_->free_host(host, 2 * g);
  const backend_counters c = backend_->counters();
  EXPECT_EQ(c.held_bytes, 0u);
  EXPECT_EQ(c.of(backend_call::map), 4u);
  EXPECT_EQ(c.of(backend_call::unmap), 4u);
  EXPECT_EQ(c.of(backend_call::create_physical), 2u);
  EXPECT_EQ(c.of(backend_call::release_physical), 2u);
}

TEST_P(gpu_backend_test, physical_allocation_beyond_the_device_returns_nullopt) {
  if (!backend_->supports_virtual_memory()) GTEST_SKIP() << "device has no virtual memory management";
  const memory_info info = backend_->get_memory_info();
  const std::size_t too_much = round_up(2 * info.total, backend_->granularity());
  EXPECT_FALSE(backend_->create_physical(too_much).has_value());
  EXPECT_EQ(backend_->counters().failed_allocations, 1u);
  EXPECT_EQ(backend_->counters().held_bytes, 0u);
}

TEST_P(gpu_backend_test, virtual_memory_calls_say_not_supported_where_unavailable) {
  if (backend_->supports_virtual_memory()) GTEST_SKIP() << "the device supports virtual memory";
  const std::size_t g = backend_->granularity();
  try {
    (void)backend_->reserve_address(g);
    FAIL() << "reserve_address worked without virtual memory support";
  } catch (const backend_error& e) {
    EXPECT_EQ(e.code_name(), "not_supported");
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)backend_->create_physical(g), backend_error);
  EXPECT_EQ(backend_->counters().held_bytes, 0u);
}

TEST_P(gpu_backend_test, events_complete_after_the_work_they_follow) {
  stream_t stream = backend_->create_stream();
  ASSERT_NE(stream, nullptr);
  event_t event = backend_->create_event();
  ASSERT_NE(event, nullptr);
  EXPECT_TRUE(backend_->query_event(event)) << "an event never recorded is complete";

  constexpr std::size_t bytes = 64 * MiB;
  void* host = backend_->allocate_host(bytes);
  void* device = backend_->allocate(bytes);
  ASSERT_NE(host, nullptr);
  ASSERT_NE(device, nullptr);
  fill_pattern(host, bytes, 3);
  backend_->memcpy_async(device, host, bytes, stream);
  backend_->record_event(event, stream);
  backend_->synchronize_event(event);
  EXPECT_TRUE(backend_->query_event(event));

  backend_->record_event(event, nullptr);  // the null (default) stream
  backend_->synchronize_stream(nullptr);
  EXPECT_TRUE(backend_->query_event(event));
  backend_->synchronize_stream(stream);

  backend_->free(device, bytes);
  backend_->free_host(host, bytes);
  backend_->destroy_event(event);
  backend_->destroy_stream(stream);
  const backend_counters c = backend_->counters();
  EXPECT_EQ(c.of(backend_call::record_event), 2u);
  EXPECT_EQ(c.of(backend_call::query_event), 3u);
  EXPECT_EQ(c.of(backend_call::synchronize_event), 1u);
}

TEST_P(gpu_backend_test, memory_info_is_sane) {
  const memory_info info = backend_->get_memory_info();
  EXPECT_GT(info.free, 0u);
  EXPECT_LE(info.free, info.total);
  EXPECT_GE(info.total, 1 * GiB);
}

TEST_P(gpu_backend_test, runtime_errors_throw_backend_error_with_the_code_name) {
  int not_device_memory = 0;
  try {
    backend_->free(&not_device_memory, 512);
    FAIL() << GetParam().free_call << " accepted a host stack address";
  } catch (const backend_error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.code_name().rfind(GetParam().error_prefix, 0), 0u) << e.code_name();
    EXPECT_NE(e.code(), 0);
    EXPECT_NE(what.find(GetParam().free_call), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  EXPECT_EQ(backend_->counters().held_bytes, 0u) << "a failed free must not change held bytes";
}

// CUDA: from threads without a current context.
TEST_P(gpu_backend_test, works_from_other_threads) {
  void* p = nullptr;
  std::thread([&] { p = backend_->allocate(MiB); }).join();
  ASSERT_NE(p, nullptr);
  std::thread([&] { backend_->free(p, MiB); }).join();
  EXPECT_EQ(backend_->counters().held_bytes, 0u);
}

// CUDA: the backends share the primary context, so this releases one reference.
TEST_P(gpu_backend_test, backends_on_one_device_are_independent) {
  {
    auto other = GetParam().make(0);
    void* q = other->allocate(MiB);
    ASSERT_NE(q, nullptr);
    other->free(q, MiB);
  }  // destroying the other must leave ours working
  void* p = backend_->allocate(MiB);
  ASSERT_NE(p, nullptr);
  EXPECT_GT(backend_->get_memory_info().free, 0u);
  backend_->free(p, MiB);
}

}  // namespace fragctl::testing
