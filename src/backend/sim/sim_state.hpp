// The state of a sim_backend, shared by its source files (sim_backend.cpp:
// raw and host memory, copies, faults; sim_virtual_memory.cpp; sim_streams.cpp).
//
// Every object the simulated device hands out is a record in an ordered map
// keyed by address (or a hash map keyed by handle), so that the validation a
// real driver does (is this pointer live, is this range reserved, does it
// overlap a mapping) costs one ordered lookup. One mutex guards everything.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "backend/sim/address_ranges.hpp"
#include "fragctl/sim_backend.hpp"
#include "util/fork_safe_mutex.hpp"

namespace fragctl::sim_detail {

/// Where the fake values live. Device addresses start above every user-space
/// address of x86-64 and arm64 with 4-level page tables (2^48), so a fake
/// device pointer can never alias host memory; event and stream handles sit in
/// ranges of their own.
///
/// Each sim_backend instance (so each simulated device) hands out fake
/// addresses from a window of its own, `fake_window` bytes: instance k of the
/// process takes window k mod `fake_windows`. A pointer of one device or one
/// backend is therefore never a live address of another (the next
/// `fake_windows - 1` instances), so a cross-device free is NOT_OWNED in
/// accounting mode as it is in backed mode.
inline constexpr std::uintptr_t fake_device_base = std::uintptr_t{1} << 48;
inline constexpr std::uintptr_t fake_device_limit = std::uintptr_t{0xe0} << 48;
inline constexpr std::uintptr_t fake_window = std::uintptr_t{1} << 50;
inline constexpr std::uintptr_t fake_windows = (fake_device_limit - fake_device_base) / fake_window;
inline constexpr std::uintptr_t event_handle_base = std::uintptr_t{0xe0} << 48;
inline constexpr std::uintptr_t stream_handle_base = std::uintptr_t{0xf0} << 48;

/// The driver-like error codes the sim throws (CUDA's numbers and meanings).
enum class sim_error : int {
  invalid_value = 1,
  out_of_memory = 2,
  invalid_handle = 400,
  not_supported = 801,
  injected = 999  ///< a fault rule made an unmap or release fail ("injected_fault")
};

/// Throws backend_error("sim: <message>", code, "<code name>").
[[noreturn]] void fail(sim_error code, const std::string& message);

[[nodiscard]] inline std::uintptr_t address_of(const void* p) noexcept {
  return reinterpret_cast<std::uintptr_t>(p);
}
[[nodiscard]] inline void* pointer_to(std::uintptr_t a) noexcept { return reinterpret_cast<void*>(a); }

struct raw_block {
  std::size_t bytes = 0;  ///< size given to allocate
  std::size_t span = 0;   ///< address span it occupies (host pages or fake range)
  std::size_t opens = 0;  ///< open_allocation's not yet closed
};
struct host_block {
  std::size_t bytes = 0;
  std::size_t span = 0;
};
struct physical_block {
  std::size_t bytes = 0;
  std::size_t file_offset = 0;  ///< where its data lives in the memory file (backed)
  std::size_t mappings = 0;     ///< live mappings of it
  std::uint64_t memory = 0;     ///< the handle that created the memory (itself, or the exporter of an import)
};
struct mapping {
  std::size_t bytes = 0;
  std::uint64_t handle = 0;
  std::size_t offset = 0;
};
/// A wait_event on a stream: its work items numbered above `after` complete
/// only once `stream`'s completed count reaches `stamp`.
struct stream_wait {
  std::uint64_t after = 0;
  std::uintptr_t stream = 0;
  std::uint64_t stamp = 0;
};
struct stream_state {
  std::uint64_t submitted = 0;  ///< work items queued so far
  std::uint64_t completed = 0;  ///< work items finished so far (<= submitted)
  std::vector<stream_wait> waits;  ///< unmet waits, in the order they were queued
  bool created = false;         ///< by create_stream (else a caller's stream, met on first use)
  bool destroyed = false;
};
struct event_state {
  bool recorded = false;
  std::uintptr_t stream = 0;
  std::uint64_t stamp = 0;  ///< the stream's `submitted` when recorded
};

/// Deterministic fault rule of one target.
struct fault_rule {
  std::uint64_t calls = 0;                 ///< calls numbered since the last reset
  absl::btree_set<std::uint64_t> fail_at;  ///< call numbers that fail
  std::uint64_t every = 0;                 ///< 0: off
  std::uint64_t every_from = 0;            ///< call number when `every` was set
  std::uint64_t fail_from = 0;             ///< this call number and later ones fail; 0: off

  /// Numbers one call; true when it must fail.
  bool next_call_fails() {
    ++calls;
    bool fails = fail_at.erase(calls) > 0;
    if (every != 0 && (calls - every_from) % every == 0) fails = true;
    if (fail_from != 0 && calls >= fail_from) fails = true;
    return fails;
  }
};

}  // namespace fragctl::sim_detail

namespace fragctl {

struct sim_backend::state {
  explicit state(const sim_options& opts);
  ~state();
  state(const state&) = delete;
  state& operator=(const state&) = delete;

