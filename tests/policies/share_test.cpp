// Sharing blocks with another process (issue 30, item 1), below the C API:
// the backend exports a physical handle once (its descriptor cached until
// the handle is released), an import maps the same memory elsewhere and
// keeps it alive after its owner released it, raw allocations are opened
// and counted; device_allocator::share says what lies under a block for
// every policy. On sim, backed: the exporter's and the importer's views
// are the same bytes.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "allocator_policies/arena/arena_policy.hpp"
#include "allocator_policies/buckets/buckets_policy.hpp"
#include "allocator_policies/caching/caching_policy.hpp"
#include "fragctl/error.hpp"
#include "fragctl/sim_backend.hpp"
#include "support/log_capture.hpp"
#include "support/test_support.hpp"

namespace fragctl {
namespace {

constexpr std::size_t G = 2 * MiB;

sim_options backed() { return testing::backed_device(64, G); }

config spans_of(std::size_t chunk) {
  config cfg;
  cfg.map_chunk = chunk;
  cfg.release_threshold = 0;
  cfg.release_delay = 0;
  return cfg;
}

TEST(SimSharing, AnImportSeesTheExportersBytesAndOutlivesItsRelease) {
  sim_backend sim(backed());
  ASSERT_TRUE(sim.shareable_handles());
  const physical_handle h = *sim.create_physical(2 * G);
  void* owner = sim.reserve_address(2 * G);
  ASSERT_TRUE(sim.map(owner, 2 * G, h));
  ASSERT_TRUE(sim.set_access(owner, 2 * G));

  const exported_handle e = sim.export_physical(h);
  const exported_handle again = sim.export_physical(h);
  EXPECT_EQ(e.fd, again.fd) << "one descriptor per handle, cached";
  EXPECT_EQ(e.serial, again.serial);
  EXPECT_EQ(sim.exported_handles(), 1U);

  const physical_handle imported = sim.import_physical(e.fd, 2 * G);
  void* view = sim.reserve_address(2 * G);
  ASSERT_TRUE(sim.map(view, 2 * G, imported));
  ASSERT_TRUE(sim.set_access(view, 2 * G));
  std::memset(owner, 0x5a, 2 * G);
  EXPECT_EQ(static_cast<unsigned char*>(view)[G + 7], 0x5a) << "the importer sees the exporter's bytes";
  static_cast<unsigned char*>(view)[3] = 0x11;
  EXPECT_EQ(static_cast<unsigned char*>(owner)[3], 0x11) << "and the exporter the importer's";

  // The owner lets go: its descriptor closes, the memory stays for the importer.
  sim.unmap(owner, 2 * G);
  sim.release_physical(h, 2 * G);
  EXPECT_EQ(sim.exported_handles(), 0U) << "the descriptor is closed with its handle";
  EXPECT_EQ(sim.used_bytes(), 2 * G) << "an import keeps the memory";
  EXPECT_EQ(static_cast<unsigned char*>(view)[G + 7], 0x5a);
  EXPECT_THROW((void)sim.import_physical(e.fd, 2 * G), backend_error) << "a closed descriptor imports nothing";
  EXPECT_EQ(sim.counters().held_bytes, 0U) << "imported memory is not the importer's held memory";

  sim.unmap(view, 2 * G);
  sim.release_imported(imported, 2 * G);
  EXPECT_EQ(sim.used_bytes(), 0U) << "the last handle gone, the memory goes";
  sim.release_address(owner, 2 * G);
  sim.release_address(view, 2 * G);
  EXPECT_EQ(sim.live().physical, 0U);
}

TEST(SimSharing, AnOpenedRawAllocationCannotBeFreedUntilClosed) {
  sim_backend sim(backed());
  void* p = sim.allocate(G);
  const ipc_memory_handle h = sim.export_allocation(p);
  void* opened = sim.open_allocation(h);
  EXPECT_EQ(opened, p);
  EXPECT_THROW(sim.free(p, G), backend_error) << "an importer still has it open";
  sim.close_allocation(opened);
  EXPECT_THROW(sim.close_allocation(opened), backend_error) << "closed once only";
  sim.free(p, G);
  EXPECT_EQ(sim.live().allocations, 0U);
}

TEST(SimSharing, WithoutVirtualMemoryHandlesAreNotShareable) {
  sim_options o = backed();
  o.virtual_memory = false;
  sim_backend sim(o);
  EXPECT_FALSE(sim.shareable_handles());
  EXPECT_THROW((void)sim.export_physical(physical_handle{1}), backend_error);
}

// Granules of G bytes that [p, p + bytes) touches (the arena's range is granule-aligned).
std::size_t granules(const void* p, std::size_t bytes) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  return (a + bytes - 1) / G - a / G + 1;
}

TEST(ArenaShare, DescribesTheSpansUnderABlockEachExportedOnce) {
  sim_backend sim(backed());
  arena_policy arena(spans_of(0), sim);  // one granule per span
  const std::size_t bytes = 3 * G - 4096;
  auto* a = static_cast<char*>(arena.allocate(bytes));
  const shared_memory m = arena.share(a + 1000, 2 * G);
  ASSERT_EQ(m.handles.size(), granules(a + 1000, 2 * G)) << "one handle per granule touched";
  EXPECT_EQ(static_cast<char*>(m.base) + m.offset, a + 1000);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(m.base) % G, 0U) << "the first span's start";
  EXPECT_EQ(m.bytes, m.handles.size() * G);
  EXPECT_NE(m.handles[0].serial, m.handles[1].serial);
  const shared_memory whole = arena.share(a, bytes);
  const std::size_t n = whole.handles.size();
  ASSERT_EQ(n, granules(a, bytes));
  EXPECT_EQ(whole.handles[n - 1].fd, m.handles[m.handles.size() - 1].fd) << "the same handle, the same descriptor";
  EXPECT_EQ(sim.exported_handles(), n);

