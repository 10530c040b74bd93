// Diagnosing an out-of-memory failure (docs/reports.md, "OOM diagnosis").
//
// When an allocation fails, what the user needs is not "out of memory" but
// why: was memory free but in pieces too small (fragmentation), do the live
// bytes simply not fit (capacity), does something outside this allocator
// hold the device's memory (another process, another allocator), or did the
// allocator decline memory the device had? The verdict is computed from the
// allocator's oom_details by diagnose (fragctl/error.hpp, so that
// out_of_memory::what() prints the same verdict):
//
//   others        = device_total - device_free - reserved   (0 if negative)
//   runtime       = min(2 GiB, device_total / 32)
//   beyond        = others - runtime                          (0 if negative)
//   free_anywhere = cached_free + device_free
//   declined        when requested <= device_free: the device had the bytes
//                   and the allocator's own rules kept it from them (a
//                   warm-up that lacked this shape under
//                   warmup_on_exhausted:fail, segment rounding, arena_size);
//   fragmentation   otherwise, when requested <= free_anywhere: the bytes
//                   exist, no block of them is big enough;
//   another process when requested <= free_anywhere + beyond: it would fit
//                   without the memory held outside this allocator beyond
//                   what the process's own runtime takes;
//   capacity        otherwise.
//
// Every process holds some device memory outside its allocator: the CUDA or
// HIP context, library workspaces, lazily loaded kernel modules (0.58 GiB at
// the start of a PyTorch job on an H200 and 0.74 GiB by its end, measured).
// Counting that as another process's made every full device look like
// "another process"; the allowance `runtime` keeps it out of the verdict.
// Memory arithmetic cannot tell whose the rest is (another process, or
// another allocator in this one); the advice names both. The report also
// shows what was held outside when the allocator started (outside_at_start).
//
// Each verdict comes with the one setting most likely to help.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "fragctl/device_memory.hpp"
#include "fragctl/error.hpp"

namespace fragctl {

/// The one setting most likely to help, for an allocator named `allocator`
/// (a policy expression) on a backend with or without virtual memory, e.g.
/// "FRAGCTL_POLICY=arena (...)".
[[nodiscard]] std::string oom_advice(oom_verdict v, const oom_details& d, std::string_view allocator,
                                     bool virtual_memory);

/// One out-of-memory failure, as the statistics keep it.
struct oom_event {
  std::uint64_t sequence = 0;  ///< 1-based number of the failing allocate call among all allocate calls
  std::int64_t time_unix_ms = 0;  ///< wall-clock time of the failure
  std::uintptr_t stream = 0;      ///< stream handle of the request (0: default stream)
  oom_details details;
  oom_verdict verdict = oom_verdict::capacity;
  std::string advice;  ///< oom_advice at the time of the failure
  /// The device's used memory split by whose it is at the failure
  /// (fragctl/device_memory.hpp); statistics_adaptor fills it in.
  std::optional<device_memory_split> memory_split;
};

/// The event built from an allocator's oom_details, with verdict and advice.
[[nodiscard]] oom_event make_oom_event(const oom_details& d, std::string_view allocator, bool virtual_memory);

/// One line for logs and reports: what was requested, reserved, cached and
/// free on the device, the largest free block, memory used by others, the
/// verdict with its reason, the advice, and the split of the memory that is
/// not fragctl's where the event has one.
[[nodiscard]] std::string describe(const oom_event& e, std::string_view allocator);

}  // namespace fragctl
