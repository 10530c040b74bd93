// libFuzzer target: FRAGCTL_POLICY and FRAGCTL_CONF. Input "<policy>\n<conf>"
// is parsed, and when valid built into a policy on sim that serves a few
// requests (fuzz/harness/parsers.hpp).
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
  fragctl::fuzz::run_config(data, size);
  return 0;
}
