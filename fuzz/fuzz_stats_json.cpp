// libFuzzer target: statistics and report JSON (stats_from_json,
// stats_export_from_json) and their round trips (fuzz/harness/parsers.hpp).
// The same harness runs over the committed corpus in
// tests/reliability/fuzz_corpus_test.cpp.
#include <cstddef>
#include <cstdint>

#include "fragctl/log.hpp"
#include "fuzz/harness/parsers.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fragctl::set_log_level("off");  // misuse warnings are expected by the thousand
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fragctl::fuzz::run_stats_json(data, size);
  return 0;
}
