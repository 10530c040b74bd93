// Tests of the host simulator backend: capacity, fake and backed memory,
// virtual memory and its validation, streams and events, fault injection,
// counters, leaks and concurrent use.
#include "fragctl/sim_backend.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "backend/sim/address_ranges.hpp"
#include "fragctl/error.hpp"

namespace fragctl {
namespace {

constexpr std::size_t gran = 2 * MiB;

std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }
char* at(void* base, std::size_t offset) { return static_cast<char*>(base) + offset; }

/// The code name of the backend_error `f` throws, or "no error".
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const backend_error& e) {
    return e.code_name();
  }
  return "no error";
}

std::size_t total(const sim_backend::live_objects& l) {
  return l.allocations + l.physical + l.reservations + l.mappings + l.events + l.streams + l.host;
}

/// Resident set size of this process in bytes (Linux).
std::size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * 4096;
}

/// Lines of /proc/self/maps naming the sim's memory file.
int memory_file_mappings() {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);)
    n += line.find("fragctl-sim") != std::string::npos ? 1 : 0;
  return n;
}

/// Open descriptors of this process that are the sim's memory file.
int memory_file_descriptors() {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const auto target = std::filesystem::read_symlink(entry.path(), ec);
    if (!ec && target.string().find("fragctl-sim") != std::string::npos) ++n;
  }
  return n;
}

sim_options small(bool backed, std::size_t capacity = 64 * MiB) {
  sim_options o;
  o.capacity = capacity;
  o.backed = backed;
  return o;
}

// --- address_ranges ---------------------------------------------------------

TEST(address_ranges, merges_splits_and_covers) {
  sim_detail::address_ranges r;
  r.insert(100, 200);
  r.insert(300, 400);
  EXPECT_EQ(r.size(), 2u);
  EXPECT_TRUE(r.covers(120, 200));
  EXPECT_FALSE(r.covers(150, 250));
  r.insert(200, 300);  // touches both: one range
  EXPECT_EQ(r.size(), 1u);
  EXPECT_TRUE(r.covers(100, 400));
  r.erase(150, 250);  // splits
  EXPECT_EQ(r.size(), 2u);
  EXPECT_TRUE(r.covers(100, 150));
  EXPECT_FALSE(r.covers(149, 151));
  EXPECT_TRUE(r.covers(250, 400));
  r.erase(0, 1000);
  EXPECT_EQ(r.size(), 0u);
  EXPECT_FALSE(r.covers(100, 101));
}

// --- accounting mode ---------------------------------------------------------

