// The device backend contract (include/fragctl/backend.hpp), as one suite
// every backend must pass: sim in accounting and backed mode, and cuda and hip
// where a device is present (they skip with a message elsewhere). The suite
// uses only the device_backend interface and pinned host buffers, so the same
// code runs on a laptop and on an H100.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "fragctl/backend.hpp"
#include "fragctl/error.hpp"
#include "fragctl/sim_backend.hpp"

namespace fragctl {
namespace {

struct backend_case {
  std::string name;
  std::function<std::unique_ptr<device_backend>()> make;
  bool moves_data;  ///< copies move bytes (not so for sim's fake accounting addresses)
};

void PrintTo(const backend_case& c, std::ostream* os) { *os << c.name; }

std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }
char* at(void* base, std::size_t offset) { return static_cast<char*>(base) + offset; }

/// Fills `bytes` at `p` with a pattern that differs for every word and `seed`.
void fill(void* p, std::size_t bytes, std::uint32_t seed) {
  auto* w = static_cast<std::uint32_t*>(p);
  for (std::size_t i = 0; i < bytes / sizeof(std::uint32_t); ++i) {
    w[i] = static_cast<std::uint32_t>(i) * 2654435761u + seed;
  }
}

/// Number of words of `p` that differ from fill(…, seed) started `offset` bytes in.
std::size_t mismatches(const void* p, std::size_t bytes, std::uint32_t seed, std::size_t offset = 0) {
  const auto* w = static_cast<const std::uint32_t*>(p);
  const std::size_t first = offset / sizeof(std::uint32_t);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < bytes / sizeof(std::uint32_t); ++i) {
    bad += w[i] != static_cast<std::uint32_t>(first + i) * 2654435761u + seed;
  }
  return bad;
}

class backend_contract : public ::testing::TestWithParam<backend_case> {
 protected:
  void SetUp() override {
    try {
      backend_ = GetParam().make();
    } catch (const backend_error& e) {
      GTEST_SKIP() << "the " << GetParam().name << " backend is not available here: " << e.what();
    }
    start_ = backend_->counters();
  }

  // Every test must give back what it took.
  void TearDown() override {
    if (!backend_) return;
    const backend_counters end = backend_->counters();
    EXPECT_EQ(end.held_bytes, start_.held_bytes);
    EXPECT_EQ(end.host_bytes, start_.host_bytes);
  }

  device_backend& be() { return *backend_; }
  bool moves_data() const { return GetParam().moves_data; }
  std::uint64_t calls_since_start(backend_call c) const { return backend_->counters().of(c) - start_.of(c); }

  std::unique_ptr<device_backend> backend_;
  backend_counters start_;
};

TEST_P(backend_contract, describes_itself) {
  EXPECT_TRUE(be().name() == "sim" || be().name() == "cuda" || be().name() == "hip") << be().name();
  EXPECT_GE(be().device(), 0);
  const std::size_t g = be().granularity();
  EXPECT_GE(g, min_alignment);
  EXPECT_EQ(g & (g - 1), 0u) << "granularity must be a power of two";
}

TEST_P(backend_contract, raw_allocations_are_aligned_distinct_and_counted) {
  const std::vector<std::size_t> sizes = {1, 512, 1000, 64 * KiB, 1 * MiB, 2 * MiB, 5 * MiB + 3};
  std::vector<std::pair<std::uintptr_t, std::size_t>> blocks;
  std::size_t bytes = 0;
  for (std::size_t size : sizes) {
    void* p = be().allocate(size);
    ASSERT_NE(p, nullptr) << size;
    EXPECT_EQ(addr(p) % min_alignment, 0u) << size;
    blocks.emplace_back(addr(p), size);
    bytes += size;
  }
  EXPECT_EQ(calls_since_start(backend_call::allocate), sizes.size());
  EXPECT_EQ(be().counters().held_bytes, start_.held_bytes + bytes);
  std::sort(blocks.begin(), blocks.end());
  for (std::size_t i = 1; i < blocks.size(); ++i) {
    EXPECT_LE(blocks[i - 1].first + blocks[i - 1].second, blocks[i].first) << "allocations overlap";
  }
  for (auto [a, size] : blocks) be().free(reinterpret_cast<void*>(a), size);
  EXPECT_EQ(calls_since_start(backend_call::free), sizes.size());
  EXPECT_GE(be().counters().peak_held_bytes, start_.held_bytes + bytes);
}

