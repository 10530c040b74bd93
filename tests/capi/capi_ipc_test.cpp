// fragctl_export_block / fragctl_import_block / fragctl_close_block (issue 30,
// item 1) on the sim backend, backed: a handle of arena memory maps the same
// bytes elsewhere and keeps them after the exporter freed the block and gave
// the memory back; a handle of a plain allocation is PyTorch's own form; bad
// handles and addresses are refused with a message. (Across processes the
// descriptors are taken with pidfd_getfd; that is checked on the GPU machine,
// benchmarks/interop/ipc_share.py.)
#include "fragctl/fragctl.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

fragctl_allocator* make(const char* policy) {
  fragctl_allocator* a = nullptr;
  EXPECT_EQ(fragctl_create(policy, "sim_capacity:256MiB,sim_backed:true,map_chunk:0,release_threshold:0,"
                                   "release_delay:0",
                           "sim", 0, &a),
            FRAGCTL_OK)
      << fragctl_last_error();
  return a;
}

struct exported {
  std::vector<char> handle;
  std::size_t offset = 0;
};

exported export_of(fragctl_allocator* a, void* ptr, std::size_t bytes) {
  exported e;
  std::size_t size = 0;
  EXPECT_EQ(fragctl_export_block(a, ptr, bytes, nullptr, 0, &size, &e.offset), FRAGCTL_OK) << fragctl_last_error();
  e.handle.resize(size);
  EXPECT_EQ(fragctl_export_block(a, ptr, bytes, e.handle.data(), e.handle.size(), &size, &e.offset), FRAGCTL_OK)
      << fragctl_last_error();
  return e;
}

std::size_t device_used(fragctl_allocator* a) {
  std::size_t free = 0, total = 0;
  EXPECT_EQ(fragctl_device_memory(a, &free, &total), FRAGCTL_OK);
  return total - free;
}

TEST(CApiIpc, ArenaMemoryMapsElsewhereAndOutlivesTheExportersFree) {
  fragctl_allocator* a = make("arena");
  void* p = nullptr;
  const std::size_t bytes = 5 * MiB;  // three 2 MiB granules
  ASSERT_EQ(fragctl_malloc(a, &p, bytes, nullptr), FRAGCTL_OK);
  std::memset(p, 0x42, bytes);

  const exported e = export_of(a, p, bytes);
  ASSERT_GE(e.handle.size(), 2U);
  EXPECT_EQ(e.handle[0], 2) << "PyTorch's handle version byte";
  EXPECT_EQ(e.handle[1], 'F') << "fragctl's mapped-memory kind";
  EXPECT_EQ(e.handle, export_of(a, p, bytes).handle) << "the same block gives the same handle string";

  void* base = nullptr;
  ASSERT_EQ(fragctl_import_block(a, e.handle.data(), e.handle.size(), &base), FRAGCTL_OK) << fragctl_last_error();
  ASSERT_NE(base, nullptr);
  auto* view = static_cast<unsigned char*>(base) + e.offset;
  EXPECT_NE(static_cast<void*>(view), p) << "mapped at another address";
  EXPECT_EQ(view[0], 0x42);
  EXPECT_EQ(view[bytes - 1], 0x42);
  view[17] = 0x07;
  EXPECT_EQ(static_cast<unsigned char*>(p)[17], 0x07) << "writes go both ways";

  // The exporter frees and gives its cache back; the import keeps the bytes.
  const std::size_t used = device_used(a);
  ASSERT_EQ(fragctl_free(a, p, bytes, nullptr), FRAGCTL_OK);
  ASSERT_EQ(fragctl_release_cached(a), FRAGCTL_OK);
  EXPECT_EQ(device_used(a), used) << "memory an importer maps stays on the device";
  EXPECT_EQ(view[bytes - 1], 0x42);
  ASSERT_EQ(fragctl_close_block(a, base), FRAGCTL_OK) << fragctl_last_error();
  EXPECT_EQ(device_used(a), 0U) << "closed, the memory returns to the device";
  EXPECT_EQ(fragctl_close_block(a, base), FRAGCTL_ERROR_INVALID_ARGUMENT) << "closed once";
  ASSERT_EQ(fragctl_destroy(a), FRAGCTL_OK);
}