  // Map the handles elsewhere as an importer would: same bytes.
  void* view = sim.reserve_address(n * G);
  std::vector<physical_handle> imported;
  for (std::size_t i = 0; i < n; ++i) {
    imported.push_back(sim.import_physical(whole.handles[i].fd, G));
    ASSERT_TRUE(sim.map(static_cast<char*>(view) + i * G, G, imported.back()));
  }
  ASSERT_TRUE(sim.set_access(view, n * G));
  std::memset(a, 0x33, bytes);
  auto* seen = static_cast<unsigned char*>(view) + whole.offset;
  EXPECT_EQ(seen[bytes - 1], 0x33);

  // The producer frees and gives the memory back: descriptors close, the
  // importer's mapping keeps the bytes until it unmaps.
  arena.deallocate(a, bytes);
  arena.release_cached();
  EXPECT_EQ(sim.exported_handles(), 0U);
  EXPECT_EQ(sim.used_bytes(), n * G);
  EXPECT_EQ(seen[bytes - 1], 0x33);
  for (std::size_t i = 0; i < n; ++i) sim.unmap(static_cast<char*>(view) + i * G, G);
  for (const physical_handle h : imported) sim.release_imported(h, G);
  sim.release_address(view, n * G);
  EXPECT_EQ(sim.used_bytes(), 0U);
}

TEST(ArenaShare, RefusesWhatIsNotLiveMemory) {
  sim_backend sim(backed());
  arena_policy arena(spans_of(0), sim);
  auto* a = static_cast<char*>(arena.allocate(G));
  EXPECT_THROW((void)arena.share(a + 4 * G, 1), invalid_argument) << "unmapped granules";
  EXPECT_THROW((void)arena.share(&sim, 1), invalid_argument) << "not the arena's range";
  arena.deallocate(a, G);
  EXPECT_THROW((void)arena.share(a, G), invalid_argument) << "a freed block";
  void* b = arena.allocate(G);
  ASSERT_TRUE(arena.pause(pause_keep::none));
  EXPECT_THROW((void)arena.share(b, G), state_error) << "a paused arena";
  ASSERT_TRUE(arena.resume());
  arena.deallocate(b, G);
}

// A consumer's import of the handles `m` names, mapped one after the other
// as fragctl_import_block maps them.
struct import_view {
  sim_backend& sim;
  void* base = nullptr;
  std::size_t bytes = 0;
  std::vector<std::pair<physical_handle, std::size_t>> handles;
  import_view(sim_backend& s, const shared_memory& m) : sim(s), bytes(m.bytes) {
    base = sim.reserve_address(bytes);
    std::size_t at = 0;
    for (const auto& h : m.handles) {
      handles.emplace_back(sim.import_physical(h.fd, h.bytes), h.bytes);
      EXPECT_TRUE(sim.map(static_cast<char*>(base) + at, h.bytes, handles.back().first));
      at += h.bytes;
    }
    EXPECT_TRUE(sim.set_access(base, bytes));
  }
  ~import_view() {
    std::size_t at = 0;
    for (const auto& [h, n] : handles) {
      sim.unmap(static_cast<char*>(base) + at, n);
      sim.release_imported(h, n);
      at += n;
    }
    sim.release_address(base, bytes);
  }
  import_view(const import_view&) = delete;
  import_view& operator=(const import_view&) = delete;
  [[nodiscard]] unsigned char* at(std::size_t offset) const { return static_cast<unsigned char*>(base) + offset; }
};

