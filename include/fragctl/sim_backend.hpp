// The host simulator backend: tests, CI and trace replay without a GPU.
//
// Two modes. *Accounting* hands out fake, never-dereferenceable addresses
// (from 2^48 up, above any host mapping; never reused) and keeps no host
// memory, so an 80 GB trace replays on a laptop. *Backed* gives
// real host memory: raw allocations are host pages, reserved ranges are
// PROT_NONE mappings, physical handles are regions of one memfd file that map()
// places with MAP_FIXED, so data lives in the handle and survives unmap/remap
// exactly as on a GPU; memory stays inaccessible until set_access. Tests write
// patterns through the pointers and catch overlaps.
//
// Capacity counts the bytes of live raw allocations and physical handles (as
// given, unrounded); reservations are address space only and count nothing.
// Misuse a real driver rejects (unknown pointers or handles, maps outside a
// reservation or over a mapping, partial unmaps, releasing what is still
// mapped) throws backend_error with a CUDA-like code ("invalid_value",
// "invalid_handle", "not_supported"). Thread-safe: one mutex guards the state.
//
// Streams and events. A sim stream is a counter of submitted work: submit()
// (a stand-in for a kernel launch) and memcpy_async each queue one unit.
// Recording an event stamps it with the stream's current position; an event
// is not work, so one recorded on an idle stream is complete. By default work
// completes at once (every event is complete when queried). With
// `manual_completion`, work completes only when the test calls
// complete(stream) or complete_all(); synchronize_* complete what they wait
// for, as a GPU would finish it. wait_event(s, e) on a pending event holds
// the work s queues afterwards: complete(s) stops before it until e's stream
// has completed e (complete_all and synchronize_* complete both). Any stream value is accepted (a caller's
// stream, such as a trace's, is met on first use); only streams from
// create_stream may be destroyed. Copies run synchronously when submitted
// (backed) or not at all when a side is a fake device address (accounting).
//
// Fault injection is deterministic: fail the N-th call of a kind (1-based,
// counting from when the rule is set), every k-th, or the N-th and every
// later one (memory pressure that does not go away). A failed
// allocate/create_physical/map/set_access reports out of memory (nullptr,
// nullopt or false) as the contract says; a failed unmap/release_physical
// throws backend_error with code name "injected_fault" (999, CUDA's
// CUDA_ERROR_UNKNOWN), the only way the contract lets them fail. A failing
// call changes nothing: no memory, mapping or access is left half made or
// half gone. Misuse is still checked first, so a bad call reports its own
// error, never the injected one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "fragctl/backend.hpp"
#include "fragctl/config.hpp"

namespace fragctl {

struct sim_options {
  std::size_t capacity = 80 * GiB;      ///< device bytes; allocations beyond fail
  std::size_t granularity = 2 * MiB;    ///< physical allocation granularity
  bool backed = false;                  ///< real host memory (true) or accounting (false)
  bool virtual_memory = true;           ///< whether the VM calls are supported
  bool manual_completion = false;       ///< events complete only when told
  int device = 0;                       ///< ordinal reported by device()
  int devices = 1;  ///< devices in the simulated machine: ordinals below it other than `device` can be access peers
  /// Device bytes this process's runtime context holds from the start (the
  /// CUDA context of a real device): used on the device, counted in this
  /// process's usage (get_process_memory), never an allocation's.
  std::size_t context_bytes = 0;
  /// Device bytes other processes hold: used on the device, counted in
  /// get_process_memory's other_processes.
  std::size_t other_process_bytes = 0;
};

/// The sim options a configuration names (sim_capacity, sim_granularity,
/// sim_backed, sim_virtual_memory, sim_devices, sim_context,
/// sim_other_processes, device); manual_completion off.
[[nodiscard]] sim_options sim_options_from(const config& cfg);

/// Which calls a fault rule applies to.
enum class sim_fault_target : std::uint8_t {
  allocate,
  create_physical,
  map,
  set_access,
  allocate_host,
  unmap,
  release_physical,
  count_  ///< number of targets; not a target
};

class sim_backend final : public device_backend {
 public:
  explicit sim_backend(sim_options options = {});
  ~sim_backend() override;

  [[nodiscard]] std::string_view name() const noexcept override { return "sim"; }
  /// Handles are always exportable (as tokens this process imports).
  [[nodiscard]] bool shareable_handles() const noexcept override { return supports_virtual_memory(); }
  [[nodiscard]] int device() const noexcept override;
  [[nodiscard]] bool supports_virtual_memory() const noexcept override;
  [[nodiscard]] std::size_t granularity() const noexcept override;
  [[nodiscard]] const sim_options& options() const noexcept;

  /// Queues one unit of simulated work (a kernel launch) on `stream`; with
  /// manual_completion it stays pending until complete()/synchronize.
  /// Returns its number on the stream (1 for the first unit).
  std::uint64_t submit(stream_t stream);
  /// Completes all work submitted to `stream` so far, except work held by a
  /// wait_event whose event has not completed (that work and what follows it).
  void complete(stream_t stream);
  /// As complete(), up to and including unit `item` (a number submit
  /// returned); work already complete stays so. A stream never used is left
  /// alone.
  void complete_through(stream_t stream, std::uint64_t item);
  /// Completes all work on every stream.
  void complete_all();

