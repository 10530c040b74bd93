// statistics_adaptor: counts on every allocate and free.
//
// It sits on every malloc/free, so it does the least it can: one upstream
// call, one allocation_size call (straight to the policy: sizer()), and a
// handful of relaxed atomic loads and stores. There is a single writer (the
// adaptor is not thread-safe for concurrent allocate/deallocate;
// thread_safe_adaptor serializes writers), so counters are updated with a
// relaxed load and store instead of a locked read-modify-write; the atomics
// exist only so that stats() may read them from another thread (a SIGUSR1
// report, a metrics scraper) without a data race.
#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <deque>
#include <mutex>
#include <optional>
#include <string>

#include "fragctl/adaptors.hpp"
#include "fragctl/backend.hpp"
#include "fragctl/device_memory.hpp"
#include "fragctl/error.hpp"
#include "fragctl/log.hpp"
#include "fragctl/oom.hpp"
#include "util/fork_safe_mutex.hpp"

namespace fragctl {

namespace {

template <class T>
void add(std::atomic<T>& a, T delta) noexcept {
  a.store(a.load(std::memory_order_relaxed) + delta, std::memory_order_relaxed);
}

// Saturating: a misreported size never wraps a gauge around.
template <class T>
void subtract(std::atomic<T>& a, T delta) noexcept {
  const T now = a.load(std::memory_order_relaxed);
  a.store(now > delta ? now - delta : T{0}, std::memory_order_relaxed);
}

template <class T>
void raise_peak(std::atomic<T>& peak, T value) noexcept {
  if (value > peak.load(std::memory_order_relaxed)) peak.store(value, std::memory_order_relaxed);
}

template <class T>
T read(const std::atomic<T>& a) noexcept {
  return a.load(std::memory_order_relaxed);
}

}  // namespace

struct statistics_adaptor::counters {
  std::atomic<std::size_t> requested{0};
  std::atomic<std::size_t> requested_peak{0};
  std::atomic<std::size_t> allocated{0};
  std::atomic<std::size_t> allocated_peak{0};
  std::atomic<std::size_t> requested_total{0};
  std::atomic<std::size_t> requested_freed_total{0};
  std::atomic<std::size_t> allocated_total{0};
  std::atomic<std::size_t> allocated_freed_total{0};
  std::atomic<std::size_t> requested_window_peak{0};
  std::atomic<std::size_t> allocated_window_peak{0};
  std::atomic<std::uint64_t> live_window_peak{0};
  std::atomic<std::uint64_t> allocations{0};
  std::atomic<std::uint64_t> frees{0};
  std::atomic<std::uint64_t> ooms{0};
  std::atomic<std::uint64_t> not_owned{0};
  std::atomic<std::uint64_t> size_mismatch{0};
  std::array<std::atomic<std::uint64_t>, size_histogram_buckets> histogram{};
  std::atomic<std::uint64_t> histogram_sum{0};
  // The latest OOM events; OOMs are rare, so a lock is cheap enough here.
  // Fork-safe: a leaf, taken under the allocator's lock or none.
  mutable util::fork_safe_mutex oom_mutex;
  std::deque<oom_event> oom_events;

