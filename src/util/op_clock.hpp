// op_clock: the clock that times one allocator operation alone.
//
// A replay times every allocate and free on its own and reports the median.
// The clock's own cost lands in every sample: std::chrono::steady_clock is a
// vDSO call that costs 20-45 ns a pair on the machines measured (more under
// a hypervisor's paravirtual clock), as much as the operation it times. Where
// the CPU has an invariant time-stamp counter (x86-64: CPUID 0x80000007,
// EDX bit 8, which hypervisors pass on when the counter is safe to read), the
// clock reads it directly, fenced so that the operation stays between the two
// reads, and converts ticks to nanoseconds by a rate measured against
// steady_clock when the clock is made. Elsewhere it is steady_clock.
//
// Header-only and free of fragctl's other headers, so that a benchmark built
// outside fragctl's tree (benchmarks/torch_replay, against PyTorch's
// allocator) times its operations with the same clock.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>
#endif

namespace fragctl::util {

class op_clock {
 public:
  using ticks = std::int64_t;

  /// The counter's rate is measured once per process (about 20 ms, at the
  /// first clock made), where the counter is used.
  op_clock() {
#if defined(__x86_64__)
    static const double rate = invariant_tsc() ? measure_rate() : 0.0;
    tsc_ = rate > 0;
    if (tsc_) ns_per_tick_ = rate;
#endif
  }

  /// "tsc" or "steady_clock": what the samples were read from.
  [[nodiscard]] const char* source() const noexcept { return tsc_ ? "tsc" : "steady_clock"; }

  /// Read before the operation: no later instruction starts before it.
  [[nodiscard]] ticks start() const noexcept {
#if defined(__x86_64__)
    if (tsc_) {
      _mm_lfence();
      const auto t = static_cast<ticks>(__rdtsc());
      _mm_lfence();
      return t;
    }
#endif
    return steady_ns();
  }

  /// Read after the operation: every earlier instruction has finished.
  [[nodiscard]] ticks stop() const noexcept {
#if defined(__x86_64__)
    if (tsc_) {
      unsigned aux = 0;
      const auto t = static_cast<ticks>(__rdtscp(&aux));
      _mm_lfence();
      return t;
    }
#endif
    return steady_ns();
  }

  /// An interval between two reads (or a statistic of such intervals), in
  /// nanoseconds.
  [[nodiscard]] double to_ns(double interval) const noexcept { return interval * ns_per_tick_; }

  /// Median of 1,001 empty intervals (start then stop), in nanoseconds: what
  /// one sample costs on top of the operation (not subtracted).
  [[nodiscard]] double overhead_ns() const {
    std::vector<ticks> d(1001);
    for (ticks& v : d) {
      const ticks a = start();
      v = stop() - a;
    }
    std::nth_element(d.begin(), d.begin() + 500, d.end());
    return to_ns(static_cast<double>(d[500]));
  }

 private:
  static ticks steady_ns() noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

#if defined(__x86_64__)
  static bool invariant_tsc() noexcept {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(0x80000000u, &a, &b, &c, &d) != 0 && a >= 0x80000007u &&
           __get_cpuid(0x80000007u, &a, &b, &c, &d) != 0 && (d & (1u << 8)) != 0;
  }

  // Nanoseconds per tick over about 20 ms of steady_clock (0 if the counter
  // did not move); the counter is read right after each clock read, so both
  // intervals share their ends.
  static double measure_rate() {
    using namespace std::chrono;
    const auto t0 = steady_clock::now();
    const std::uint64_t c0 = __rdtsc();
    auto t1 = t0;
    std::uint64_t c1 = c0;
    while (t1 - t0 < milliseconds(20)) {
      t1 = steady_clock::now();
      c1 = __rdtsc();
    }
    const auto ns = duration_cast<nanoseconds>(t1 - t0).count();
    return c1 > c0 ? static_cast<double>(ns) / static_cast<double>(c1 - c0) : 0.0;  // 0: not counting
  }
#endif

  bool tsc_ = false;
  double ns_per_tick_ = 1.0;
};

}  // namespace fragctl::util
