// libFuzzer target: the reader of the pickles PyTorch memory snapshots are
// saved as (_dump_snapshot), alone and through parse_trace
// (fuzz/harness/parsers.hpp). The same harness runs over the committed
// corpus in tests/reliability/fuzz_corpus_test.cpp.
#include <cstddef>
#include <cstdint>

#include "fragctl/log.hpp"
#include "fuzz/harness/parsers.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fragctl::set_log_level("off");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fragctl::fuzz::run_pickle(data, size);
  return 0;
}
