// The caching policy against PyTorch itself: replaying real H200 training
// traces (tests/data, recorded with torch.cuda.memory._record_memory_history)
// must hold peak reserved / peak requested within 3% of what PyTorch's
// CUDACachingAllocator held on the same run (shared/traces/README.md). With
// PyTorch's own segment addresses, every allocation must land where PyTorch
// put it.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <cstdlib>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "allocator_policies/caching/caching_policy.hpp"
#include "fragctl/sim_backend.hpp"
#include "fragctl/trace.hpp"
#include "util/strings.hpp"

namespace fragctl {
namespace {

// A backend that hands out, for each segment size, the addresses PyTorch's
// cudaMalloc returned for that size, in the trace's order. Nothing else is
// used by the caching policy on a single stream.
class recorded_address_backend final : public device_backend {
 public:
  explicit recorded_address_backend(std::map<std::size_t, std::deque<std::uint64_t>> addresses)
      : addresses_(std::move(addresses)) {}
  std::vector<std::size_t> segment_sizes;  ///< sizes asked for, in order

  [[nodiscard]] std::string_view name() const noexcept override { return "recorded"; }
  [[nodiscard]] int device() const noexcept override { return 0; }
  [[nodiscard]] bool supports_virtual_memory() const noexcept override { return false; }
  [[nodiscard]] std::size_t granularity() const noexcept override { return 2 * MiB; }

 private:
  void* do_allocate(std::size_t bytes) override {
    segment_sizes.push_back(bytes);
    auto& queue = addresses_[bytes];
    if (queue.empty()) return nullptr;  // more segments of this size than PyTorch made
    const std::uint64_t a = queue.front();
    queue.pop_front();
    return reinterpret_cast<void*>(static_cast<std::uintptr_t>(a));
  }
  void do_free(void*, std::size_t) override {}
  void* do_reserve_address(std::size_t, std::size_t) override { return nullptr; }
  void do_release_address(void*, std::size_t) override {}
  std::optional<physical_handle> do_create_physical(std::size_t) override { return std::nullopt; }
  void do_release_physical(physical_handle, std::size_t) override {}
  bool do_map(void*, std::size_t, physical_handle) override { return false; }
  bool do_set_access(void*, std::size_t) override { return false; }
  void do_unmap(void*, std::size_t) override {}
  event_t do_create_event() override { return &addresses_; }
  void do_destroy_event(event_t) override {}
  void do_record_event(event_t, stream_t) override {}
  bool do_query_event(event_t) override { return true; }
  void do_synchronize_event(event_t) override {}
  void do_synchronize_stream(stream_t) override {}
  stream_t do_create_stream() override { return nullptr; }
  void do_destroy_stream(stream_t) override {}
  memory_info do_get_memory_info() override { return {0, 141 * GiB}; }
  void* do_allocate_host(std::size_t) override { return nullptr; }
  void do_free_host(void*, std::size_t) override {}
  void do_memcpy_async(void*, const void*, std::size_t, stream_t) override {}

