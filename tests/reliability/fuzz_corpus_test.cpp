// The fuzz harnesses (fuzz/harness/*.hpp) over every committed input: the
// seed corpora in fuzz/corpus/<target>/ and the inputs that once found a bug
// in fuzz/regressions/<target>/. This is how the ordinary and sanitizer
// builds run the fuzzers' checks without clang or libFuzzer, and why a crash
// a fuzzer found stays fixed. Plus a few hundred random allocation programs.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "fragctl/log.hpp"
#include "fuzz/harness/alloc_sequence.hpp"
#include "fuzz/harness/parsers.hpp"
#include "fuzz/harness/report_render.hpp"

namespace fragctl::fuzz {
namespace {

namespace fs = std::filesystem;

using harness = std::function<void(const std::uint8_t*, std::size_t)>;

// <repo>/fuzz, found from FRAGCTL_TEST_DATA (<repo>/tests/data).
fs::path fuzz_root() {
  const char* data = std::getenv("FRAGCTL_TEST_DATA");
  if (data == nullptr) {
    ADD_FAILURE() << "FRAGCTL_TEST_DATA is not set (run through ctest)";
    return {};
  }
  return fs::path(data) / ".." / ".." / "fuzz";
}

std::vector<std::uint8_t> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Runs every file of fuzz/corpus/<target> and fuzz/regressions/<target>;
// returns how many there were.
std::size_t run_inputs(const std::string& target, const harness& run) {
  std::size_t inputs = 0;
  for (const char* kind : {"corpus", "regressions"}) {
    const fs::path dir = fuzz_root() / kind / target;
    if (!fs::is_directory(dir)) continue;
    for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
      if (!entry.is_regular_file()) continue;
      const std::vector<std::uint8_t> bytes = read_file(entry.path());
      try {
        run(bytes.data(), bytes.size());
      } catch (const invariant_violation& e) {
        ADD_FAILURE() << entry.path() << ": " << e.what();
      }
      ++inputs;
    }
  }
  return inputs;
}

class fuzz_corpus : public ::testing::Test {
 protected:
  void SetUp() override { set_log_level("off"); }
  void TearDown() override { set_log_level("warn"); }
};

TEST_F(fuzz_corpus, config_inputs_parse_or_fail_cleanly) {
  EXPECT_GE(run_inputs("config", run_config), 10U);
}

TEST_F(fuzz_corpus, trace_inputs_parse_or_fail_cleanly) {
  EXPECT_GE(run_inputs("trace", run_trace), 8U);
}

TEST_F(fuzz_corpus, pickle_inputs_read_or_fail_cleanly) {
  EXPECT_GE(run_inputs("pickle", run_pickle), 7U);
}

TEST_F(fuzz_corpus, stats_json_inputs_parse_or_fail_cleanly) {
  EXPECT_GE(run_inputs("stats_json", run_stats_json), 8U);
}

// Includes issue 18's reports: an empty allocators list (accepted before),
// fields of the wrong type (an escaped json::type_error before).
TEST_F(fuzz_corpus, report_inputs_read_or_fail_naming_the_file) {
  EXPECT_GE(run_inputs("report", run_report_json), 13U);
}

// Issue 27: hostile strings in every field of a report and its memory map,
// documents nested around the depth limit (H1, H3).
TEST_F(fuzz_corpus, report_render_inputs_render_escaped) {
  EXPECT_GE(run_inputs("report_render", run_report_render), 18U);
}

TEST_F(fuzz_corpus, alloc_sequence_inputs_keep_every_invariant) {
  std::size_t allocations = 0;
  std::size_t frees = 0;
  std::size_t deferred = 0;
  const std::size_t inputs = run_inputs("alloc_sequence", [&](const std::uint8_t* data, std::size_t size) {
    const sequence_summary s = run_alloc_sequence(data, size);
    allocations += s.allocations;
    frees += s.frees;
    deferred += s.deferred;
  });
  EXPECT_GE(inputs, 36U);
  // The seeds do real work: thousands of allocations, most of them freed by the program itself.
  EXPECT_GT(allocations, 2000U);
  EXPECT_GT(frees, allocations / 4);
  // record_stream holds back some of those frees (stream_use_adaptor).
  EXPECT_GT(deferred, 50U);
}

TEST_F(fuzz_corpus, random_allocation_programs_keep_every_invariant) {
  std::mt19937_64 rng(20240601);
  std::size_t constructed = 0;
  for (int i = 0; i < 300; ++i) {
    std::vector<std::uint8_t> program(64 + rng() % 700);
    for (std::uint8_t& b : program) b = static_cast<std::uint8_t>(rng());
    try {
      constructed += run_alloc_sequence(program.data(), program.size()).constructed ? 1 : 0;
    } catch (const invariant_violation& e) {
      ADD_FAILURE() << "random program " << i << ": " << e.what();
    }
  }
  EXPECT_GT(constructed, 250U);
}

}  // namespace
}  // namespace fragctl::fuzz