// The backend's count of one kind of call, from the statistics' JSON
// ("backend_counters": {"calls": {"map": N, ...}}).
std::uint64_t backend_calls(fragctl_allocator* a, const std::string& call) {
  char* json = nullptr;
  EXPECT_EQ(fragctl_stats_json(a, &json), FRAGCTL_OK);
  const std::string text(json);
  fragctl_string_free(json);
  const std::size_t at = text.find("\"" + call + "\":", text.find("\"calls\""));
  EXPECT_NE(at, std::string::npos) << call;
  return std::stoull(text.substr(at + call.size() + 3));
}

struct span_list {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;
  static void visit(std::uint64_t address, std::uint64_t size, void* self) {
    static_cast<span_list*>(self)->spans.emplace_back(address, size);
  }
};

// Another process's memory is not fragctl's: mapping it is neither counted
// among the allocator's driver calls nor reported as a span (which PyTorch's
// trace trackers would hand to NCCL's registration hook).
TEST(CApiIpc, AnImportIsNeitherCountedNorASpan) {
  fragctl_allocator* a = make("arena");
  void* p = nullptr;
  const std::size_t bytes = 5 * MiB;
  ASSERT_EQ(fragctl_malloc(a, &p, bytes, nullptr), FRAGCTL_OK);
  const exported e = export_of(a, p, bytes);
  const std::uint64_t maps = backend_calls(a, "map");
  const std::uint64_t grants = backend_calls(a, "set_access");
  const std::uint64_t unmaps = backend_calls(a, "unmap");
  ASSERT_GT(maps, 0U) << "positive control: the arena's own mapping is counted";
  span_list own;
  ASSERT_EQ(fragctl_spans(a, &span_list::visit, &own), FRAGCTL_OK);
  ASSERT_FALSE(own.spans.empty()) << "positive control: the arena's own spans are listed";

  void* base = nullptr;
  ASSERT_EQ(fragctl_import_block(a, e.handle.data(), e.handle.size(), &base), FRAGCTL_OK) << fragctl_last_error();
  span_list after;
  ASSERT_EQ(fragctl_spans(a, &span_list::visit, &after), FRAGCTL_OK);
  EXPECT_EQ(after.spans, own.spans) << "the import is not a span of this allocator";
  EXPECT_EQ(backend_calls(a, "map"), maps);
  EXPECT_EQ(backend_calls(a, "set_access"), grants);
  ASSERT_EQ(fragctl_close_block(a, base), FRAGCTL_OK) << fragctl_last_error();
  EXPECT_EQ(backend_calls(a, "unmap"), unmaps);
  ASSERT_EQ(fragctl_free(a, p, bytes, nullptr), FRAGCTL_OK);
  ASSERT_EQ(fragctl_destroy(a), FRAGCTL_OK);
}