  /// Makes the `nth` call (1-based) of `target` from now fail.
  void fail_nth(sim_fault_target target, std::uint64_t nth);
  /// Makes every `k`-th call of `target` from now fail (k = 0 turns it off).
  void fail_every(sim_fault_target target, std::uint64_t k);
  /// Makes the `nth` call (1-based) of `target` from now and every later one
  /// fail, until reset_faults.
  void fail_from(sim_fault_target target, std::uint64_t nth);
  /// Clears every fault rule and restarts the per-target call numbering.
  void reset_faults();

  /// Device bytes in use now (raw + physical), as the simulated device sees them.
  [[nodiscard]] std::size_t used_bytes() const noexcept;
  /// Sets the device bytes this process holds outside any allocation of this
  /// backend, as a library's own buffers would (NCCL's communicators,
  /// cuBLAS's workspaces): used on the device and in this process's usage.
  /// Allocations fail as out of memory where they no longer fit beside them.
  void set_library_bytes(std::size_t bytes);

  // Per-process figures (get_process_memory), sim's model: this process uses
  // its allocations, context_bytes and the library bytes; other processes
  // other_process_bytes. The device's used memory (get_memory_info) is the
  // sum of both; capacity is what allocations, context, library bytes and
  // other processes share.
  /// Bytes of address space mapped now (the sum of the live mappings).
  [[nodiscard]] std::size_t mapped_bytes() const;
  /// Number of live raw allocations, physical handles, reservations, mappings,
  /// events and host allocations: all zero when a user released everything.
  struct live_objects {
    std::size_t allocations = 0, physical = 0, reservations = 0, mappings = 0, events = 0,
                streams = 0, host = 0;
  };
  [[nodiscard]] live_objects live() const;
  /// True when the device may read and write all of [va, va + bytes): the
  /// range lies in a live raw allocation, or is mapped and set_access granted
  /// it. For tests: unmapped or not-yet-accessible memory reads false.
  [[nodiscard]] bool accessible(const void* va, std::size_t bytes) const;
  /// accessible() as seen from device `device`: this device's view, or for
  /// an access peer (add_access_peer) whether set_access granted it the
  /// whole range. Raw allocations read false from a peer (the runtime's
  /// context-wide peer access is not simulated).
  [[nodiscard]] bool accessible_from(int device, const void* va, std::size_t bytes) const;
  /// The device the calling thread's latest live bind_device binding of any
  /// sim backend names, -1 when it has none: the current device NCCL would
  /// see.
  [[nodiscard]] static int bound_device() noexcept;
  /// bind_device calls on this backend, and its bindings released out of
  /// order (on another thread than their own, or while a later binding of
  /// that thread was alive): a caller a real runtime would leave on the
  /// wrong device.
  struct binding_counts {
    std::uint64_t bindings = 0, out_of_order = 0;
  };
  [[nodiscard]] binding_counts bindings() const noexcept;
  /// Calls that named a destroyed stream (record_event, synchronize_stream,
  /// wait_event, memcpy_async, submit), each refused with invalid_handle. On
  /// CUDA such a call may end the process: the tests of
  /// device_allocator::stream_ending ask for none.
  [[nodiscard]] std::uint64_t destroyed_stream_calls() const noexcept;

 private:
  void* do_allocate(std::size_t bytes) override;
  void do_free(void* ptr, std::size_t bytes) override;
  void* do_reserve_address(std::size_t bytes, std::size_t alignment) override;
  void do_release_address(void* base, std::size_t bytes) override;
  std::optional<physical_handle> do_create_physical(std::size_t bytes) override;
  void do_release_physical(physical_handle handle, std::size_t bytes) override;
  bool do_map(void* va, std::size_t bytes, physical_handle handle) override;
  bool do_set_access(void* va, std::size_t bytes) override;
  void do_check_access_peer(int peer) const override;
  void do_unmap(void* va, std::size_t bytes) override;
  int do_export_physical(physical_handle handle) override;
  void do_close_export(int fd) noexcept override;
  physical_handle do_import_physical(int fd, std::size_t bytes) override;
  ipc_memory_handle do_export_allocation(void* base) override;
  void* do_open_allocation(const ipc_memory_handle& handle) override;
  void do_close_allocation(void* base) override;
  event_t do_create_event() override;
  void do_destroy_event(event_t event) override;
  void do_record_event(event_t event, stream_t stream) override;
  bool do_query_event(event_t event) override;
  void do_synchronize_event(event_t event) override;
  void do_synchronize_stream(stream_t stream) override;
  void do_wait_event(stream_t stream, event_t event) override;
  std::uintptr_t do_bind_device() override;
  void do_unbind_device(std::uintptr_t previous) noexcept override;
  stream_t do_create_stream() override;
  void do_destroy_stream(stream_t stream) override;
  memory_info do_get_memory_info() override;
  process_memory do_get_process_memory() const noexcept override;
  void* do_allocate_host(std::size_t bytes) override;
  void do_free_host(void* ptr, std::size_t bytes) override;
  void do_memcpy_async(void* dst, const void* src, std::size_t bytes, stream_t stream) override;

  struct state;
  std::unique_ptr<state> state_;
};

}  // namespace fragctl