  void freed(std::size_t requested_bytes, std::size_t allocated_bytes) noexcept {
    subtract(requested, requested_bytes);
    subtract(allocated, allocated_bytes);
    add(requested_freed_total, requested_bytes);
    add(allocated_freed_total, allocated_bytes);
    add(frees, std::uint64_t{1});
  }
};

statistics_adaptor::statistics_adaptor(std::unique_ptr<device_allocator> upstream)
    : forwarding_adaptor(std::move(upstream), "statistics_adaptor"), counters_(std::make_unique<counters>()) {
  // What the device holds outside this allocator now (the runtime's context,
  // other libraries) is not another process's doing when an OOM comes later.
  try {
    const memory_info info = this->upstream().backend().get_memory_info();
    const std::size_t ours_and_free = info.free + this->upstream().state().reserved;
    outside_at_start_ = info.total > ours_and_free ? info.total - ours_and_free : 0;
  } catch (const std::exception& e) {
    logger().debug("statistics: no device memory information at start ({}); OOM verdicts count all memory "
                   "held outside as another process's", e.what());
  }
}

statistics_adaptor::~statistics_adaptor() = default;

void* statistics_adaptor::do_allocate(std::size_t bytes, stream_t stream) {
  counters& c = *counters_;
  void* ptr = nullptr;
  try {
    ptr = upstream().allocate(bytes, stream);
  } catch (const out_of_memory& e) {
    add(c.ooms, std::uint64_t{1});
    const std::optional<device_memory_split> split = record_oom(e.details(), stream);
    if (!split) throw;
    out_of_memory annotated = e;          // what() carries the split (torch's OutOfMemoryError included)
    std::string note = "device memory ";  // in steps: GCC 12's -Wrestrict at -O3
    note += describe(*split);
    annotated.add_note(note);
    throw annotated;
  }
  const std::size_t rounded = sizer().allocation_size(bytes);
  const std::size_t requested = read(c.requested) + bytes;
  const std::size_t allocated = read(c.allocated) + rounded;
  c.requested.store(requested, std::memory_order_relaxed);
  c.allocated.store(allocated, std::memory_order_relaxed);
  raise_peak(c.requested_peak, requested);
  raise_peak(c.allocated_peak, allocated);
  raise_peak(c.requested_window_peak, requested);
  raise_peak(c.allocated_window_peak, allocated);
  add(c.requested_total, bytes);
  add(c.allocated_total, rounded);
  add(c.allocations, std::uint64_t{1});
  raise_peak(c.live_window_peak, read(c.allocations) - read(c.frees));
  add(c.histogram[size_histogram_bucket(bytes)], std::uint64_t{1});
  add(c.histogram_sum, std::uint64_t{bytes});
  return ptr;
}

free_result statistics_adaptor::do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept {
  counters& c = *counters_;
  const free_result result = upstream().try_deallocate(ptr, bytes, stream);
  switch (result.status) {
    case free_status::ok: {
      const std::size_t freed = result.size_or(bytes);
      c.freed(freed, sizer().allocation_size(freed));
      break;
    }
    case free_status::size_mismatch:
      add(c.size_mismatch, std::uint64_t{1});
      c.freed(result.bytes, sizer().allocation_size(result.bytes));
      break;
    case free_status::not_owned:
      add(c.not_owned, std::uint64_t{1});
      break;
  }
  return result;
}

// Keeps the event and logs it: every one of the first 8, then the 16th,
// 32nd, ... so that a replay full of OOMs does not flood the log.
std::optional<device_memory_split> statistics_adaptor::record_oom(const oom_details& details,
                                                                  stream_t stream) noexcept {
  counters& c = *counters_;
  try {
    const device_backend& backend = upstream().backend();
    oom_details d = details;
    d.outside_at_start = outside_at_start_;
    oom_event e = make_oom_event(d, upstream().name(), backend.supports_virtual_memory());
    if (d.device_total != 0) {
      e.memory_split = device_memory_split_of(backend, d.reserved, d.device_free, d.device_total, outside_at_start_);
    }
    std::optional<device_memory_split> split = e.memory_split;
    e.sequence = read(c.allocations) + read(c.ooms);
    e.stream = reinterpret_cast<std::uintptr_t>(stream);
    const std::uint64_t n = read(c.ooms);
    if (n <= oom_events_kept || std::has_single_bit(n)) {
      logger().warn("{} (OOM #{})", describe(e, upstream().name()), n);
    }
    const std::lock_guard lock(c.oom_mutex);
    c.oom_events.push_back(std::move(e));
    if (c.oom_events.size() > oom_events_kept) c.oom_events.pop_front();
    return split;
  } catch (...) {  // out of host memory while reporting device OOM: the count is kept
    return std::nullopt;
  }
}

allocator_stats statistics_adaptor::stats() const { return stats(upstream().state()); }

allocator_stats statistics_adaptor::stats(const pool_state& pool) const {
  const counters& c = *counters_;
  const device_backend& backend = upstream().backend();
  allocator_stats s;
  s.allocator = std::string(upstream().name());
  s.backend = std::string(backend.name());
  s.device = backend.device();
  s.requested = {read(c.requested), read(c.requested_peak)};
  s.allocated = {read(c.allocated), read(c.allocated_peak)};
  s.allocations = read(c.allocations);
  s.frees = read(c.frees);
  s.totals = {read(c.requested_total), read(c.requested_freed_total), read(c.allocated_total),
              read(c.allocated_freed_total), 0, 0};
  s.window_peak = {read(c.requested_window_peak), read(c.allocated_window_peak), 0, read(c.live_window_peak)};
  s.ooms = read(c.ooms);
  s.misuse_not_owned = read(c.not_owned);
  s.misuse_size_mismatch = read(c.size_mismatch);
  for (std::size_t i = 0; i < size_histogram_buckets; ++i) s.size_histogram[i] = read(c.histogram[i]);
  s.size_histogram_sum = read(c.histogram_sum);
  s.backend_calls = backend.counters();
  s.reserved = {s.backend_calls.held_bytes, s.backend_calls.peak_held_bytes};
  s.totals.reserved = s.backend_calls.held_total;
  s.totals.reserved_freed = s.backend_calls.released_total;
  s.window_peak.reserved = s.backend_calls.window_peak_held_bytes;
  s.pool = pool;
  s.retries = pool.retries;
  s.device_memory.outside_at_start = outside_at_start_;
  {
    const std::lock_guard lock(c.oom_mutex);
    s.oom_events.assign(c.oom_events.begin(), c.oom_events.end());
  }
  return s;
}

void statistics_adaptor::reset_peaks() noexcept {
  counters& c = *counters_;
  c.requested_window_peak.store(read(c.requested), std::memory_order_relaxed);
  c.allocated_window_peak.store(read(c.allocated), std::memory_order_relaxed);
  const std::uint64_t allocations = read(c.allocations);
  const std::uint64_t frees = read(c.frees);
  c.live_window_peak.store(allocations > frees ? allocations - frees : 0, std::memory_order_relaxed);
  upstream().backend().reset_window_peak();
}

}  // namespace fragctl
