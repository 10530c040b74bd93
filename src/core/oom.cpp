// OOM advice, events and their log line (fragctl/oom.hpp); the verdict itself
// is diagnose, in util/error.cpp, so that what() prints the same one.
#include "fragctl/oom.hpp"

#include <algorithm>
#include <chrono>

#include "fmt/format.h"
#include "util/strings.hpp"

namespace fragctl {

std::string oom_advice(oom_verdict v, const oom_details& d, std::string_view allocator, bool virtual_memory) {
  using util::human_bytes;
  switch (v) {
    case oom_verdict::fragmentation:
      if (allocator.find("arena") != std::string_view::npos) {
        return "FRAGCTL_POLICY=buckets:arena (size classes keep small blocks from pinning whole granules)";
      }
      if (virtual_memory) {
        return "FRAGCTL_POLICY=arena (free pages are re-mapped wherever a request needs them, so free "
               "bytes need not be contiguous)";
      }
      return "FRAGCTL_CONF=max_split_size:512MiB (large cached blocks are kept whole instead of being "
             "split into pieces no large request fits)";
    case oom_verdict::other_process:
      return fmt::format(
          "freeing the {} held outside this allocator (another process: see nvidia-smi or rocm-smi; "
          "another allocator in this process, e.g. a framework's own cache), or routing it through fragctl",
          human_bytes(memory_used_by_others(d)));
    case oom_verdict::declined:
      if (allocator.find("warmup") != std::string_view::npos) {
        return "FRAGCTL_CONF=warmup_on_exhausted:grow, or a warm-up profile that has this size (warmup_report: "
               "the report of a run that made it)";
      }
      return fmt::format("the allocator's own limits: {} was free on the device (arena_size, or the caching "
                         "policy's segment sizes: large_segment, segment_round)",
                         human_bytes(d.device_free));
    case oom_verdict::capacity:
      break;
  }
  // Alone, or only with this request (a red team's 100 MiB live under a
  // 150 MiB cap was told the live bytes alone exceed it).
  const std::size_t live = d.reserved > d.cached_free ? d.reserved - d.cached_free : 0;
  return live >= d.device_total ? "reduce the batch size (or sequence length); the live bytes alone exceed the "
                                  "device: activation checkpointing or ZeRO-3 offload lower them"
                                : "reduce the batch size (or sequence length), or the live bytes: activation "
                                  "checkpointing or ZeRO-3 offload lower them";
}

oom_event make_oom_event(const oom_details& d, std::string_view allocator, bool virtual_memory) {
  oom_event e;
  e.details = d;
  e.verdict = diagnose(d);
  e.advice = oom_advice(e.verdict, d, allocator, virtual_memory);
  e.time_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  return e;
}

std::string describe(const oom_event& e, std::string_view allocator) {
  using util::human_bytes;
  const oom_details& d = e.details;
  std::string reason;
  switch (e.verdict) {
    case oom_verdict::fragmentation:
      reason = fmt::format("fragmentation: {} is free (cache and device) but the largest free block is {}",
                           human_bytes(d.cached_free + d.device_free), human_bytes(d.largest_free_block));
      break;
    case oom_verdict::other_process:
      reason = fmt::format("another process: {} of the device is held outside this allocator, more than a "
                           "process's runtime takes ({})",
                           human_bytes(memory_used_by_others(d)), human_bytes(runtime_allowance(d)));
      break;
    case oom_verdict::declined:
      reason = fmt::format("declined: the device had {} free, enough for the request, and the allocator did not "
                           "take it",
                           human_bytes(d.device_free));
      break;
    case oom_verdict::capacity:
      reason = fmt::format("true capacity: live {} plus the request exceed the device's {}",
                           human_bytes(d.reserved > d.cached_free ? d.reserved - d.cached_free : 0),
                           human_bytes(d.device_total));
      break;
  }
  std::string line = fmt::format(
      "out of memory: {} could not allocate {} on stream {}: reserved {}, cached free {}, largest free "
      "block {}, device free {} of {}, used by others {} ({} when the allocator started); verdict: {}; try {}",
      allocator, human_bytes(d.requested), e.stream == 0 ? std::string("default") : fmt::format("{:#x}", e.stream),
      human_bytes(d.reserved), human_bytes(d.cached_free), human_bytes(d.largest_free_block),
      human_bytes(d.device_free), human_bytes(d.device_total), human_bytes(memory_used_by_others(d)),
      human_bytes(d.outside_at_start), reason, e.advice);
  if (e.memory_split) {
    line += "; device memory ";  // appended in steps: GCC 12's -Wrestrict at -O3
    line += describe(*e.memory_split);
  }
  return line;
}

}  // namespace fragctl
