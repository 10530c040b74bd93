// libFuzzer target: hostile reports, report JSON nested around the depth
// limit and hostile strings in every field, through the reader and every
// renderer of `fragctl report` (fuzz/harness/report_render.hpp: what the
// input means and what is checked). The same harness runs over the committed
// corpus in tests/reliability/fuzz_corpus_test.cpp.
#include <cstddef>
#include <cstdint>

#include "fragctl/log.hpp"
#include "fuzz/harness/report_render.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fragctl::set_log_level("off");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fragctl::fuzz::run_report_render(data, size);
  return 0;
}
