// limiting_adaptor, tracing_adaptor, thread_safe_adaptor and block_table_adaptor over a test policy.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/passthrough_allocator.hpp"
#include "fmt/format.h"
#include "fragctl/adaptors.hpp"
#include "fragctl/allocator_stack.hpp"
#include "fragctl/config.hpp"
#include "fragctl/error.hpp"
#include "fragctl/oom.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/sim_backend.hpp"
#include "fragctl/trace.hpp"
#include "gtest/gtest.h"
#include "support/test_support.hpp"
#include "util/strings.hpp"

namespace fragctl {
namespace {

using testing::passthrough_allocator;

std::string temp_path(std::string_view name) {
  return fmt::format("{}/fragctl_{}_{}", ::testing::TempDir(), ::getpid(), name);
}

TEST(limiting_adaptor, refuses_over_the_cap_and_changes_nothing) {
  sim_backend backend;
  limiting_adaptor limit(std::make_unique<passthrough_allocator>(backend), 8 * KiB);
  void* a = limit.allocate(4096);
  void* b = limit.allocate(4000);  // counts as its rounded 4096
  EXPECT_EQ(limit.used(), 8 * KiB);
  const auto calls = backend.counters().of(backend_call::allocate);

  try {
    (void)limit.allocate(1);
    ADD_FAILURE() << "allocation over the limit succeeded";
  } catch (const out_of_memory& e) {
    EXPECT_EQ(e.details().requested, limit.allocation_size(1)) << "what the cap counts: the rounded size";
    EXPECT_EQ(e.details().device_free, 0u);
    EXPECT_EQ(e.details().device_total, 8 * KiB);
    EXPECT_FALSE(e.details().caused_by_fragmentation());
    EXPECT_NE(std::string(e.what()).find("limit of 8192 bytes"), std::string::npos) << e.what();
  }
  EXPECT_EQ(limit.used(), 8 * KiB);
  EXPECT_EQ(backend.counters().of(backend_call::allocate), calls);

  limit.deallocate(b, 4000);
  EXPECT_EQ(limit.used(), 4 * KiB);
  void* c = limit.allocate(4096);
  EXPECT_NE(c, nullptr);
  limit.deallocate(a, 4096);
  limit.deallocate(c, 4096);
  EXPECT_EQ(limit.used(), 0u);
}

TEST(limiting_adaptor, counts_rounded_sizes_and_misuse) {
  sim_backend backend;
  limiting_adaptor limit(std::make_unique<passthrough_allocator>(backend), 1000);
  EXPECT_THROW((void)limit.allocate(600), out_of_memory);  // 600 rounds to 1024 > 1000
  limiting_adaptor roomy(std::make_unique<passthrough_allocator>(backend), 4096);
  void* p = roomy.allocate(2048);
  int foreign = 0;
  roomy.deallocate(&foreign, 16);  // not owned: nothing changes
  EXPECT_EQ(roomy.used(), 2048u);
  roomy.deallocate(p, 512);  // wrong size: the true 2048 is released
  EXPECT_EQ(roomy.used(), 0u);
  EXPECT_EQ(roomy.misuse().size_mismatch, 1u);
}

// Regression (red team, 2026-11-28): over a policy holding cached memory,
// the cap's out-of-memory answer took the policy's reserved bytes (cache
// included) for what the cap counts: 100 MiB live under a 150 MiB cap read
// "reserved 200 MiB ... live 200 MiB", and the advice said the live bytes
// alone exceed the device. The cap is the device: it holds the allocated
// bytes, none free; the verdict is capacity, the advice names this request.
TEST(limiting_adaptor, the_cap_answers_in_its_own_terms_over_a_cache) {
  sim_backend backend;
  limiting_adaptor limit(make_policy("caching", config{}, backend), SIZE_MAX);
  void* kept = limit.allocate(100 * MiB);
  void* cached = limit.allocate(100 * MiB);
  limit.deallocate(cached, 100 * MiB);  // the policy keeps it in its cache
  ASSERT_GE(limit.state().reserved, 200 * MiB);
  limit.set_limit(150 * MiB);
  try {
    (void)limit.allocate(60 * MiB);
    ADD_FAILURE() << "allocation over the limit succeeded";
  } catch (const out_of_memory& e) {
    EXPECT_EQ(e.details().reserved, 100 * MiB);
    EXPECT_EQ(e.details().cached_free, 0u);
    EXPECT_EQ(e.details().device_free, 50 * MiB);
    EXPECT_EQ(diagnose(e.details()), oom_verdict::capacity);
    const oom_event event = make_oom_event(e.details(), "caching", false);
    EXPECT_EQ(event.advice.find("alone exceed"), std::string::npos) << event.advice;
  }
  // A request that fits but whose rounded size does not is the cap's too
  // (capacity), not the policy declining (a review).
  limit.set_limit(100 * MiB + 1000);
  try {
    (void)limit.allocate(1000);  // 1024 once rounded
    ADD_FAILURE() << "allocation over the limit succeeded";
  } catch (const out_of_memory& e) {
    EXPECT_EQ(diagnose(e.details()), oom_verdict::capacity);
  }
  // Control: live bytes past the cap alone are said so.
  limit.set_limit(80 * MiB);
  try {
    (void)limit.allocate(MiB);
    ADD_FAILURE() << "allocation over the limit succeeded";
  } catch (const out_of_memory& e) {
    EXPECT_NE(make_oom_event(e.details(), "caching", false).advice.find("alone exceed"), std::string::npos);
  }
  limit.deallocate(kept, 100 * MiB);
}

// An adaptor that overrides nothing: what forwarding_adaptor gives every adaptor.
class bare_adaptor final : public forwarding_adaptor {
 public:
  explicit bare_adaptor(std::unique_ptr<device_allocator> upstream)
      : forwarding_adaptor(std::move(upstream), "bare_adaptor") {}
};

// caching takes a free with the rounded size as right; the statistics and
// the limit count the block's own request then, not the size given (before:
// requested.current short by the rounding while the other block lived, and
// requested_freed_total above requested_total for good). Also when the free
// waits for another stream (record_stream).
TEST(statistics_adaptor, a_free_taken_with_the_rounded_size_counts_the_request) {
  for (const bool recorded : {false, true}) {
    SCOPED_TRACE(recorded ? "recorded on another stream" : "plain");
    config cfg;
    cfg.policy = "caching";
    auto sim = std::make_unique<sim_backend>();
    sim_backend& device = *sim;
    allocator_stack stack(std::move(sim), cfg);
    device_allocator& a = stack.allocator();
    const stream_t side = stack.create_stream();
    void* p = a.allocate(1000);
    void* q = a.allocate(1000);
    const std::size_t rounded = a.allocation_size(1000);
    ASSERT_NE(rounded, 1000u) << "the case needs a size the policy rounds";
    if (recorded) a.record_stream(p, side);
    EXPECT_EQ(a.try_deallocate(p, rounded).status, free_status::ok);
    EXPECT_EQ(stack.stats().requested.current, 1000u);
    a.deallocate(q, 1000);
    device.synchronize_stream(side);
    a.release_cached();
    const allocator_stats s = stack.stats();
    EXPECT_EQ(s.requested.current, 0u);
    EXPECT_EQ(s.totals.requested_freed, s.totals.requested);
    EXPECT_EQ(s.totals.allocated_freed, s.totals.allocated);
  }
}

TEST(block_table_adaptor, knows_each_live_blocks_size_and_stream_until_it_is_freed) {
  sim_backend backend;
  thread_safe_adaptor table(std::make_unique<block_table_adaptor>(std::make_unique<passthrough_allocator>(backend)));
  const auto s = reinterpret_cast<stream_t>(0x10);
  void* p = table.allocate(3000, s);
  void* q = table.allocate(512);
  ASSERT_TRUE(table.block_info(p).has_value());
  EXPECT_EQ(table.block_info(p)->bytes, 3000U);
  EXPECT_EQ(table.block_info(p)->stream, s);
  EXPECT_EQ(table.block_info(q)->stream, nullptr);
  int local = 0;
  EXPECT_FALSE(table.block_info(&local).has_value());
  EXPECT_EQ(table.try_deallocate(&local, 8).status, free_status::not_owned);
  EXPECT_TRUE(table.block_info(p).has_value()) << "a foreign free changes nothing";
  table.deallocate(p, 3000, s);
  EXPECT_FALSE(table.block_info(p).has_value());
  EXPECT_TRUE(table.block_info(q).has_value());
  table.deallocate(q, 512);
  EXPECT_EQ(table.misuse().not_owned, 0U) << "lookups are not misuse";
}

TEST(block_table_adaptor, without_it_no_allocator_answers_block_info) {
  sim_backend backend;
  thread_safe_adaptor plain(std::make_unique<passthrough_allocator>(backend));
  void* p = plain.allocate(4096);
  EXPECT_FALSE(plain.block_info(p).has_value());
  plain.deallocate(p, 4096);
}

TEST(forwarding_adaptor, forwards_every_call_and_leaves_misuse_to_the_outermost) {
  sim_backend backend;
  auto inner = std::make_unique<passthrough_allocator>(backend, "inner");
  passthrough_allocator& upstream = *inner;
  bare_adaptor outer(std::move(inner));
  EXPECT_EQ(&outer.upstream(), &upstream);
  EXPECT_EQ(outer.name(), "inner");
  EXPECT_EQ(&outer.backend(), &backend);
  EXPECT_EQ(outer.allocation_size(1000), 1024u);

  void* p = outer.allocate(1000);
  EXPECT_EQ(upstream.live_blocks(), 1u);
  EXPECT_EQ(outer.state().reserved, 1024u);
  EXPECT_EQ(outer.memory_map().available, upstream.memory_map().available);
  EXPECT_THROW(outer.record_stream(p, nullptr), invalid_argument) << "a bare policy refuses record_stream";
  int foreign = 0;
  outer.deallocate(&foreign, 16);
  EXPECT_EQ(outer.misuse().not_owned, 1u);
  EXPECT_EQ(upstream.misuse().not_owned, 0u) << "the free reached the upstream through try_deallocate";
  outer.deallocate(p, 1000);
  EXPECT_EQ(upstream.live_blocks(), 0u);
  EXPECT_EQ(backend.counters().held_bytes, 0u);
}

TEST(forwarding_adaptor, null_upstream_throws_naming_the_adaptor) {
  try {
    bare_adaptor bad(nullptr);
    ADD_FAILURE() << "a null upstream was accepted";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "bare_adaptor: upstream is null");
  }
}

std::vector<std::vector<std::string>> read_csv(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::vector<std::string>> rows;
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> row;
    for (const std::string_view cell : util::split(line, ',')) row.emplace_back(cell);
    rows.push_back(std::move(row));
  }
  return rows;
}

