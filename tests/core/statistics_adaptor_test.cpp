// statistics_adaptor and the stats exports: exact counters over a scripted
// sequence, derived metrics, JSON round trip, Prometheus text.
#include <memory>
#include <string>

#include "core/passthrough_allocator.hpp"
#include "fragctl/adaptors.hpp"
#include "fragctl/error.hpp"
#include "fragctl/sim_backend.hpp"
#include "fragctl/stats.hpp"
#include "gtest/gtest.h"

namespace fragctl {
namespace {

using testing::passthrough_allocator;

class statistics_adaptor_test : public ::testing::Test {
 protected:
  sim_backend backend_{sim_options{.capacity = 64 * MiB}};
  statistics_adaptor stats_{std::make_unique<passthrough_allocator>(backend_)};
};

TEST_F(statistics_adaptor_test, counts_bytes_and_peaks_exactly) {
  void* a = stats_.allocate(1000);
  void* b = stats_.allocate(4096, reinterpret_cast<stream_t>(7));
  void* c = stats_.allocate(MiB + 1);
  stats_.deallocate(b, 4096, reinterpret_cast<stream_t>(7));
  void* d = stats_.allocate(100);

  const allocator_stats s = stats_.stats();
  EXPECT_EQ(s.allocator, "passthrough");
  EXPECT_EQ(s.backend, "sim");
  EXPECT_EQ(s.device, 0);
  EXPECT_EQ(s.requested.current, 1000u + (MiB + 1) + 100);
  EXPECT_EQ(s.requested.peak, 1000u + 4096 + (MiB + 1));
  EXPECT_EQ(s.allocated.current, 1024u + (MiB + 512) + 512);
  EXPECT_EQ(s.allocated.peak, 1024u + 4096 + (MiB + 512));
  // The passthrough policy holds exactly its rounded blocks from the backend.
  EXPECT_EQ(s.reserved.current, s.allocated.current);
  EXPECT_EQ(s.reserved.peak, s.allocated.peak);
  EXPECT_EQ(s.allocations, 4u);
  EXPECT_EQ(s.frees, 1u);
  EXPECT_EQ(s.ooms, 0u);
  EXPECT_EQ(s.backend_calls.of(backend_call::allocate), 4u);
  EXPECT_EQ(s.backend_calls.of(backend_call::free), 1u);
  EXPECT_EQ(s.pool.segments, 3u);
  EXPECT_EQ(s.internal_waste(), 24u + 511 + 412);

  stats_.deallocate(a, 1000);
  stats_.deallocate(c, MiB + 1);
  stats_.deallocate(d, 100);
  const allocator_stats end = stats_.stats();
  EXPECT_EQ(end.requested.current, 0u);
  EXPECT_EQ(end.allocated.current, 0u);
  EXPECT_EQ(end.reserved.current, 0u);
  EXPECT_EQ(end.requested.peak, s.requested.peak);
  EXPECT_EQ(end.frees, 4u);
}

TEST_F(statistics_adaptor_test, histogram_buckets_by_log2_of_request) {
  for (const std::size_t bytes : {std::size_t{1}, std::size_t{100}, std::size_t{1000}, std::size_t{1023},
                                  std::size_t{1024}, std::size_t{4096}, MiB + 1}) {
    stats_.deallocate(stats_.allocate(bytes), bytes);
  }
  const allocator_stats s = stats_.stats();
  EXPECT_EQ(s.size_histogram[0], 1u);
  EXPECT_EQ(s.size_histogram[6], 1u);   // 100
  EXPECT_EQ(s.size_histogram[9], 2u);   // 1000, 1023
  EXPECT_EQ(s.size_histogram[10], 1u);  // 1024
  EXPECT_EQ(s.size_histogram[12], 1u);  // 4096
  EXPECT_EQ(s.size_histogram[20], 1u);  // 1 MiB + 1
  std::uint64_t total = 0;
  for (const auto n : s.size_histogram) total += n;
  EXPECT_EQ(total, 7u);
  EXPECT_EQ(s.size_histogram_sum, 1u + 100 + 1000 + 1023 + 1024 + 4096 + MiB + 1);
}

TEST(size_histogram_bucket, is_floor_log2_capped_at_last_bucket) {
  EXPECT_EQ(size_histogram_bucket(1), 0u);
  EXPECT_EQ(size_histogram_bucket(2), 1u);
  EXPECT_EQ(size_histogram_bucket(3), 1u);
  EXPECT_EQ(size_histogram_bucket(512), 9u);
  EXPECT_EQ(size_histogram_bucket(1023), 9u);
  EXPECT_EQ(size_histogram_bucket(GiB), 30u);
  EXPECT_EQ(size_histogram_bucket(std::size_t{1} << 62), size_histogram_buckets - 1);
}

TEST_F(statistics_adaptor_test, oom_is_counted_and_rethrown) {
  void* a = stats_.allocate(60 * MiB);
  EXPECT_THROW((void)stats_.allocate(8 * MiB), out_of_memory);
  const allocator_stats s = stats_.stats();
  EXPECT_EQ(s.ooms, 1u);
  EXPECT_EQ(s.allocations, 1u);
  EXPECT_EQ(s.requested.current, 60 * MiB);
  EXPECT_EQ(s.size_histogram[size_histogram_bucket(8 * MiB)], 0u);
  stats_.deallocate(a, 60 * MiB);
}

TEST_F(statistics_adaptor_test, misuse_is_counted_and_sizes_accounted_truly) {
  int foreign = 0;
  stats_.deallocate(&foreign, 64);
  allocator_stats s = stats_.stats();
  EXPECT_EQ(s.misuse_not_owned, 1u);
  EXPECT_EQ(s.frees, 0u);
  EXPECT_EQ(stats_.misuse().not_owned, 1u);

  void* p = stats_.allocate(2048);
  stats_.deallocate(p, 1024);  // wrong size: freed with the recorded 2048
  s = stats_.stats();
  EXPECT_EQ(s.misuse_size_mismatch, 1u);
  EXPECT_EQ(s.frees, 1u);
  EXPECT_EQ(s.requested.current, 0u);
  EXPECT_EQ(s.allocated.current, 0u);

  stats_.deallocate(p, 2048);  // double free
  EXPECT_EQ(stats_.stats().misuse_not_owned, 2u);
  EXPECT_EQ(stats_.stats().frees, 1u);
}

TEST(allocator_stats, derived_metrics) {
  allocator_stats s;
  EXPECT_EQ(s.reserved_over_requested(), 0.0);
  EXPECT_EQ(s.fragmentation(), 0.0);
  EXPECT_EQ(s.external_fragmentation(), 0.0);
  s.requested = {80, 100};
  s.allocated = {96, 120};
  s.reserved = {150, 150};
  s.pool.cached_free = 100;
  s.pool.largest_free_block = 25;
  EXPECT_DOUBLE_EQ(s.reserved_over_requested(), 1.5);
  EXPECT_DOUBLE_EQ(s.fragmentation(), 1.0 - 100.0 / 150.0);
  EXPECT_DOUBLE_EQ(s.external_fragmentation(), 0.75);
  EXPECT_EQ(s.internal_waste(), 16u);
}

allocator_stats sample_stats() {
  allocator_stats s;
  s.allocator = "warmup:arena";
  s.backend = "sim";
  s.device = 3;
  s.requested = {1, 2};
  s.allocated = {3, 4};
  s.reserved = {5, 6};
  s.allocations = 7;
  s.frees = 8;
  s.ooms = 9;
  s.retries = 10;
  s.misuse_not_owned = 11;
  s.misuse_size_mismatch = 12;
  for (std::size_t i = 0; i < s.backend_calls.calls.size(); ++i) s.backend_calls.calls[i] = 100 + i;
  s.backend_calls.held_bytes = 13;
  s.backend_calls.peak_held_bytes = 14;
  s.backend_calls.host_bytes = 15;
  s.backend_calls.failed_allocations = 16;
  s.pool = {17, 18, 19, 20, 21, 22, {}, 24, 25};
  for (std::size_t i = 0; i < size_histogram_buckets; ++i) s.size_histogram[i] = i * i;
  s.size_histogram[47] = std::uint64_t{1} << 60;
  s.size_histogram_sum = 23;
  return s;
}

void expect_same(const allocator_stats& a, const allocator_stats& b) {
  EXPECT_EQ(a.allocator, b.allocator);
  EXPECT_EQ(a.backend, b.backend);
  EXPECT_EQ(a.device, b.device);
  EXPECT_EQ(a.requested.current, b.requested.current);
  EXPECT_EQ(a.requested.peak, b.requested.peak);
  EXPECT_EQ(a.allocated.current, b.allocated.current);
  EXPECT_EQ(a.allocated.peak, b.allocated.peak);
  EXPECT_EQ(a.reserved.current, b.reserved.current);
  EXPECT_EQ(a.reserved.peak, b.reserved.peak);
  EXPECT_EQ(a.allocations, b.allocations);
  EXPECT_EQ(a.frees, b.frees);
  EXPECT_EQ(a.ooms, b.ooms);
  EXPECT_EQ(a.retries, b.retries);
  EXPECT_EQ(a.misuse_not_owned, b.misuse_not_owned);
  EXPECT_EQ(a.misuse_size_mismatch, b.misuse_size_mismatch);
  EXPECT_EQ(a.backend_calls.calls, b.backend_calls.calls);
  EXPECT_EQ(a.backend_calls.held_bytes, b.backend_calls.held_bytes);
  EXPECT_EQ(a.backend_calls.peak_held_bytes, b.backend_calls.peak_held_bytes);
  EXPECT_EQ(a.backend_calls.host_bytes, b.backend_calls.host_bytes);
  EXPECT_EQ(a.backend_calls.failed_allocations, b.backend_calls.failed_allocations);
  EXPECT_EQ(a.pool.reserved, b.pool.reserved);
  EXPECT_EQ(a.pool.allocated, b.pool.allocated);
  EXPECT_EQ(a.pool.cached_free, b.pool.cached_free);
  EXPECT_EQ(a.pool.largest_free_block, b.pool.largest_free_block);
  EXPECT_EQ(a.pool.segments, b.pool.segments);
  EXPECT_EQ(a.pool.retries, b.pool.retries);
  EXPECT_EQ(a.pool.pause_detached_exports, b.pool.pause_detached_exports);
  EXPECT_EQ(a.pool.pause_detached_export_bytes, b.pool.pause_detached_export_bytes);
  EXPECT_EQ(a.size_histogram, b.size_histogram);
  EXPECT_EQ(a.size_histogram_sum, b.size_histogram_sum);
}

TEST(stats_json, round_trips_every_field) {
  const allocator_stats s = sample_stats();
  const std::string json = to_json(s);
  EXPECT_NE(json.find("\"schema_version\": 1"), std::string::npos);
  EXPECT_NE(json.find("\"create_physical\": 104"), std::string::npos);
  EXPECT_NE(json.find("\"reserved_over_requested\": 3.0"), std::string::npos);
  auto back = stats_from_json(json);
  ASSERT_TRUE(back.ok()) << back.status();
  expect_same(*back, s);
}

TEST(stats_json, round_trips_a_live_adaptor) {
  sim_backend backend;
  statistics_adaptor stats(std::make_unique<passthrough_allocator>(backend));
  void* p = stats.allocate(3000);
  stats.deallocate(stats.allocate(5000), 5000);
  const allocator_stats s = stats.stats();
  auto back = stats_from_json(to_json(s));
  ASSERT_TRUE(back.ok()) << back.status();
  expect_same(*back, s);
  stats.deallocate(p, 3000);
}

TEST(stats_json, reads_a_report_of_one_allocator) {
  const std::string report =
      "{\"schema_version\": 1, \"allocators\": [" + to_json(sample_stats()) + "]}";
  auto back = stats_from_json(report);
  ASSERT_TRUE(back.ok()) << back.status();
  expect_same(*back, sample_stats());
}

TEST(stats_json, missing_fields_stay_zero) {
  auto back = stats_from_json(R"({"schema_version": 1, "requested_bytes": {"peak": 42}})");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->requested.peak, 42u);
  EXPECT_EQ(back->requested.current, 0u);
  EXPECT_EQ(back->allocations, 0u);
}

TEST(stats_json, rejects_bad_documents_with_a_reason) {
  const auto message = [](std::string_view text) {
    auto r = stats_from_json(text);
    EXPECT_FALSE(r.ok()) << text;
    return std::string(r.status().message());
  };
  EXPECT_NE(message("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(message("{}").find("schema_version"), std::string::npos);
  EXPECT_NE(message(R"({"schema_version": 99})").find("99"), std::string::npos);
  EXPECT_NE(message(R"({"schema_version": 1, "frees": "many"})").find("\"frees\""), std::string::npos);
  EXPECT_NE(message(R"({"schema_version": 1, "pool": {"segments": -1}})").find("pool.segments"),
            std::string::npos);
  EXPECT_NE(message(R"({"schema_version": 1, "allocators": [{"schema_version": 1}, {"schema_version": 1}]})")
                .find("2 allocators"),
            std::string::npos);
}

TEST(stats_prometheus, exposes_typed_labelled_metrics) {
  const std::string text = to_prometheus(sample_stats());
  const std::string labels = R"({allocator="warmup:arena",backend="sim",device="3"})";
  const auto has = [&](const std::string& line) {
    EXPECT_NE(text.find(line + "\n"), std::string::npos) << "missing: " << line << "\n" << text;
  };
  has("# HELP fragctl_requested_bytes Bytes callers asked for, live now.");
  has("# TYPE fragctl_requested_bytes gauge");
  has("fragctl_requested_bytes" + labels + " 1");
  has("fragctl_requested_peak_bytes" + labels + " 2");
  has("fragctl_reserved_peak_bytes" + labels + " 6");
  has("# TYPE fragctl_allocations_total counter");
  has("fragctl_allocations_total" + labels + " 7");
  has("fragctl_ooms_total" + labels + " 9");
  has(R"(fragctl_misuse_total{allocator="warmup:arena",backend="sim",device="3",kind="size_mismatch"} 12)");
  has(R"(fragctl_backend_calls_total{allocator="warmup:arena",backend="sim",device="3",call="create_physical"} 104)");
  has("fragctl_reserved_over_requested_ratio" + labels + " 3");
  has("fragctl_pause_detached_exports_total" + labels + " 24");
  has("fragctl_pause_detached_export_bytes_total" + labels + " 25");
  // The size histogram: cumulative buckets (bucket i holds i*i requests, the
  // last 2^60), le the largest size of a bucket, then _sum and _count.
  has("# TYPE fragctl_request_size_bytes histogram");
  const std::string hl = R"(allocator="warmup:arena",backend="sim",device="3")";
  has("fragctl_request_size_bytes_bucket{" + hl + R"(,le="1"} 0)");
  has("fragctl_request_size_bytes_bucket{" + hl + R"(,le="3"} 1)");
  has("fragctl_request_size_bytes_bucket{" + hl + R"(,le="7"} 5)");
  std::uint64_t below_last = 0;
  for (std::uint64_t i = 0; i + 1 < size_histogram_buckets; ++i) below_last += i * i;
  has("fragctl_request_size_bytes_bucket{" + hl + ",le=\"" + std::to_string((std::uint64_t{1} << 47) - 1) +
      "\"} " + std::to_string(below_last));
  has("fragctl_request_size_bytes_bucket{" + hl + R"(,le="+Inf"} )" + std::to_string(below_last + (std::uint64_t{1} << 60)));
  has("fragctl_request_size_bytes_sum" + labels + " 23");
  has("fragctl_request_size_bytes_count" + labels + " " + std::to_string(below_last + (std::uint64_t{1} << 60)));
  EXPECT_EQ(text.find("requests_by_size"), std::string::npos);
  // Every counter family ends in _total.
  std::size_t pos = 0;
  while ((pos = text.find("# TYPE ", pos)) != std::string::npos) {
    const std::size_t end = text.find('\n', pos);
    const std::string line = text.substr(pos, end - pos);
    if (line.ends_with(" counter")) {
      EXPECT_NE(line.find("_total "), std::string::npos) << line;
    }
    pos = end;
  }
}

TEST(stats_prometheus, escapes_label_values) {
  allocator_stats s;
  s.allocator = "a\"b\\c";
  EXPECT_NE(to_prometheus(s).find(R"(allocator="a\"b\\c")"), std::string::npos);
}

}  // namespace
}  // namespace fragctl