// Issue 30: pausing an allocator whose block was exported closes the
// exports (the old handle imports nothing any more), counts them in the
// statistics ("pause": {"detached_exports": N, ...}), and after resume the
// block's handle is a new one, which imports the resumed contents.
TEST(CApiIpc, APauseClosesExportsAndResumeExportsAnew) {
  fragctl_allocator* a = make("arena");
  void* p = nullptr;
  const std::size_t bytes = 4 * MiB;  // two 2 MiB granules, one handle each
  ASSERT_EQ(fragctl_malloc(a, &p, bytes, nullptr), FRAGCTL_OK);
  std::memset(p, 0x51, bytes);
  const exported before = export_of(a, p, bytes);
  void* old_base = nullptr;
  ASSERT_EQ(fragctl_import_block(a, before.handle.data(), before.handle.size(), &old_base), FRAGCTL_OK)
      << fragctl_last_error();

  ASSERT_EQ(fragctl_pause(a, FRAGCTL_PAUSE_KEEP_HOST), FRAGCTL_OK) << fragctl_last_error();
  char* json = nullptr;
  ASSERT_EQ(fragctl_stats_json(a, &json), FRAGCTL_OK);
  const std::string text(json);
  fragctl_string_free(json);
  EXPECT_NE(text.find("\"detached_exports\": 2"), std::string::npos) << text;
  EXPECT_NE(text.find("\"detached_export_bytes\": " + std::to_string(bytes)), std::string::npos) << text;
  void* stale = nullptr;
  EXPECT_NE(fragctl_import_block(a, before.handle.data(), before.handle.size(), &stale), FRAGCTL_OK)
      << "the old handle's exports are closed";
  EXPECT_EQ(stale, nullptr);

  ASSERT_EQ(fragctl_resume(a), FRAGCTL_OK) << fragctl_last_error();
  std::memset(p, 0x52, MiB);
  const exported after = export_of(a, p, bytes);
  EXPECT_NE(after.handle, before.handle) << "new handles, new descriptors and serials";
  void* base = nullptr;
  ASSERT_EQ(fragctl_import_block(a, after.handle.data(), after.handle.size(), &base), FRAGCTL_OK)
      << fragctl_last_error();
  auto* view = static_cast<unsigned char*>(base) + after.offset;
  EXPECT_EQ(view[0], 0x52) << "the resumed memory";
  EXPECT_EQ(view[bytes - 1], 0x51) << "with the contents kept";
  EXPECT_EQ((static_cast<unsigned char*>(old_base) + before.offset)[0], 0x51) << "the old import keeps the old memory";
  ASSERT_EQ(fragctl_close_block(a, base), FRAGCTL_OK);
  ASSERT_EQ(fragctl_close_block(a, old_base), FRAGCTL_OK);
  ASSERT_EQ(fragctl_free(a, p, bytes, nullptr), FRAGCTL_OK);
  ASSERT_EQ(fragctl_destroy(a), FRAGCTL_OK);
}

TEST(CApiIpc, PlainAllocationsGivePyTorchsHandleForm) {
  for (const char* policy : {"caching", "buckets:caching"}) {
    SCOPED_TRACE(policy);
    fragctl_allocator* a = make(policy);
    void* first = nullptr;
    void* second = nullptr;
    ASSERT_EQ(fragctl_malloc(a, &first, 4096, nullptr), FRAGCTL_OK);
    ASSERT_EQ(fragctl_malloc(a, &second, 4096, nullptr), FRAGCTL_OK);
    const exported e = export_of(a, second, 4096);
    ASSERT_EQ(e.handle.size(), 2U + 64U) << "version, 'c', then the runtime's 64-byte IPC handle";
    EXPECT_EQ(e.handle[0], 2);
    EXPECT_EQ(e.handle[1], 'c');
    void* base = nullptr;
    ASSERT_EQ(fragctl_import_block(a, e.handle.data(), e.handle.size(), &base), FRAGCTL_OK) << fragctl_last_error();
    EXPECT_EQ(static_cast<char*>(base) + e.offset, second) << "the sim opens its own allocation in place";
    void* again = nullptr;
    ASSERT_EQ(fragctl_import_block(a, e.handle.data(), e.handle.size(), &again), FRAGCTL_OK);
    EXPECT_EQ(again, base) << "the same base again: each open gets its close";
    ASSERT_EQ(fragctl_close_block(a, again), FRAGCTL_OK);
    // One open is left: the allocator whose backend closes it stays (each
    // open counts, not only the first).
    ASSERT_EQ(fragctl_free(a, first, 4096, nullptr), FRAGCTL_OK);
    ASSERT_EQ(fragctl_free(a, second, 4096, nullptr), FRAGCTL_OK);
    EXPECT_EQ(fragctl_destroy(a), FRAGCTL_ERROR_STATE);
    ASSERT_EQ(fragctl_close_block(a, base), FRAGCTL_OK);
    EXPECT_EQ(fragctl_close_block(a, base), FRAGCTL_ERROR_INVALID_ARGUMENT);
    ASSERT_EQ(fragctl_destroy(a), FRAGCTL_OK);
  }
}