TEST(tracing_adaptor, writes_the_rows_of_our_trace_csv) {
  const std::string path = temp_path("trace.csv");
  sim_backend backend(sim_options{.capacity = 16 * MiB});
  std::string a_addr, b_addr;
  const auto stream = reinterpret_cast<stream_t>(std::uintptr_t{5});
  {
    tracing_adaptor trace(std::make_unique<passthrough_allocator>(backend), path);
    void* a = trace.allocate(1000);
    void* b = trace.allocate(2048, stream);
    a_addr = std::to_string(reinterpret_cast<std::uintptr_t>(a));
    b_addr = std::to_string(reinterpret_cast<std::uintptr_t>(b));
    int foreign = 0;
    trace.deallocate(&foreign, 8);  // no row: a replay must not meet unknown addresses
    trace.deallocate(b, 100, stream);  // wrong size: the row carries the true size
    EXPECT_THROW((void)trace.allocate(32 * MiB), out_of_memory);
    trace.deallocate(a, 1000);
  }
  const auto rows = read_csv(path);
  ASSERT_EQ(rows.size(), 8u);
  EXPECT_EQ(rows[0], (std::vector<std::string>{"action", "addr", "size", "stream", "time_us"}));
  const auto expect_row = [&](std::size_t i, const std::vector<std::string>& first_four) {
    ASSERT_EQ(rows[i].size(), 5u) << "row " << i;
    EXPECT_EQ(std::vector<std::string>(rows[i].begin(), rows[i].begin() + 4), first_four) << "row " << i;
  };
  // The promise of an end row: a file cut anywhere reads as cut.
  EXPECT_EQ(rows[1], std::vector<std::string>{std::string(trace_end_row_promise)});
  expect_row(2, {"alloc", a_addr, "1000", "0"});
  expect_row(3, {"alloc", b_addr, "2048", "5"});
  expect_row(4, {"free_requested", b_addr, "2048", "5"});
  expect_row(5, {"oom", "0", std::to_string(32 * MiB), "0"});
  expect_row(6, {"free_requested", a_addr, "1000", "0"});
  expect_row(7, {"end", "0", "5", "0"});  // the close counts the rows before it
  std::uint64_t previous = 0;
  for (std::size_t i = 2; i < rows.size(); ++i) {
    std::uint64_t t = 0;
    ASSERT_TRUE(util::parse_u64(rows[i][4], t)) << rows[i][4];
    EXPECT_GE(t, previous);
    previous = t;
  }
  std::remove(path.c_str());
}