TEST_P(backend_contract, running_out_of_memory_is_returned_not_thrown) {
  const std::size_t absurd = std::size_t{1} << 50;  // 1 PiB: more than any device has
  void* p = nullptr;
  EXPECT_NO_THROW(p = be().allocate(absurd));
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(be().counters().failed_allocations, start_.failed_allocations + 1);
  if (be().supports_virtual_memory()) {
    std::optional<physical_handle> h;
    EXPECT_NO_THROW(h = be().create_physical(round_up(absurd, be().granularity())));
    EXPECT_FALSE(h.has_value());
    EXPECT_EQ(be().counters().failed_allocations, start_.failed_allocations + 2);
  }
  EXPECT_EQ(be().counters().held_bytes, start_.held_bytes);
}

TEST_P(backend_contract, virtual_memory_keeps_data_in_the_handle_through_unmap_and_remap) {
  if (!be().supports_virtual_memory()) GTEST_SKIP() << be().name() << ": no virtual memory on this device";
  const std::size_t g = be().granularity();

  void* aligned = be().reserve_address(2 * g, 4 * g);
  ASSERT_NE(aligned, nullptr);
  EXPECT_EQ(addr(aligned) % (4 * g), 0u);
  be().release_address(aligned, 2 * g);

  void* base = be().reserve_address(4 * g);
  ASSERT_NE(base, nullptr);
  EXPECT_EQ(addr(base) % g, 0u);
  const auto handle = be().create_physical(2 * g);
  ASSERT_TRUE(handle.has_value());
  EXPECT_NE(handle->value, 0u);
  EXPECT_EQ(be().counters().held_bytes, start_.held_bytes + 2 * g);  // reservations hold nothing
  ASSERT_TRUE(be().map(base, 2 * g, *handle));
  ASSERT_TRUE(be().set_access(base, 2 * g));

  stream_t stream = be().create_stream();
  void* host = be().allocate_host(2 * g);
  ASSERT_NE(host, nullptr);
  fill(host, 2 * g, 7);
  be().memcpy_async(base, host, 2 * g, stream);
  be().synchronize_stream(stream);
  be().unmap(base, 2 * g);

  // The same handle, mapped two granules further on.
  void* moved = at(base, 2 * g);
  ASSERT_TRUE(be().map(moved, 2 * g, *handle));
  ASSERT_TRUE(be().set_access(moved, 2 * g));
  std::memset(host, 0, 2 * g);
  be().memcpy_async(host, moved, 2 * g, stream);
  be().synchronize_stream(stream);
  if (moves_data()) {
    EXPECT_EQ(mismatches(host, 2 * g, 7), 0u);
  }
  be().unmap(moved, 2 * g);

  // Back at the base, after a round trip through another address.
  ASSERT_TRUE(be().map(base, 2 * g, *handle));
  ASSERT_TRUE(be().set_access(base, 2 * g));
  std::memset(host, 0, 2 * g);
  be().memcpy_async(host, base, 2 * g, nullptr);
  be().synchronize_stream(nullptr);
  if (moves_data()) {
    EXPECT_EQ(mismatches(host, 2 * g, 7), 0u);
  }
  be().unmap(base, 2 * g);

  be().free_host(host, 2 * g);
  be().destroy_stream(stream);
  be().release_physical(*handle, 2 * g);
  be().release_address(base, 4 * g);
  EXPECT_EQ(calls_since_start(backend_call::map), 3u);
  EXPECT_EQ(calls_since_start(backend_call::set_access), 3u);
  EXPECT_EQ(calls_since_start(backend_call::unmap), 3u);
  EXPECT_EQ(calls_since_start(backend_call::create_physical), 1u);
  EXPECT_EQ(calls_since_start(backend_call::release_physical), 1u);
  EXPECT_EQ(calls_since_start(backend_call::reserve_address), 2u);
  EXPECT_EQ(calls_since_start(backend_call::release_address), 2u);
}

TEST_P(backend_contract, copies_are_ordered_on_their_stream) {
  constexpr std::size_t bytes = 4 * MiB;
  void* device = be().allocate(bytes);
  void* in = be().allocate_host(bytes);
  void* out = be().allocate_host(bytes);
  ASSERT_TRUE(device && in && out);
  EXPECT_EQ(be().counters().host_bytes, start_.host_bytes + 2 * bytes);
  fill(in, bytes, 11);
  std::memset(out, 0, bytes);
  stream_t stream = be().create_stream();
  be().memcpy_async(device, in, bytes, stream);
  be().memcpy_async(out, device, bytes, stream);
  be().synchronize_stream(stream);
  if (moves_data()) {
    EXPECT_EQ(mismatches(out, bytes, 11), 0u);
  }
  EXPECT_EQ(calls_since_start(backend_call::memcpy_async), 2u);
  be().destroy_stream(stream);
  be().free_host(out, bytes);
  be().free_host(in, bytes);
  be().free(device, bytes);
}

