// libFuzzer target: the report reader of `fragctl report`
// (run_reports_from_json; fuzz/harness/parsers.hpp). The same harness runs
// over the committed corpus in tests/reliability/fuzz_corpus_test.cpp.
#include <cstddef>
#include <cstdint>

#include "fragctl/log.hpp"
#include "fuzz/harness/parsers.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fragctl::set_log_level("off");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fragctl::fuzz::run_report_json(data, size);
  return 0;
}