// Issue 30: a pause releases the handles of exported spans like any other.
// It closes their exports (no stale descriptor or serial is handed out
// again), counts them in the statistics and says so once in the log; the
// consumer keeps the old memory; after resume the same block exports new
// handles that another import maps with the resumed contents.
TEST(ArenaShare, APauseDetachesExportsAndResumeExportsTheBlockAnew) {
  sim_backend sim(backed());
  arena_policy arena(spans_of(0), sim);  // one granule per span
  const std::size_t bytes = 2 * G;
  auto* a = static_cast<unsigned char*>(arena.allocate(bytes));
  std::memset(a, 0x41, bytes);
  const shared_memory before = arena.share(a, bytes);
  const std::size_t n = before.handles.size();
  ASSERT_EQ(n, granules(a, bytes));
  const import_view old_view(sim, before);
  EXPECT_EQ(old_view.at(before.offset)[bytes - 1], 0x41);

  {
    const fragctl::testing::log_capture log;
    ASSERT_TRUE(arena.pause(pause_keep::host));
    const std::string line = "arena: pause detached " + std::to_string(n) + " exported handle(s), " +
                             std::to_string(n * G) + " bytes";
    EXPECT_NE(log.text().find(line), std::string::npos) << log.text();
    EXPECT_NE(log.text().find("consumers keep the old memory until they close it; re-export after resume"),
              std::string::npos);
  }
  EXPECT_EQ(sim.exported_handles(), 0U) << "the exports of the released handles are closed";
  EXPECT_THROW((void)sim.import_physical(before.handles[0].fd, G), backend_error)
      << "an old descriptor imports nothing";
  EXPECT_EQ(arena.state().pause_detached_exports, n);
  EXPECT_EQ(arena.state().pause_detached_export_bytes, n * G);
  EXPECT_EQ(old_view.at(before.offset)[0], 0x41) << "the consumer keeps the old memory";

  ASSERT_TRUE(arena.resume());
  EXPECT_EQ(a[bytes - 1], 0x41) << "the contents kept";
  std::memset(a, 0x42, G);  // the producer writes after the resume
  EXPECT_EQ(old_view.at(before.offset)[0], 0x41) << "the old import is the old memory, not the resumed one";

  const shared_memory after = arena.share(a, bytes);
  ASSERT_EQ(after.handles.size(), n);
  EXPECT_EQ(after.base, before.base) << "the same addresses";
  for (std::size_t i = 0; i < n; ++i) {
    for (const auto& old : before.handles) {
      EXPECT_NE(after.handles[i].serial, old.serial) << "a resumed handle is exported with a new serial";
    }
  }
  EXPECT_EQ(sim.exported_handles(), n);
  {
    const import_view new_view(sim, after);
    EXPECT_EQ(new_view.at(after.offset)[0], 0x42) << "a new import sees the resumed memory";
    EXPECT_EQ(new_view.at(after.offset)[bytes - 1], 0x41);
  }
  arena.deallocate(a, bytes);
}

// The control: a pause with nothing exported counts nothing and says nothing.
TEST(ArenaShare, APauseWithoutExportsDetachesNothing) {
  sim_backend sim(backed());
  arena_policy arena(spans_of(0), sim);
  void* a = arena.allocate(2 * G);
  const fragctl::testing::log_capture log;
  ASSERT_TRUE(arena.pause(pause_keep::none));
  EXPECT_EQ(log.text().find("detached"), std::string::npos) << log.text();
  EXPECT_EQ(arena.state().pause_detached_exports, 0U);
  ASSERT_TRUE(arena.resume());
  arena.deallocate(a, 2 * G);
}

TEST(CachingShare, DescribesTheSegmentHoldingABlock) {
  sim_backend sim(backed());
  caching_policy caching(config{}, sim);
  auto* small = static_cast<char*>(caching.allocate(4096));
  auto* next = static_cast<char*>(caching.allocate(4096));
  const shared_memory m = caching.share(next, 4096);
  EXPECT_TRUE(m.handles.empty()) << "a plain device allocation";
  EXPECT_EQ(static_cast<char*>(m.base) + m.offset, next);
  EXPECT_GE(m.bytes, m.offset + 4096);
  EXPECT_EQ(caching.share(small, 4096).base, m.base) << "both blocks lie in one small segment";
  EXPECT_THROW((void)caching.share(&sim, 1), invalid_argument);
  caching.deallocate(small, 4096);
  caching.deallocate(next, 4096);
}

TEST(BucketsShare, ASlotIsDescribedByTheUpstreamHoldingItsSlab) {
  sim_backend sim(backed());
  config cfg = spans_of(0);
  auto buckets = buckets_policy(cfg, std::make_unique<arena_policy>(cfg, sim));
  auto* p = static_cast<char*>(buckets.allocate(4096));
  const shared_memory m = buckets.share(p, 4096);
  ASSERT_EQ(m.handles.size(), 1U) << "the slab's granule";
  EXPECT_EQ(static_cast<char*>(m.base) + m.offset, p);
  buckets.deallocate(p, 4096);
}

}  // namespace
}  // namespace fragctl