TEST(sim_accounting, fake_addresses_are_unique_aligned_and_in_a_high_range) {
  sim_backend sim(small(false, 1 * GiB));
  const std::vector<std::size_t> sizes = {1,       511,      512,  513,      4096,
                                          100'000, gran - 1, gran, gran + 1, 3 * gran};
  std::vector<std::pair<std::uintptr_t, std::size_t>> blocks;
  for (int round = 0; round < 3; ++round) {
    for (std::size_t size : sizes) {
      void* p = sim.allocate(size);
      ASSERT_NE(p, nullptr);
      EXPECT_EQ(addr(p) % min_alignment, 0u) << size;
      if (size >= gran) {
        EXPECT_EQ(addr(p) % gran, 0u) << size;
      }
      EXPECT_GE(addr(p), std::uintptr_t{1} << 48);  // above any user-space host address
      blocks.emplace_back(addr(p), size);
    }
  }
  std::sort(blocks.begin(), blocks.end());
  for (std::size_t i = 1; i < blocks.size(); ++i) {
    EXPECT_LE(blocks[i - 1].first + blocks[i - 1].second, blocks[i].first) << "overlap";
  }
  // Freed addresses are not handed out again.
  void* p = sim.allocate(4096);
  sim.free(p, 4096);
  void* q = sim.allocate(4096);
  EXPECT_NE(p, q);
  sim.free(q, 4096);
  for (auto [a, size] : blocks) sim.free(reinterpret_cast<void*>(a), size);
  EXPECT_EQ(total(sim.live()), 0u);
  EXPECT_EQ(sim.used_bytes(), 0u);
}

TEST(sim_accounting, an_80_gib_device_fills_without_host_memory) {
  sim_backend sim;  // 80 GiB accounting
  const std::size_t before = resident_bytes();
  std::vector<void*> blocks;
  for (int i = 0; i < 40; ++i) blocks.push_back(sim.allocate(2 * GiB));
  const std::size_t after = resident_bytes();
  for (void* p : blocks) EXPECT_NE(p, nullptr);
  EXPECT_EQ(sim.get_memory_info().free, 0u);
  EXPECT_EQ(sim.allocate(512), nullptr);
  EXPECT_LT(after, before + 16 * MiB);
  for (void* p : blocks) sim.free(p, 2 * GiB);
  EXPECT_EQ(sim.get_memory_info().free, 80 * GiB);
}

TEST(sim_accounting, copies_with_a_fake_side_do_nothing_and_host_copies_copy) {
  sim_backend sim(small(false));
  void* dev = sim.allocate(4096);
  auto* h1 = static_cast<char*>(sim.allocate_host(4096));
  auto* h2 = static_cast<char*>(sim.allocate_host(4096));
  ASSERT_TRUE(dev && h1 && h2);
  std::memset(h1, 7, 4096);
  std::memset(h2, 0, 4096);
  sim.memcpy_async(dev, h1, 4096, nullptr);
  sim.memcpy_async(h2, dev, 4096, nullptr);
  EXPECT_EQ(h2[0], 0);  // nothing was read from the fake address
  sim.memcpy_async(h2, h1, 4096, nullptr);
  EXPECT_EQ(h2[4095], 7);
  EXPECT_EQ(sim.counters().of(backend_call::memcpy_async), 3u);
  // A device range not allocated (freed, or past the end) is rejected like an illegal address.
  EXPECT_EQ(error_of([&] { sim.memcpy_async(h2, dev, 4097, nullptr); }), "invalid_value");
  sim.free(dev, 4096);
  EXPECT_EQ(error_of([&] { sim.memcpy_async(h2, dev, 16, nullptr); }), "invalid_value");
  sim.free_host(h1, 4096);
  sim.free_host(h2, 4096);
}

TEST(sim_accounting, reservations_are_address_space_only) {
  sim_backend sim(small(false, 8 * MiB));
  void* base = sim.reserve_address(1024 * GiB, 64 * gran);
  ASSERT_NE(base, nullptr);
  EXPECT_EQ(addr(base) % (64 * gran), 0u);
  EXPECT_EQ(sim.get_memory_info().free, 8 * MiB);
  EXPECT_EQ(sim.counters().held_bytes, 0u);
  sim.release_address(base, 1024 * GiB);
}

// --- both modes --------------------------------------------------------------

class sim_modes : public ::testing::TestWithParam<bool> {
 protected:
  bool backed() const { return GetParam(); }
};
INSTANTIATE_TEST_SUITE_P(sim, sim_modes, ::testing::Bool(), [](const ::testing::TestParamInfo<bool>& mode) {
  return mode.param ? "backed" : "accounting";
});

TEST_P(sim_modes, capacity_bounds_raw_and_physical_bytes) {
  sim_backend sim(small(backed(), 8 * MiB));
  void* p = sim.allocate(6 * MiB);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(sim.allocate(4 * MiB), nullptr);
  auto h = sim.create_physical(gran);
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(sim.used_bytes(), 8 * MiB);
  EXPECT_FALSE(sim.create_physical(gran).has_value());
  EXPECT_EQ(sim.allocate(1), nullptr);
  const memory_info full = sim.get_memory_info();
  EXPECT_EQ(full.free, 0u);
  EXPECT_EQ(full.total, 8 * MiB);
  EXPECT_EQ(sim.counters().failed_allocations, 3u);
  EXPECT_EQ(sim.allocate(std::size_t{1} << 50), nullptr);
  sim.release_physical(*h, gran);
  sim.free(p, 6 * MiB);
  EXPECT_EQ(sim.get_memory_info().free, 8 * MiB);
  EXPECT_EQ(total(sim.live()), 0u);
}

TEST_P(sim_modes, reservations_honour_alignment) {
  sim_backend sim(small(backed()));
  void* a = sim.reserve_address(2 * gran, 8 * gran);
  void* b = sim.reserve_address(gran);
  EXPECT_EQ(addr(a) % (8 * gran), 0u);
  EXPECT_EQ(addr(b) % gran, 0u);
  EXPECT_TRUE(addr(a) + 2 * gran <= addr(b) || addr(b) + gran <= addr(a));
  sim.release_address(a, 2 * gran);
  sim.release_address(b, gran);
  EXPECT_EQ(sim.live().reservations, 0u);
}

TEST_P(sim_modes, access_is_granted_by_set_access_and_withdrawn_by_unmap) {
  sim_backend sim(small(backed()));
  void* base = sim.reserve_address(4 * gran);
  auto h = sim.create_physical(2 * gran);
  ASSERT_TRUE(h);
  ASSERT_TRUE(sim.map(base, 2 * gran, *h));
  EXPECT_FALSE(sim.accessible(base, 1));
  ASSERT_TRUE(sim.set_access(base, gran));  // a part of a mapping
  EXPECT_TRUE(sim.accessible(base, gran));
  EXPECT_FALSE(sim.accessible(base, gran + 1));
  ASSERT_TRUE(sim.set_access(base, 2 * gran));
  EXPECT_TRUE(sim.accessible(base, 2 * gran));
  sim.unmap(base, 2 * gran);
  EXPECT_FALSE(sim.accessible(base, 1));
  sim.release_physical(*h, 2 * gran);
  sim.release_address(base, 4 * gran);
  EXPECT_EQ(total(sim.live()), 0u);
}

TEST_P(sim_modes, misuse_throws_like_a_driver_and_changes_nothing) {
  sim_backend sim(small(backed()));
  void* base = sim.reserve_address(4 * gran);
  auto h = sim.create_physical(2 * gran);
  auto h2 = sim.create_physical(gran);
  ASSERT_TRUE(h && h2);
  ASSERT_TRUE(sim.map(base, 2 * gran, *h));
  ASSERT_TRUE(sim.map(at(base, 2 * gran), gran, *h2));
  void* raw = sim.allocate(4096);
  event_t ev = sim.create_event();
  const auto before = sim.live();
  const std::size_t used = sim.used_bytes();

  struct misuse {
    const char* what;
    const char* code;
    std::function<void()> call;
  };
  const physical_handle unknown{999};
  const std::vector<misuse> misuses = {
      {"map outside a reservation", "invalid_value", [&] { (void)sim.map(at(base, 4 * gran), gran, *h2); }},
      {"map over a mapping", "invalid_value", [&] { (void)sim.map(at(base, gran), gran, *h2); }},
      {"map past the handle", "invalid_value", [&] { (void)sim.map(at(base, 3 * gran), 2 * gran, *h2); }},
      {"map a partial granule", "invalid_value", [&] { (void)sim.map(at(base, 3 * gran), gran / 2, *h2); }},
      {"map at a misaligned address", "invalid_value",
       [&] { (void)sim.map(at(base, 3 * gran + 4096), gran, *h2); }},
      {"map an unknown handle", "invalid_handle", [&] { (void)sim.map(at(base, 3 * gran), gran, unknown); }},
      {"set_access over unmapped memory", "invalid_value",
       [&] { (void)sim.set_access(at(base, 2 * gran), 2 * gran); }},
      {"unmap part of a mapping", "invalid_value", [&] { sim.unmap(base, gran); }},
      {"unmap from mid-mapping", "invalid_value", [&] { sim.unmap(at(base, gran), 2 * gran); }},
      {"unmap into a gap", "invalid_value", [&] { sim.unmap(base, 4 * gran); }},
      {"release a mapped handle", "invalid_value", [&] { sim.release_physical(*h, 2 * gran); }},
      {"release a handle with the wrong size", "invalid_value", [&] { sim.release_physical(*h2, 2 * gran); }},
      {"release an unknown handle", "invalid_handle", [&] { sim.release_physical(unknown, gran); }},
      {"release a reservation with mappings", "invalid_value", [&] { sim.release_address(base, 4 * gran); }},
      {"release part of a reservation", "invalid_value", [&] { sim.release_address(base, 2 * gran); }},
      {"reserve a partial granule", "invalid_value", [&] { (void)sim.reserve_address(gran + 4096); }},
      {"create a partial granule", "invalid_value", [&] { (void)sim.create_physical(4096); }},
      {"free an unknown pointer", "invalid_value", [&] { sim.free(at(raw, 512), 512); }},
      {"free with the wrong size", "invalid_value", [&] { sim.free(raw, 8192); }},
      {"free_host a device pointer", "invalid_value", [&] { sim.free_host(raw, 4096); }},
      {"allocate zero bytes", "invalid_value", [&] { (void)sim.allocate(0); }},
      {"destroy an unknown event", "invalid_handle",
       [&] { sim.destroy_event(reinterpret_cast<event_t>(0x40)); }},
      {"query an unknown event", "invalid_handle",
       [&] { (void)sim.query_event(reinterpret_cast<event_t>(0x40)); }},
      {"destroy an unknown stream", "invalid_handle",
       [&] { sim.destroy_stream(reinterpret_cast<stream_t>(0x40)); }},
      {"destroy the default stream", "invalid_handle", [&] { sim.destroy_stream(nullptr); }},
  };
  for (const misuse& m : misuses) EXPECT_EQ(error_of(m.call), m.code) << m.what;

  const auto after = sim.live();
  EXPECT_EQ(total(after), total(before));
  EXPECT_EQ(after.mappings, 2u);
  EXPECT_EQ(sim.used_bytes(), used);

  sim.unmap(base, 3 * gran);  // a run of two whole mappings is one unmap
  EXPECT_EQ(sim.live().mappings, 0u);
  sim.release_physical(*h, 2 * gran);
  sim.release_physical(*h2, gran);
  sim.release_address(base, 4 * gran);
  sim.free(raw, 4096);
  sim.destroy_event(ev);
  EXPECT_EQ(total(sim.live()), 0u);
}

TEST_P(sim_modes, virtual_memory_calls_can_be_unsupported) {
  sim_options o = small(backed());
  o.virtual_memory = false;
  sim_backend sim(o);
  EXPECT_FALSE(sim.supports_virtual_memory());
  EXPECT_EQ(error_of([&] { (void)sim.reserve_address(gran); }), "not_supported");
  EXPECT_EQ(error_of([&] { (void)sim.create_physical(gran); }), "not_supported");
  EXPECT_EQ(error_of([&] { (void)sim.map(nullptr, gran, physical_handle{1}); }), "not_supported");
  EXPECT_EQ(error_of([&] { sim.unmap(nullptr, gran); }), "not_supported");
  void* p = sim.allocate(gran);  // raw memory still works
  ASSERT_NE(p, nullptr);
  sim.free(p, gran);
}

TEST_P(sim_modes, fault_injection_is_deterministic_and_leaves_state_unchanged) {
  sim_backend sim(small(backed()));
  void* warm = sim.allocate(512);  // calls before a rule do not count toward it
  sim.fail_nth(sim_fault_target::allocate, 2);
  void* a = sim.allocate(512);
  const std::size_t used = sim.used_bytes();
  const auto live = sim.live();
  EXPECT_EQ(sim.allocate(512), nullptr);
  EXPECT_EQ(sim.used_bytes(), used);
  EXPECT_EQ(sim.live().allocations, live.allocations);
  EXPECT_EQ(sim.counters().failed_allocations, 1u);
  void* b = sim.allocate(512);
  EXPECT_NE(a, nullptr);
  EXPECT_NE(b, nullptr);

  sim.fail_every(sim_fault_target::create_physical, 3);
  std::vector<bool> made;
  std::vector<physical_handle> handles;
  for (int i = 0; i < 7; ++i) {
    auto h = sim.create_physical(gran);
    made.push_back(h.has_value());
    if (h) handles.push_back(*h);
  }
  EXPECT_EQ(made, (std::vector<bool>{true, true, false, true, true, false, true}));
  EXPECT_EQ(sim.live().physical, 5u);
  sim.reset_faults();
  for (int i = 0; i < 3; ++i) {
    auto h = sim.create_physical(gran);
    ASSERT_TRUE(h);
    handles.push_back(*h);
  }

  void* base = sim.reserve_address(gran);
  sim.fail_nth(sim_fault_target::map, 1);
  EXPECT_FALSE(sim.map(base, gran, handles[0]));
  EXPECT_EQ(sim.live().mappings, 0u);
  ASSERT_TRUE(sim.map(base, gran, handles[0]));  // nothing was left mapped by the failure
  sim.fail_nth(sim_fault_target::set_access, 1);
  EXPECT_FALSE(sim.set_access(base, gran));
  EXPECT_FALSE(sim.accessible(base, gran));
  EXPECT_TRUE(sim.set_access(base, gran));
  sim.fail_nth(sim_fault_target::allocate_host, 1);
  sim.fail_nth(sim_fault_target::allocate_host, 3);
  void* h1 = sim.allocate_host(64);
  void* h2 = sim.allocate_host(64);
  void* h3 = sim.allocate_host(64);
  EXPECT_EQ(h1, nullptr);
  EXPECT_NE(h2, nullptr);
  EXPECT_EQ(h3, nullptr);
  EXPECT_EQ(sim.live().host, 1u);
  EXPECT_THROW(sim.fail_nth(sim_fault_target::map, 0), invalid_argument);

  sim.unmap(base, gran);
  sim.release_address(base, gran);
  for (auto h : handles) sim.release_physical(h, gran);
  sim.free_host(h2, 64);
  for (void* p : {warm, a, b}) sim.free(p, 512);
  EXPECT_EQ(total(sim.live()), 0u);
}

// Releasing calls fail only as runtime errors: an injected unmap or release
// throws "injected_fault" and changes nothing, so the same call then works.
// fail_from keeps failing until reset_faults.
TEST_P(sim_modes, injected_unmap_and_release_failures_throw_and_change_nothing) {
  sim_backend sim(small(backed()));
  void* base = sim.reserve_address(2 * gran);
  auto h1 = sim.create_physical(gran);
  auto h2 = sim.create_physical(gran);
  ASSERT_TRUE(h1 && h2);
  ASSERT_TRUE(sim.map(base, gran, *h1));
  ASSERT_TRUE(sim.map(static_cast<char*>(base) + gran, gran, *h2));
  ASSERT_TRUE(sim.set_access(base, 2 * gran));
  EXPECT_EQ(sim.mapped_bytes(), 2 * gran);
  if (backed()) static_cast<char*>(base)[gran] = 42;

  sim.fail_nth(sim_fault_target::unmap, 1);
  EXPECT_EQ(error_of([&] { sim.unmap(base, 2 * gran); }), "injected_fault");
  EXPECT_EQ(sim.live().mappings, 2u);
  EXPECT_TRUE(sim.accessible(base, 2 * gran));
  if (backed()) {
    EXPECT_EQ(static_cast<char*>(base)[gran], 42);
  }
  // Misuse is reported as such, never as the injected fault.
  sim.fail_from(sim_fault_target::unmap, 1);
  EXPECT_EQ(error_of([&] { sim.unmap(base, gran / 2); }), "invalid_value");
  EXPECT_EQ(error_of([&] { sim.unmap(base, 2 * gran); }), "injected_fault");
  EXPECT_EQ(error_of([&] { sim.unmap(base, 2 * gran); }), "injected_fault");
  sim.reset_faults();
  sim.unmap(base, 2 * gran);
  EXPECT_EQ(sim.mapped_bytes(), 0u);

  sim.fail_nth(sim_fault_target::release_physical, 2);
  sim.release_physical(*h1, gran);
  EXPECT_EQ(error_of([&] { sim.release_physical(*h2, gran); }), "injected_fault");
  EXPECT_EQ(sim.live().physical, 1u);
  EXPECT_EQ(sim.used_bytes(), gran);
  EXPECT_EQ(sim.counters().held_bytes, gran);
  sim.release_physical(*h2, gran);

  sim.fail_from(sim_fault_target::create_physical, 2);
  auto a = sim.create_physical(gran);
  EXPECT_TRUE(a);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(sim.create_physical(gran));
  sim.reset_faults();
  auto b = sim.create_physical(gran);
  EXPECT_TRUE(b);
  sim.release_physical(*a, gran);
  sim.release_physical(*b, gran);
  sim.release_address(base, 2 * gran);
  EXPECT_THROW(sim.fail_from(sim_fault_target::map, 0), invalid_argument);
  EXPECT_EQ(total(sim.live()), 0u);
}

TEST_P(sim_modes, counters_count_calls_and_held_bytes) {
  sim_backend sim(small(backed()));
  void* a = sim.allocate(1000);
  void* b = sim.allocate(3 * MiB);
  auto h = sim.create_physical(2 * gran);
  void* host = sim.allocate_host(10'000);
  backend_counters c = sim.counters();
  EXPECT_EQ(c.of(backend_call::allocate), 2u);
  EXPECT_EQ(c.of(backend_call::create_physical), 1u);
  EXPECT_EQ(c.of(backend_call::allocate_host), 1u);
  EXPECT_EQ(c.held_bytes, 1000 + 3 * MiB + 2 * gran);
  EXPECT_EQ(c.host_bytes, 10'000u);
  sim.free(b, 3 * MiB);
  sim.release_physical(*h, 2 * gran);
  c = sim.counters();
  EXPECT_EQ(c.held_bytes, 1000u);
  EXPECT_EQ(c.peak_held_bytes, 1000 + 3 * MiB + 2 * gran);
  EXPECT_EQ(c.of(backend_call::free), 1u);
  EXPECT_EQ(c.of(backend_call::release_physical), 1u);
  EXPECT_EQ(c.memory_calls(), 5u);
  sim.free(a, 1000);
  sim.free_host(host, 10'000);
  c = sim.counters();
  EXPECT_EQ(c.held_bytes, 0u);
  EXPECT_EQ(c.host_bytes, 0u);
  EXPECT_EQ(c.total_calls(), 8u);
}

TEST_P(sim_modes, events_complete_at_once_without_manual_completion) {
  sim_backend sim(small(backed()));
  event_t e = sim.create_event();
  stream_t s = sim.create_stream();
  sim.record_event(e, s);
  EXPECT_TRUE(sim.query_event(e));
  sim.record_event(e, reinterpret_cast<stream_t>(0x1234));  // a caller's stream, met on first use
  EXPECT_TRUE(sim.query_event(e));
  EXPECT_EQ(sim.live().streams, 1u);
  EXPECT_EQ(error_of([&] { sim.destroy_stream(reinterpret_cast<stream_t>(0x1234)); }), "invalid_handle");
  sim.destroy_stream(s);
  EXPECT_EQ(error_of([&] { sim.destroy_stream(s); }), "invalid_handle");
  EXPECT_EQ(error_of([&] { sim.record_event(e, s); }), "invalid_handle");
  sim.destroy_event(e);
  EXPECT_EQ(total(sim.live()), 0u);
}

// --- manual completion -------------------------------------------------------

TEST(sim_streams, manual_completion_completes_only_when_told) {
  sim_options o = small(false);
  o.manual_completion = true;
  sim_backend sim(o);
  stream_t s = sim.create_stream();
  stream_t other = sim.create_stream();
  event_t e = sim.create_event();
  EXPECT_TRUE(sim.query_event(e));  // never recorded
  sim.record_event(e, s);
  EXPECT_TRUE(sim.query_event(e));  // nothing queued before it
  sim.submit(s);
  sim.record_event(e, s);
  EXPECT_FALSE(sim.query_event(e));
  sim.complete(other);
  EXPECT_FALSE(sim.query_event(e));
  sim.complete(s);
  EXPECT_TRUE(sim.query_event(e));

  sim.submit(nullptr);
  sim.record_event(e, nullptr);  // the default stream
  EXPECT_FALSE(sim.query_event(e));
  sim.complete_all();
  EXPECT_TRUE(sim.query_event(e));

  // Events order work on their stream: synchronizing the first completes it, not later work.
  event_t first = sim.create_event();
  event_t second = sim.create_event();
  sim.submit(s);
  sim.record_event(first, s);
  void* h = sim.allocate_host(64);
  sim.memcpy_async(h, h, 64, s);
  sim.record_event(second, s);
  sim.synchronize_event(first);
  EXPECT_TRUE(sim.query_event(first));
  EXPECT_FALSE(sim.query_event(second));
  sim.synchronize_stream(s);
  EXPECT_TRUE(sim.query_event(second));

  // An event recorded on a destroyed stream completes with complete_all.
  sim.submit(other);
  sim.record_event(first, other);
  sim.destroy_stream(other);
  EXPECT_FALSE(sim.query_event(first));
  sim.complete_all();
  EXPECT_TRUE(sim.query_event(first));

  sim.free_host(h, 64);
  for (event_t ev : {e, first, second}) sim.destroy_event(ev);
  sim.destroy_stream(s);
  EXPECT_EQ(total(sim.live()), 0u);
}

// --- backed mode ---------------------------------------------------------------

TEST(sim_backed, raw_memory_is_writable_and_distinct) {
  sim_backend sim(small(true));
  const std::vector<std::size_t> sizes = {1, 512, 5000, gran, 3 * gran + 7};
  std::vector<void*> blocks;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    blocks.push_back(sim.allocate(sizes[i]));
    ASSERT_NE(blocks.back(), nullptr);
    if (sizes[i] >= gran) {
      EXPECT_EQ(addr(blocks.back()) % gran, 0u);
    }
    std::memset(blocks.back(), static_cast<int>(i + 1), sizes[i]);
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const auto* p = static_cast<const unsigned char*>(blocks[i]);
    EXPECT_TRUE(std::all_of(p, p + sizes[i], [&](unsigned char c) { return c == i + 1; })) << i;
    EXPECT_TRUE(sim.accessible(p, sizes[i]));
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) sim.free(blocks[i], sizes[i]);
}

TEST(sim_backed, data_lives_in_the_handle_through_unmap_and_remap) {
  sim_backend sim(small(true));
  void* base = sim.reserve_address(4 * gran);
  auto h = sim.create_physical(2 * gran);
  ASSERT_TRUE(h);
  ASSERT_TRUE(sim.map(base, 2 * gran, *h));
  ASSERT_TRUE(sim.set_access(base, 2 * gran));
  auto* p = static_cast<std::uint32_t*>(base);
  const std::size_t words = 2 * gran / sizeof(std::uint32_t);
  for (std::size_t i = 0; i < words; ++i) p[i] = static_cast<std::uint32_t>(i * 2654435761u);
  sim.unmap(base, 2 * gran);

  void* elsewhere = at(base, 2 * gran);
  ASSERT_TRUE(sim.map(elsewhere, 2 * gran, *h));
  ASSERT_TRUE(sim.set_access(elsewhere, 2 * gran));
  const auto* q = static_cast<const std::uint32_t*>(elsewhere);
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < words; ++i) mismatches += q[i] != static_cast<std::uint32_t>(i * 2654435761u);
  EXPECT_EQ(mismatches, 0u);
  sim.unmap(elsewhere, 2 * gran);

  // Back at the base; access to its first granule only.
  EXPECT_EQ(error_of([&] { (void)sim.map(base, gran, *h); }), "invalid_value");  // handles map whole
  ASSERT_TRUE(sim.map(base, 2 * gran, *h));
  ASSERT_TRUE(sim.set_access(base, gran));
  const std::size_t half = gran / sizeof(std::uint32_t);
  EXPECT_EQ(p[1], static_cast<std::uint32_t>(2654435761u));
  EXPECT_EQ(p[half - 1], static_cast<std::uint32_t>((half - 1) * 2654435761u));

  // Copies between device and host are real in backed mode.
  auto* host = static_cast<std::uint32_t*>(sim.allocate_host(gran));
  sim.memcpy_async(host, base, gran, nullptr);
  sim.synchronize_stream(nullptr);
  EXPECT_EQ(std::memcmp(host, base, gran), 0);
  sim.free_host(host, gran);

  sim.unmap(base, 2 * gran);
  sim.release_physical(*h, 2 * gran);
  sim.release_address(base, 4 * gran);
  EXPECT_EQ(total(sim.live()), 0u);
}

TEST(sim_backed_death, mapped_memory_faults_until_access_is_granted) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  sim_backend sim(small(true));
  void* base = sim.reserve_address(gran);
  auto h = sim.create_physical(gran);
  ASSERT_TRUE(h);
  ASSERT_TRUE(sim.map(base, gran, *h));
  EXPECT_DEATH(*static_cast<volatile char*>(base) = 1, "");
  // A copy into it is rejected before it could fault.
  char byte = 1;
  EXPECT_EQ(error_of([&] { sim.memcpy_async(base, &byte, 1, nullptr); }), "invalid_value");
  ASSERT_TRUE(sim.set_access(base, gran));
  *static_cast<volatile char*>(base) = 1;
  EXPECT_EQ(*static_cast<volatile char*>(base), 1);
  sim.unmap(base, gran);
  EXPECT_DEATH(*static_cast<volatile char*>(base) = 2, "");
  sim.release_physical(*h, gran);
  sim.release_address(base, gran);
}

TEST(sim_backed, the_destructor_releases_what_is_still_held) {
  const int maps_before = memory_file_mappings();
  const int fds_before = memory_file_descriptors();
  {
    sim_backend sim(small(true));
    void* base = sim.reserve_address(2 * gran);
    auto h = sim.create_physical(2 * gran);
    ASSERT_TRUE(h);
    ASSERT_TRUE(sim.map(base, 2 * gran, *h));
    ASSERT_NE(sim.allocate(gran), nullptr);
    ASSERT_NE(sim.allocate_host(100), nullptr);
    EXPECT_GT(memory_file_mappings(), maps_before);
    EXPECT_EQ(memory_file_descriptors(), fds_before + 1);
    EXPECT_EQ(total(sim.live()), 5u);
  }
  EXPECT_EQ(memory_file_mappings(), maps_before);
  EXPECT_EQ(memory_file_descriptors(), fds_before);
}

TEST(sim_options_check, granularity_must_be_a_power_of_two_and_a_page_when_backed) {
  sim_options o;
  o.granularity = 3 * MiB;
  EXPECT_THROW(sim_backend{o}, invalid_argument);
  o.granularity = 1024;
  EXPECT_NO_THROW(sim_backend{o});
  o.backed = true;
  EXPECT_THROW(sim_backend{o}, invalid_argument);
}

// --- threads -------------------------------------------------------------------

TEST(sim_threads, concurrent_use_keeps_state_consistent) {
  sim_backend sim(small(true, 256 * MiB));
  constexpr int threads = 4;
  constexpr int rounds = 50;
  std::vector<int> errors(threads, 0);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      void* base = sim.reserve_address(2 * gran);
      event_t e = sim.create_event();
      stream_t s = sim.create_stream();
      for (int r = 0; r < rounds; ++r) {
        void* p = sim.allocate(4096 * static_cast<std::size_t>(t + 1));
        auto h = sim.create_physical(gran);
        if (p == nullptr || !h) {
          ++errors[t];
          continue;
        }
        std::memset(p, t, 4096);
        void* va = at(base, static_cast<std::size_t>(r % 2) * gran);
        if (!sim.map(va, gran, *h) || !sim.set_access(va, gran)) ++errors[t];
        static_cast<char*>(va)[r] = static_cast<char>(t);
        errors[t] += static_cast<const char*>(p)[4095] != t;
        sim.record_event(e, s);
        errors[t] += !sim.query_event(e);
        sim.unmap(va, gran);
        sim.release_physical(*h, gran);
        sim.free(p, 4096 * static_cast<std::size_t>(t + 1));
      }
      sim.destroy_stream(s);
      sim.destroy_event(e);
      sim.release_address(base, 2 * gran);
    });
  }
  for (auto& th : pool) th.join();
  EXPECT_EQ(errors, std::vector<int>(threads, 0));
  const backend_counters c = sim.counters();
  EXPECT_EQ(c.of(backend_call::allocate), std::uint64_t{threads * rounds});
  EXPECT_EQ(c.of(backend_call::map), std::uint64_t{threads * rounds});
  EXPECT_EQ(c.of(backend_call::unmap), std::uint64_t{threads * rounds});
  EXPECT_EQ(c.held_bytes, 0u);
  EXPECT_EQ(sim.used_bytes(), 0u);
  EXPECT_EQ(total(sim.live()), 0u);
}

}  // namespace
}  // namespace fragctl