// Regression (red team, 2026-11-28): an allocator a block was imported
// through could be destroyed with the block open, and the close then called
// the destroyed allocator's backend (a segfault). It is refused now (STATE)
// until the block is closed, through any allocator.
TEST(CApiIpc, AnAllocatorIsNotDestroyedWhileABlockImportedThroughItIsOpen) {
  fragctl_allocator* importer = make("arena");
  fragctl_allocator* other = make("arena");
  void* p = nullptr;
  ASSERT_EQ(fragctl_malloc(importer, &p, MiB, nullptr), FRAGCTL_OK);
  const exported e = export_of(importer, p, MiB);
  void* base = nullptr;
  ASSERT_EQ(fragctl_import_block(importer, e.handle.data(), e.handle.size(), &base), FRAGCTL_OK)
      << fragctl_last_error();
  ASSERT_EQ(fragctl_free(importer, p, MiB, nullptr), FRAGCTL_OK);
  EXPECT_EQ(fragctl_destroy(importer), FRAGCTL_ERROR_STATE);
  EXPECT_NE(std::string(fragctl_last_error()).find("fragctl_import_block"), std::string::npos) << fragctl_last_error();
  EXPECT_EQ(fragctl_close_block(other, base), FRAGCTL_OK) << fragctl_last_error();
  EXPECT_EQ(fragctl_close_block(other, base), FRAGCTL_ERROR_INVALID_ARGUMENT) << "closed already";
  EXPECT_EQ(fragctl_destroy(importer), FRAGCTL_OK) << fragctl_last_error();
  EXPECT_EQ(fragctl_destroy(other), FRAGCTL_OK);
}

TEST(CApiIpc, RefusesWhatIsNotAHandleOrNotLiveMemory) {
  fragctl_allocator* a = make("arena");
  void* p = nullptr;
  ASSERT_EQ(fragctl_malloc(a, &p, MiB, nullptr), FRAGCTL_OK);
  std::size_t size = 0, offset = 0;
  char small[4];
  EXPECT_EQ(fragctl_export_block(a, p, MiB, small, sizeof small, &size, &offset), FRAGCTL_ERROR_INVALID_ARGUMENT);
  EXPECT_GT(size, sizeof small) << "the size needed is given";
  int not_device = 0;
  EXPECT_EQ(fragctl_export_block(a, &not_device, 4, nullptr, 0, &size, &offset), FRAGCTL_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fragctl_last_error()).find("not memory of this arena"), std::string::npos)
      << fragctl_last_error();

  void* base = nullptr;
  const char garbage[] = "not a handle";
  EXPECT_EQ(fragctl_import_block(a, garbage, sizeof garbage, &base), FRAGCTL_ERROR_INVALID_ARGUMENT);
  exported e = export_of(a, p, MiB);
  e.handle[1] = 'e';  // PyTorch's expandable segments
  EXPECT_EQ(fragctl_import_block(a, e.handle.data(), e.handle.size(), &base), FRAGCTL_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fragctl_last_error()).find("unknown handle kind"), std::string::npos);
  e.handle[1] = 'F';
  EXPECT_EQ(fragctl_import_block(a, e.handle.data(), e.handle.size() - 1, &base), FRAGCTL_ERROR_INVALID_ARGUMENT)
      << "a truncated handle";
  {
    // A forged size (the first record's bytes, at offset 16 + 16): more than
    // any device holds is refused as a bad handle (was BACKEND, the sizes
    // wrapping to a reservation of 0 bytes).
    std::vector<char> forged = e.handle;
    const std::uint64_t huge = std::uint64_t{1} << 63;
    ASSERT_GE(forged.size(), 40u);
    std::memcpy(forged.data() + 32, &huge, sizeof huge);
    EXPECT_EQ(fragctl_import_block(a, forged.data(), forged.size(), &base), FRAGCTL_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(fragctl_last_error()).find("more than any device holds"), std::string::npos)
        << fragctl_last_error();
  }
  EXPECT_EQ(base, nullptr);
  EXPECT_EQ(fragctl_close_block(a, p), FRAGCTL_ERROR_INVALID_ARGUMENT) << "not an imported address";

  // A freed block's handle names a released descriptor: refused by the backend.
  ASSERT_EQ(fragctl_free(a, p, MiB, nullptr), FRAGCTL_OK);
  ASSERT_EQ(fragctl_release_cached(a), FRAGCTL_OK);
  EXPECT_EQ(fragctl_import_block(a, e.handle.data(), e.handle.size(), &base), FRAGCTL_ERROR_BACKEND);
  ASSERT_EQ(fragctl_destroy(a), FRAGCTL_OK);
}

