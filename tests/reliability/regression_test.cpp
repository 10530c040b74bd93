// Bugs the reliability checks found, one test each, named after the bug.
// Most show only under a sanitizer (tools/sanitize.sh runs these there); the
// assertions pin the results the fixes restored. The fuzz inputs that found
// them are in fuzz/regressions/ and run in fuzz_corpus_test.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "fragctl/config.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/sim_backend.hpp"
#include "fragctl/trace.hpp"

namespace fragctl {
namespace {

// buckets_policy::do_deallocate read the slot size from its slab after
// push_free, which releases a slab that became empty once the class already
// keeps slab_reserve empty slabs: a heap use-after-free on every such free
// (slab_reserve:0 makes it the first free; the default 4, the fifth empty
// slab of a class). Found by the fuzz corpus harness under AddressSanitizer.
TEST(regression, buckets_free_that_releases_its_slab_reads_no_released_slab) {
  for (const char* conf : {"slab_reserve:0", ""}) {
    auto cfg = parse_config(conf);
    ASSERT_TRUE(cfg.ok());
    sim_backend sim;
    auto a = make_policy("buckets:caching", *cfg, sim);
    // Six slabs of one class (2 MiB slabs of 1 MiB slots: two slots each),
    // then empty them all: from the (slab_reserve + 1)-th on, each last
    // free releases its slab.
    std::vector<void*> blocks;
    for (int i = 0; i < 12; ++i) blocks.push_back(a->allocate(MiB));
    for (void* p : blocks) {
      const free_result r = a->try_deallocate(p, MiB);
      EXPECT_EQ(r.status, free_status::ok) << conf;
      EXPECT_EQ(r.bytes, MiB) << conf;
    }
    EXPECT_EQ(a->state().allocated, 0U);
  }
}

// A size option above 2^62 bytes overflowed the rounding of the policies
// that use it: segment_round:18446744073709551615 made caching ask the
// backend for 0 bytes (a backend_error out of allocate), arena_size:2^63
// made the arena reserve a range of 0 bytes. Such sizes are refused when
// FRAGCTL_CONF is parsed.
TEST(regression, size_options_above_two_to_the_62_are_refused_when_parsed) {
  for (const char* conf : {"segment_round:18446744073709551615", "arena_size:9223372036854775808",
                           "small_segment:4611686018427387905"}) {
    const auto cfg = parse_config(conf);
    ASSERT_FALSE(cfg.ok()) << conf;
    EXPECT_NE(std::string(cfg.status().message()).find("at most 4 EiB"), std::string::npos) << cfg.status();
  }
  EXPECT_TRUE(parse_config("arena_size:4611686018427387904").ok());  // 2^62 itself is a size
}

// A PyTorch snapshot with a number beyond double's range ("total_size":
// 2E097152) made nlohmann::json throw out_of_range, which is not a
// parse_error: it escaped parse_trace and ended the process. Found by
// fuzz_trace in CI; the input is fuzz/regressions/trace/snapshot_number_out_of_range.json.
TEST(regression, snapshot_number_out_of_range_is_an_error_not_an_escaped_exception) {
  const std::string snapshot = R"({"device_traces": [[{"action": "alloc", "addr": 1, "size": 2E097152}]]})";
  absl::StatusOr<trace> t;
  EXPECT_NO_THROW(t = parse_trace(snapshot, "huge.json"));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(t.status().message()).find("huge.json:1: invalid JSON"), std::string::npos) << t.status();
}

}  // namespace
}  // namespace fragctl