TEST(tracing_adaptor, flush_makes_rows_visible_before_destruction) {
  const std::string path = temp_path("flush.csv");
  sim_backend backend;
  tracing_adaptor trace(std::make_unique<passthrough_allocator>(backend), path);
  void* p = trace.allocate(512);
  trace.flush();
  EXPECT_EQ(read_csv(path).size(), 4u);  // header, promise of an end row, alloc, end
  trace.deallocate(p, 512);
  std::remove(path.c_str());
}

// Regression (issue 18): FRAGCTL_TRACE=x.csv.gz wrote plain text under a .gz
// name. Each flush finishes a gzip member, so the file reads whole after a
// flush as well as after the close.
TEST(tracing_adaptor, gz_path_writes_gzip_readable_after_each_flush) {
  const std::string path = temp_path("trace.csv.gz");
  sim_backend backend;
  {
    tracing_adaptor trace(std::make_unique<passthrough_allocator>(backend), path);
    void* p = trace.allocate(512);
    trace.flush();
    const std::string bytes = fragctl::testing::read_file(path);
    ASSERT_GE(bytes.size(), 2u);
    EXPECT_EQ(bytes.substr(0, 2), "\x1f\x8b");
    auto early = read_trace(path);
    ASSERT_TRUE(early.ok()) << early.status();
    EXPECT_EQ(early->events.size(), 1u);
    EXPECT_EQ(early->completeness, trace_completeness::complete);
    trace.deallocate(p, 512);
  }
  auto whole = read_trace(path);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->events.size(), 2u);
  EXPECT_EQ(whole->completeness, trace_completeness::complete);
  std::remove(path.c_str());
}