  std::map<std::size_t, std::deque<std::uint64_t>> addresses_;
};

// One row of the trace CSV, as the recording allocator wrote it.
struct csv_row {
  std::string action;
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
};

// Every row of a gzip-compressed trace CSV, segment rows included (read_trace
// keeps only allocs and frees).
std::vector<csv_row> read_rows(const std::string& path) {
  std::vector<csv_row> rows;
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) return rows;
  char line[512];
  while (gzgets(file, line, sizeof line) != nullptr) {
    const std::vector<std::string_view> fields = util::split(util::trim(line), ',');
    csv_row row;
    if (fields.size() != 5 || !util::parse_u64(fields[1], row.addr) ||
        !util::parse_u64(fields[2], row.size)) {
      continue;  // the header
    }
    row.action = std::string(fields[0]);
    rows.push_back(std::move(row));
  }
  gzclose(file);
  return rows;
}

struct replay_result {
  std::size_t peak_requested = 0;
  std::size_t peak_reserved = 0;
  std::size_t segments = 0;
  [[nodiscard]] double ratio() const {
    return static_cast<double>(peak_reserved) / static_cast<double>(peak_requested);
  }
};

std::string data_path(const std::string& file) {
  const char* dir = std::getenv("FRAGCTL_TEST_DATA");
  return std::string(dir != nullptr ? dir : "tests/data") + "/" + file;
}

// Replays allocs and frees as the program made them, on an H200-sized sim.
replay_result replay(const trace& t) {
  sim_options options;
  options.capacity = 141 * GiB;
  sim_backend sim(options);
  caching_policy policy(config{}, sim);

  struct live_block {
    void* ptr;
    std::size_t size;
    stream_t stream;
  };
  absl::flat_hash_map<std::uint64_t, live_block> live;
  std::size_t requested = 0;
  replay_result r;
  auto release = [&](auto it) {
    policy.deallocate(it->second.ptr, it->second.size, it->second.stream);
    requested -= it->second.size;
    live.erase(it);
  };
  for (const trace_event& e : t.events) {
    const auto stream = reinterpret_cast<stream_t>(static_cast<std::uintptr_t>(e.stream));
    if (e.kind == trace_event::action::alloc) {
      if (auto it = live.find(e.addr); it != live.end()) release(it);
      live.emplace(e.addr, live_block{policy.allocate(e.size, stream), e.size, stream});
      requested += e.size;
      r.peak_requested = std::max(r.peak_requested, requested);
    } else if (auto it = live.find(e.addr); it != live.end()) {
      release(it);
    }
  }
  r.peak_reserved = sim.counters().peak_held_bytes;
  r.segments = policy.state().segments;
  while (!live.empty()) release(live.begin());
  return r;
}

void expect_close_to_pytorch(const std::string& file, std::size_t trace_peak, double pytorch_ratio) {
  const absl::StatusOr<trace> t = read_trace(data_path(file));
  ASSERT_TRUE(t.ok()) << t.status();
  const replay_result r = replay(*t);
  EXPECT_EQ(r.peak_requested, trace_peak) << "the replay must see the program's live bytes";
  const double ratio = r.ratio();
  ::testing::Test::RecordProperty("reserved_over_requested", std::to_string(ratio));
  ::testing::Test::RecordProperty("segments", std::to_string(r.segments));
  EXPECT_NEAR(ratio / pytorch_ratio, 1.0, 0.03)
      << file << ": caching " << ratio << " vs PyTorch " << pytorch_ratio << " (peak reserved "
      << r.peak_reserved << ", peak requested " << r.peak_requested << ", " << r.segments
      << " segments)";
}

// With the segment addresses PyTorch got, the same algorithm must give every
// allocation PyTorch's address and ask for the same segments in the same order.
void expect_pytorch_addresses(const std::string& file) {
  const std::vector<csv_row> rows = read_rows(data_path(file));
  ASSERT_FALSE(rows.empty()) << "cannot read " << data_path(file);
  std::map<std::size_t, std::deque<std::uint64_t>> addresses;
  std::vector<std::size_t> pytorch_segments;
  for (const csv_row& r : rows) {
    if (r.action == "segment_alloc") {
      addresses[r.size].push_back(r.addr);
      pytorch_segments.push_back(r.size);
    }
  }
  recorded_address_backend backend(std::move(addresses));
  caching_policy policy(config{}, backend);
  absl::flat_hash_map<std::uint64_t, std::pair<void*, std::size_t>> live;
  std::size_t allocs = 0;
  std::size_t same_address = 0;
  for (const csv_row& r : rows) {
    if (r.action == "alloc") {
      void* p = policy.allocate(r.size);
      ++allocs;
      if (reinterpret_cast<std::uintptr_t>(p) == r.addr) ++same_address;
      live[r.addr] = {p, r.size};
    } else if (r.action == "free_requested") {
      const auto it = live.find(r.addr);
      ASSERT_NE(it, live.end()) << "free of an address never allocated: " << r.addr;
      policy.deallocate(it->second.first, it->second.second);
      live.erase(it);
    }
  }
  EXPECT_EQ(same_address, allocs) << file;
  EXPECT_EQ(backend.segment_sizes, pytorch_segments) << file;
  for (const auto& [addr, block] : live) policy.deallocate(block.first, block.second);
}

TEST(caching_fidelity, gpt2m_allocations_land_at_pytorchs_addresses) {
  expect_pytorch_addresses("gpt2m.trace.csv.gz");
}

TEST(caching_fidelity, resnet50_allocations_land_at_pytorchs_addresses) {
  expect_pytorch_addresses("resnet50.trace.csv.gz");
}

TEST(caching_fidelity, gpt2m_matches_pytorch_within_3_percent) {
  expect_close_to_pytorch("gpt2m.trace.csv.gz", 25'207'805'136, 1.341);
}

TEST(caching_fidelity, resnet50_matches_pytorch_within_3_percent) {
  expect_close_to_pytorch("resnet50.trace.csv.gz", 6'105'339'108, 1.110);
}

}  // namespace
}  // namespace fragctl