  // Helpers; each expects `mu` held.
  void require_virtual_memory(const char* call) const;
  void require_granular(const char* call, std::uintptr_t va, std::size_t bytes) const;
  [[nodiscard]] bool take_fault(sim_fault_target target) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  [[nodiscard]] bool fits(std::size_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  /// Bumps the fake address counter; 0 when this instance's window is exhausted.
  [[nodiscard]] std::uintptr_t fake_range(std::size_t span, std::size_t alignment)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  [[nodiscard]] bool in_raw_block(std::uintptr_t a, std::size_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  [[nodiscard]] bool in_reservation(std::uintptr_t a, std::size_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  /// True when some mapping overlaps [a, a + bytes).
  [[nodiscard]] bool overlaps_mapping(std::uintptr_t a, std::size_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  /// True when consecutive mappings cover [a, a + bytes) with no gap.
  [[nodiscard]] bool fully_mapped(std::uintptr_t a, std::size_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  /// True when [a, a + bytes) is device memory (checked live and accessible,
  /// else throws invalid_value); false when it is host memory.
  [[nodiscard]] bool device_range(const char* call, std::uintptr_t a, std::size_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  /// The state of `stream`, met for the first time if unknown; throws
  /// invalid_handle for a destroyed stream.
  sim_detail::stream_state& stream_for(const char* call, stream_t stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  /// Queues one work item on `s`; completes it at once unless manual_completion.
  void submit(sim_detail::stream_state& s) const;
  [[nodiscard]] sim_detail::event_state& event_for(const char* call, event_t event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  [[nodiscard]] bool event_done(const sim_detail::event_state& e) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  /// Completes the work of `s` up to item `target`. Unmet waits stop it
  /// there, unless `force`, which first completes what they wait for (as a GPU
  /// finishes the work a synchronize waits on). Returns whether it moved.
  bool advance(sim_detail::stream_state& s, std::uint64_t target, bool force, int depth = 0)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  const sim_options options;
  const std::size_t page;  ///< host page size

  // A std::mutex, not absl::Mutex: ThreadSanitizer cannot see Debian's
  // uninstrumented absl::Mutex, and tests share a sim device between threads.
  // Fork-safe (a leaf: nothing else is locked under it but the logger), so a
  // forked child can use a device its parent's threads were using.
  mutable util::fork_safe_mutex mu;
  std::atomic<std::uint64_t> bindings{0};      ///< bind_device calls
  std::atomic<std::uint64_t> out_of_order{0};  ///< bindings released on another thread or out of order
  std::atomic<std::uint64_t> destroyed_stream_calls{0};  ///< calls refused for naming a destroyed stream
  std::size_t used ABSL_GUARDED_BY(mu) = 0;  ///< raw + physical bytes
  std::size_t library ABSL_GUARDED_BY(mu) = 0;  ///< set_library_bytes
  /// used + library + the options' context and other processes' bytes: the
  /// device memory in use, of every kind.
  [[nodiscard]] std::size_t device_used() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return used + library + options.context_bytes + options.other_process_bytes;
  }
  std::uintptr_t fake_limit ABSL_GUARDED_BY(mu) = 0;  ///< end of this instance's window
  std::uintptr_t next_fake ABSL_GUARDED_BY(mu) = 0;   ///< set by the constructor
  std::uint64_t next_handle ABSL_GUARDED_BY(mu) = 1;
  std::uint64_t next_event ABSL_GUARDED_BY(mu) = 1;
  std::uint64_t next_stream ABSL_GUARDED_BY(mu) = 1;
  int memory_file ABSL_GUARDED_BY(mu) = -1;  ///< backed: holds every physical allocation
  std::size_t memory_file_end ABSL_GUARDED_BY(mu) = 0;

  absl::btree_map<std::uintptr_t, sim_detail::raw_block> raw ABSL_GUARDED_BY(mu);
  absl::btree_map<std::uintptr_t, sim_detail::host_block> host ABSL_GUARDED_BY(mu);
  absl::btree_map<std::uintptr_t, std::size_t> reservations ABSL_GUARDED_BY(mu);  // base -> bytes
  absl::flat_hash_map<std::uint64_t, sim_detail::physical_block> handles ABSL_GUARDED_BY(mu);
  /// Handles (creator and imports) referring to each physical memory, by its
  /// creator's id: the memory is freed when the last one is released.
  absl::flat_hash_map<std::uint64_t, std::size_t> memory_refs ABSL_GUARDED_BY(mu);
  /// export_physical's tokens: token -> the exporting handle.
  absl::flat_hash_map<int, std::uint64_t> tokens ABSL_GUARDED_BY(mu);
  int next_token ABSL_GUARDED_BY(mu) = 1 << 20;
  absl::btree_map<std::uintptr_t, sim_detail::mapping> mappings ABSL_GUARDED_BY(mu);
  sim_detail::address_ranges accessible ABSL_GUARDED_BY(mu);  ///< mapped and granted access
  absl::flat_hash_map<int, sim_detail::address_ranges> peer_accessible ABSL_GUARDED_BY(mu);  ///< by peer
  absl::flat_hash_map<std::uintptr_t, sim_detail::stream_state> streams ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::uintptr_t, sim_detail::event_state> events ABSL_GUARDED_BY(mu);
  std::array<sim_detail::fault_rule, static_cast<std::size_t>(sim_fault_target::count_)> faults ABSL_GUARDED_BY(mu);
};

}  // namespace fragctl