TEST_P(backend_contract, events_report_the_work_they_follow) {
  event_t event = be().create_event();
  ASSERT_NE(event, nullptr);
  EXPECT_TRUE(be().query_event(event)) << "an event never recorded is complete";
  be().record_event(event, nullptr);
  be().synchronize_event(event);
  EXPECT_TRUE(be().query_event(event));

  stream_t stream = be().create_stream();
  void* device = be().allocate(1 * MiB);
  void* host = be().allocate_host(1 * MiB);
  ASSERT_TRUE(device && host);
  be().memcpy_async(device, host, 1 * MiB, stream);
  be().record_event(event, stream);
  be().synchronize_stream(stream);
  EXPECT_TRUE(be().query_event(event));
  be().record_event(event, stream);
  be().synchronize_event(event);
  EXPECT_TRUE(be().query_event(event));

  be().free_host(host, 1 * MiB);
  be().free(device, 1 * MiB);
  be().destroy_stream(stream);
  be().destroy_event(event);
  EXPECT_EQ(calls_since_start(backend_call::record_event), 3u);
  EXPECT_EQ(calls_since_start(backend_call::query_event), 4u);
  EXPECT_EQ(calls_since_start(backend_call::synchronize_event), 2u);
  EXPECT_EQ(calls_since_start(backend_call::create_event), 1u);
  EXPECT_EQ(calls_since_start(backend_call::destroy_event), 1u);
}

TEST_P(backend_contract, memory_info_sees_allocations) {
  const memory_info before = be().get_memory_info();
  EXPECT_GT(before.total, 0u);
  EXPECT_LE(before.free, before.total);
  constexpr std::size_t bytes = 256 * MiB;
  void* p = be().allocate(bytes);
  ASSERT_NE(p, nullptr);
  const memory_info during = be().get_memory_info();
  EXPECT_EQ(during.total, before.total);
  EXPECT_LE(during.free + bytes, before.free);
  be().free(p, bytes);
  EXPECT_EQ(calls_since_start(backend_call::memory_info), 2u);
}

TEST_P(backend_contract, pinned_host_memory_is_usable_and_counted) {
  constexpr std::size_t bytes = 1 * MiB + 100;
  auto* p = static_cast<unsigned char*>(be().allocate_host(bytes));
  ASSERT_NE(p, nullptr);
  std::memset(p, 0xab, bytes);
  EXPECT_EQ(p[0], 0xab);
  EXPECT_EQ(p[bytes - 1], 0xab);
  EXPECT_EQ(be().counters().host_bytes, start_.host_bytes + bytes);
  EXPECT_EQ(be().counters().held_bytes, start_.held_bytes) << "host memory is not device memory";
  be().free_host(p, bytes);
}

TEST_P(backend_contract, held_bytes_return_to_their_start_after_frees) {
  void* raw = be().allocate(3 * MiB);
  ASSERT_NE(raw, nullptr);
  std::size_t expected = 3 * MiB;
  std::optional<physical_handle> handle;
  if (be().supports_virtual_memory()) {
    handle = be().create_physical(be().granularity());
    ASSERT_TRUE(handle.has_value());
    expected += be().granularity();
  }
  EXPECT_EQ(be().counters().held_bytes, start_.held_bytes + expected);
  if (handle) be().release_physical(*handle, be().granularity());
  be().free(raw, 3 * MiB);
  EXPECT_EQ(be().counters().held_bytes, start_.held_bytes);
  EXPECT_GE(be().counters().peak_held_bytes, start_.held_bytes + expected);
}

std::vector<backend_case> cases() {
  return {
      {"sim_accounting", [] { return std::make_unique<sim_backend>(); }, false},
      {"sim_backed",
       [] {
         sim_options o;
         o.backed = true;
         o.capacity = 8 * GiB;
         return std::make_unique<sim_backend>(o);
       },
       true},
      {"cuda", [] { return make_cuda_backend(0); }, true},
      {"hip", [] { return make_hip_backend(0); }, true},
  };
}

INSTANTIATE_TEST_SUITE_P(backends, backend_contract, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<backend_case>& c) { return c.param.name; });

}  // namespace
}  // namespace fragctl