TEST(tracing_adaptor, unwritable_path_throws) {
  sim_backend backend;
  EXPECT_THROW(tracing_adaptor(std::make_unique<passthrough_allocator>(backend), "/nonexistent/dir/t.csv"),
               error);
}

TEST(thread_safe_adaptor, keeps_counts_exact_under_eight_threads) {
  sim_backend backend;
  auto stats = std::make_unique<statistics_adaptor>(std::make_unique<passthrough_allocator>(backend));
  statistics_adaptor& counters = *stats;
  thread_safe_adaptor locked(std::move(stats));
  constexpr int threads = 8;
  constexpr int rounds = 2000;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&locked, t] {
      std::vector<std::pair<void*, std::size_t>> live;
      for (int i = 0; i < rounds; ++i) {
        const std::size_t bytes = 512 * static_cast<std::size_t>(1 + (i + t) % 8);
        live.emplace_back(locked.allocate(bytes), bytes);
        if (live.size() == 4) {
          for (const auto& [p, n] : live) locked.deallocate(p, n);
          live.clear();
        }
      }
      for (const auto& [p, n] : live) locked.deallocate(p, n);
    });
  }
  for (std::thread& th : pool) th.join();
  const allocator_stats s = counters.stats();
  EXPECT_EQ(s.allocations, std::uint64_t{threads} * rounds);
  EXPECT_EQ(s.frees, std::uint64_t{threads} * rounds);
  EXPECT_EQ(s.requested.current, 0u);
  EXPECT_EQ(s.allocated.current, 0u);
  EXPECT_LE(s.requested.peak, std::size_t{threads} * 4 * 8 * 512);
  EXPECT_EQ(s.backend_calls.of(backend_call::allocate), std::uint64_t{threads} * rounds);
  EXPECT_EQ(locked.misuse().not_owned, 0u);
  EXPECT_EQ(locked.name(), "passthrough");
}

}  // namespace
}  // namespace fragctl
