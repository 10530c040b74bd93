// libFuzzer target: allocation sequences (allocations, frees, misuse, stream
// work, injected backend failures) over every policy on sim, checked against
// a model of the live blocks (fuzz/harness/alloc_sequence.hpp).
// The same harness runs over the committed corpus in
// tests/reliability/fuzz_corpus_test.cpp.
#include <cstddef>
#include <cstdint>

#include "fragctl/log.hpp"
#include "fuzz/harness/alloc_sequence.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fragctl::set_log_level("off");  // misuse warnings are expected by the thousand
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  (void)fragctl::fuzz::run_alloc_sequence(data, size);
  return 0;
}