// Regression (red team): fragctl_export_block accepted ranges that were not
// live: past a block's end, the byte after it, cached free memory, a freed
// block (caching: even after the free). Memory handed to another process
// that way is the next allocation's. Every policy refuses them now; live
// blocks, a part of one and two adjacent ones are exported.
TEST(CApiIpc, OnlyLiveMemoryIsExportedUnderEveryPolicy) {
  int past_the_end_checked = 0;  // the adjacent layouts below, so that those checks are known to run
  for (const char* policy : {"arena", "caching", "buckets:arena", "buckets:caching", "graph_pool"}) {
    SCOPED_TRACE(policy);
    fragctl_allocator* a = make(policy);
    // Small blocks (buckets' slots) and large ones; each pair allocated one after the other.
    for (const std::size_t bytes : {std::size_t{4096}, 2 * MiB}) {
      SCOPED_TRACE(bytes);
      void* p = nullptr;
      void* q = nullptr;
      void* gone = nullptr;
      ASSERT_EQ(fragctl_malloc(a, &p, bytes, nullptr), FRAGCTL_OK) << fragctl_last_error();
      ASSERT_EQ(fragctl_malloc(a, &q, bytes, nullptr), FRAGCTL_OK) << fragctl_last_error();
      ASSERT_EQ(fragctl_malloc(a, &gone, bytes, nullptr), FRAGCTL_OK) << fragctl_last_error();
      ASSERT_EQ(fragctl_free(a, gone, bytes, nullptr), FRAGCTL_OK);
      const auto at = [](void* base, std::size_t k) { return static_cast<char*>(base) + k; };
      std::size_t size = 0, offset = 0;
      const auto refused = [&](void* ptr, std::size_t n) {
        return fragctl_export_block(a, ptr, n, nullptr, 0, &size, &offset) == FRAGCTL_ERROR_INVALID_ARGUMENT;
      };
      // Controls: the block, a part of it, and both blocks where they are adjacent.
      EXPECT_FALSE(refused(p, bytes)) << fragctl_last_error();
      EXPECT_FALSE(refused(at(p, 512), 512)) << fragctl_last_error();
      if (at(p, bytes) == q) {
        EXPECT_FALSE(refused(p, 2 * bytes)) << fragctl_last_error();
      }
      EXPECT_TRUE(refused(gone, bytes)) << "a freed block";
      EXPECT_TRUE(refused(gone, 0)) << "a freed block's first byte";
      if (at(q, bytes) == gone) {
        EXPECT_TRUE(refused(q, bytes + 1)) << "past a live block into a freed one";
        ++past_the_end_checked;
      }
      EXPECT_NE(std::string(fragctl_last_error()).find("not live memory"), std::string::npos) << fragctl_last_error();
      ASSERT_EQ(fragctl_free(a, p, bytes, nullptr), FRAGCTL_OK);
      ASSERT_EQ(fragctl_free(a, q, bytes, nullptr), FRAGCTL_OK);
      EXPECT_TRUE(refused(p, bytes)) << "cached (graph_pool: kept), not live";
    }
    ASSERT_EQ(fragctl_destroy(a), FRAGCTL_OK);
  }
  EXPECT_GE(past_the_end_checked, 5) << "blocks allocated one after another were not adjacent";
}

}  // namespace
