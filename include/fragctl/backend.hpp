// The device backend contract: every call fragctl makes to a GPU runtime.
//
// This header is the whole contract between fragctl and CUDA, HIP or the host
// simulator; nothing above src/backend touches a vendor header. Three
// implementations exist: `cuda` (driver API, dlopen("libcuda.so.1")), `hip`
// (HIP runtime, dlopen("libamdhip64.so")) and `sim` (host simulator).
//
// Shape. Public member functions are non-virtual: they count the call and
// account bytes held, then call the private virtual `do_*` an implementation
// overrides. The counters are what the statistics report as "backend calls"
// and "reserved bytes", so no policy counts for itself.
//
// Errors. Running out of memory is an expected outcome and is returned, never
// thrown: raw and host allocation return nullptr, create_physical returns an
// empty optional, map and set_access return false. Every other failure of the
// runtime throws fragctl::backend_error carrying the runtime's code and name.
// Releasing calls (free, release_*, unmap, destroy_event) throw only on a
// runtime error, which means the caller broke a precondition or the device is
// lost.
//
// Threads. A backend object may be called from several threads at once; the
// counters are atomic. A backend object is bound to one device for its life.
//
// Streams. Allocation and free of raw memory and physical handles are not
// stream-ordered: `free` and `unmap` may only be called once no queued work
// uses the memory (the caller synchronizes or proves it with an event).
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "fragctl/types.hpp"

namespace fragctl {

/// Handle of a physical allocation (CUmemGenericAllocationHandle or the HIP
/// equivalent, or a sim handle). Value 0 is never a live handle.
struct physical_handle {
  std::uint64_t value = 0;
  friend bool operator==(physical_handle, physical_handle) = default;
};

/// A physical handle exported for another process (export_physical): a
/// POSIX file descriptor of the exporting process (cuda), or a token that
/// only the same process can import (sim), and a number that no other
/// export of this process carries, so that an importer's cache keyed by
/// the handle never mistakes a later handle for an earlier one whose
/// descriptor number was reused.
struct exported_handle {
  int fd = -1;
  std::uint64_t serial = 0;
};

/// The runtime's IPC handle of a raw allocation (cuIpcGetMemHandle,
/// hipIpcGetMemHandle; CUDA_IPC_HANDLE_SIZE bytes).
using ipc_memory_handle = std::array<char, 64>;

/// Free and total device memory in bytes, as the runtime reports them.
struct memory_info {
  std::size_t free = 0;
  std::size_t total = 0;
};

/// Device memory by process, as the vendor's management library reports it
/// (NVML for cuda; sim's own model): what a report needs to tell this
/// process's memory from other processes' (docs/reports.md, "Every rank side
/// by side").
struct process_memory {
  /// False where the backend has no per-process figures (no NVML, HIP, this
  /// process not in NVML's list, as in a container that hides host PIDs).
  bool measured = false;
  std::size_t this_process = 0;     ///< device bytes this process uses (context included)
  std::size_t other_processes = 0;  ///< device bytes every other process on the device uses
};

/// Every kind of backend call, for counters.
enum class backend_call : std::uint8_t {
  allocate,
  free,
  reserve_address,
  release_address,
  create_physical,
  release_physical,
  map,
  set_access,
  unmap,
  create_event,
  destroy_event,
  record_event,
  query_event,
  synchronize_event,
  synchronize_stream,
  create_stream,
  destroy_stream,
  memory_info,
  allocate_host,
  free_host,
  memcpy_async,
  wait_event,
  count_  // number of kinds; not a call
};

/// Lower-case name of a call kind ("create_physical"), for reports.
[[nodiscard]] std::string_view to_string(backend_call call) noexcept;

/// A consistent-enough copy of a backend's counters (each field is read
/// atomically; fields are not read together under one lock).
struct backend_counters {
  std::array<std::uint64_t, static_cast<std::size_t>(backend_call::count_)> calls{};
  std::size_t held_bytes = 0;       ///< device bytes held now: raw allocations + physical handles
  std::size_t peak_held_bytes = 0;  ///< maximum of held_bytes over the backend's life
  std::size_t window_peak_held_bytes = 0;  ///< maximum of held_bytes since reset_window_peak()
  std::size_t held_total = 0;      ///< bytes ever taken from the device (cumulative)
  std::size_t released_total = 0;  ///< bytes ever given back to the device (cumulative)
  std::size_t host_bytes = 0;       ///< pinned host bytes held now
  std::uint64_t failed_allocations = 0;  ///< allocate/create_physical/map/set_access that ran out of memory

  [[nodiscard]] std::uint64_t of(backend_call c) const noexcept {
    return calls[static_cast<std::size_t>(c)];
  }
  /// Calls that allocate, free, map or unmap device memory: the calls a warm
  /// allocator should not make. Events, queries and host calls are excluded.
  [[nodiscard]] std::uint64_t memory_calls() const noexcept;
  /// Sum of every call.
  [[nodiscard]] std::uint64_t total_calls() const noexcept;
};

class device_backend;
class span_registry;  // src/backend/span_registry.hpp

/// The calling thread bound to a backend's device (device_backend::bind_device).
/// Destroying it puts back the thread's previous binding. Destroy it on the
/// thread that made it, bindings in the reverse order of their making.
class device_binding {
 public:
  device_binding(device_binding&& other) noexcept : backend_(other.backend_), previous_(other.previous_) {
    other.backend_ = nullptr;
  }
  device_binding& operator=(device_binding&&) = delete;
  device_binding(const device_binding&) = delete;
  device_binding& operator=(const device_binding&) = delete;
  ~device_binding();

 private:
  friend class device_backend;
  device_binding(device_backend* backend, std::uintptr_t previous) noexcept : backend_(backend), previous_(previous) {}
  device_backend* backend_;
  std::uintptr_t previous_;  ///< the implementation's token for the binding to put back
};

class device_backend {
 public:
  virtual ~device_backend() = default;
  device_backend(const device_backend&) = delete;
  device_backend& operator=(const device_backend&) = delete;

  /// "cuda", "hip" or "sim".
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
  /// Device ordinal this backend allocates on.
  [[nodiscard]] virtual int device() const noexcept = 0;
  /// Whether reserve/create_physical/map/set_access/unmap are available. When
  /// false, calling them throws backend_error with code "not_supported".
  [[nodiscard]] virtual bool supports_virtual_memory() const noexcept = 0;
  /// Granularity of physical allocations and mappings in bytes (a power of
  /// two; 2 MiB on H100/H200). Sizes and offsets passed to create_physical,
  /// map, set_access and unmap must be multiples of it.
  [[nodiscard]] virtual std::size_t granularity() const noexcept = 0;

  // --- Raw device memory (cuMemAlloc / hipMalloc) --------------------------

  /// Allocates `bytes` (> 0) of device memory, aligned to at least 512 bytes
  /// (the runtimes give 256 B or more; 2 MiB for large sizes). Returns
  /// nullptr when the device is out of memory.
  [[nodiscard]] void* allocate(std::size_t bytes);
  /// Frees memory from allocate(ptr's size `bytes`). Synchronous: no queued
  /// work may still use it. `bytes` must be the size given to allocate.
  void free(void* ptr, std::size_t bytes);

  // --- Virtual memory --------------------------------------------------------

  /// Reserves `bytes` (multiple of granularity) of address space, aligned to
  /// `alignment` (0 means granularity). No physical memory is committed.
  [[nodiscard]] void* reserve_address(std::size_t bytes, std::size_t alignment = 0);
  /// Releases a whole range from reserve_address; nothing may be mapped in it.
  void release_address(void* base, std::size_t bytes);
  /// Creates a physical allocation of `bytes` (multiple of granularity).
  /// Returns nullopt when the device is out of memory.
  [[nodiscard]] std::optional<physical_handle> create_physical(std::size_t bytes);
  /// Releases a physical allocation; it must be unmapped everywhere.
  void release_physical(physical_handle handle, std::size_t bytes);
  /// Maps all of `handle` at address `va` (inside a reserved range, not
  /// mapped); `bytes` must be the handle's size. CUDA's cuMemMap refuses both
  /// an offset into a handle and a part of one (measured on an H200,
  /// docs/backends.md). Returns false when out of memory.
  [[nodiscard]] bool map(void* va, std::size_t bytes, physical_handle handle);
  /// Grants this device read-write access to a mapped range. Must follow map
  /// before the memory is used. Returns false when out of memory.
  [[nodiscard]] bool set_access(void* va, std::size_t bytes);
  /// Unmaps a range mapped with map (the whole mapping). Synchronous: no
  /// queued work may still use it. Physical data survives in the handle.
  void unmap(void* va, std::size_t bytes);

  // --- Events and streams ----------------------------------------------------

  /// Creates an event without timing (cheap to record and query).
  [[nodiscard]] event_t create_event();
  void destroy_event(event_t event);
  /// Records `event` on `stream`: it completes when all work queued on the
  /// stream before this call has completed.
  void record_event(event_t event, stream_t stream);
  /// True when the work the event waits for has completed. Never blocks.
  [[nodiscard]] bool query_event(event_t event);
  /// Blocks the calling thread until the event has completed.
  void synchronize_event(event_t event);
  /// Blocks the calling thread until all work queued on `stream` completed.
  void synchronize_stream(stream_t stream);
  /// Makes all work queued on `stream` after this call wait until `event`
  /// has completed (cuStreamWaitEvent / hipStreamWaitEvent); never blocks the
  /// calling thread. Waits for the work `event` marked when this call is made:
  /// recording the event again later does not change what `stream` waits for.
  /// An event never recorded is complete. The base implementation, for
  /// backends that cannot order streams on the device, blocks the calling
  /// thread in synchronize_event instead (correct, not asynchronous).
  void wait_event(stream_t stream, event_t event);
  /// Makes this backend's device the calling thread's current device until
  /// the returned binding is destroyed, for libraries that work on the
  /// thread's current device (NCCL, RCCL): CUDA makes the device's primary
  /// context current, HIP calls hipSetDevice, sim records the binding. The
  /// backend's own calls need none (each binds for its duration). Throws
  /// backend_error when the runtime refuses.
  [[nodiscard]] device_binding bind_device();
  /// Creates a non-blocking stream (for tests, benchmarks and copy engines).
  [[nodiscard]] stream_t create_stream();
  void destroy_stream(stream_t stream);

  // --- Memory information, pinned host memory, copies -----------------------

  /// Free and total device memory as the runtime sees it now.
  [[nodiscard]] memory_info get_memory_info();
  /// This process's and the other processes' device memory now (NVML's
  /// per-process usage on cuda, loaded with dlopen("libnvidia-ml.so.1");
  /// sim's model). `measured` false where the backend cannot tell. Never
  /// throws for a missing library; not a memory call, not counted.
  [[nodiscard]] process_memory get_process_memory() const noexcept;
  /// Allocates `bytes` of page-locked host memory the device can read and
  /// write (cuMemHostAlloc / hipHostMalloc; plain memory on sim). Returns
  /// nullptr when out of memory.
  [[nodiscard]] void* allocate_host(std::size_t bytes);
  void free_host(void* ptr, std::size_t bytes);
  /// Copies `bytes` from `src` to `dst` (device or pinned host, any
  /// direction) asynchronously on `stream`.
  void memcpy_async(void* dst, const void* src, std::size_t bytes, stream_t stream);

  // --- Peers -----------------------------------------------------------------

  /// Makes every later set_access grant device `peer` read-write access as
  /// well, so that kernels on `peer` read and write this device's mapped
  /// memory directly, as they do cudaMalloc memory once the program enabled
  /// peer access. Checks first that the two devices can (cuDeviceCanAccessPeer
  /// / hipDeviceCanAccessPeer). Ranges mapped before are not changed: their
  /// owner grants them again with set_access. Adding a peer again does
  /// nothing. Not a memory call, not counted. Throws invalid_argument for
  /// this device or a negative ordinal, backend_error when the runtime says
  /// `peer` does not exist or cannot access this device (code
  /// "not_supported" where the backend has no peers: the sim's are devices
  /// 0 .. sim_options::devices - 1).
  void add_access_peer(int peer);
  /// The checks of add_access_peer without adding the peer: throws what
  /// add_access_peer would throw for `peer`, or returns. For allocators whose
  /// memory needs no grant (plain device allocations) but which answer a bad
  /// peer as the arena does (caching_policy::enable_peer_access).
  void check_access_peer(int peer) const;
  /// Undoes add_access_peer(peer) for later set_access calls (ranges already
  /// granted keep their access); a peer never added is ignored. For an
  /// allocator whose grant failed midway (arena_policy::enable_peer_access).
  void remove_access_peer(int peer) noexcept;
  /// The devices add_access_peer added, in that order.
  [[nodiscard]] const std::vector<int>& access_peers() const noexcept { return peers_; }

  // --- Spans -----------------------------------------------------------------

  /// What watch_spans reports: a span became usable (after the set_access
  /// that granted it, or after allocate), or is about to stop being (before
  /// the unmap or free that takes it).
  enum class span_event : std::uint8_t { mapped, unmapping };
  /// Called for each span event, outside the backend's locks; must not throw.
  using span_observer = void (*)(span_event event, void* address, std::size_t bytes, void* context) noexcept;
  /// Reports, from now on, every span of physical memory this backend makes
  /// usable or takes away: one event per raw allocation and per mapped
  /// handle (never a range that crosses two handles), for libraries that
  /// register memory by range (NCCL's ncclCommRegister). A span's
  /// `unmapping` comes before the unmap or free, so a registration can be
  /// undone while the memory is still there; if that call throws, the span
  /// stays and is reported `mapped` again. Replaces an earlier observer;
  /// nullptr stops. Spans usable before the call are not reported (see
  /// for_each_span).
  void watch_spans(span_observer observer, void* context);
  /// Calls f(address, bytes) for every usable span now, in address order
  /// (raw allocations and mapped handles whose access was granted).
  void for_each_span(const std::function<void(void*, std::size_t)>& f) const;

  // --- Sharing memory with other processes (docs/interop.md, CUDA IPC) --------

  /// Whether physical handles are created shareable (cuMemCreate with
  /// CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), so that export_physical can
  /// give them to another process. False where the driver refused that
  /// handle type (then handles are created without one) or has no export.
  [[nodiscard]] virtual bool shareable_handles() const noexcept { return false; }
  /// Exports `handle` (live, from create_physical) for another process. The
  /// descriptor belongs to the backend: made on the first call, the same on
  /// later ones, closed when the handle is released (release_physical, also
  /// one that throws), so it stays valid as long as the handle lives and a
  /// later handle never gets an earlier one's descriptor or serial. Not a
  /// memory call, not counted. Throws backend_error with code "not_supported" where handles
  /// are not shareable, backend_error when the runtime fails.
  [[nodiscard]] exported_handle export_physical(physical_handle handle);
  /// Imports a physical allocation of `bytes` another process (or this one)
  /// exported: `fd` is a descriptor of this process (the caller keeps and
  /// closes it) or, on sim, the exporter's token. The handle maps like one
  /// from create_physical; release it with release_imported once unmapped.
  /// The memory is not counted as held: it belongs to the exporter. Throws
  /// backend_error ("not_supported" where the backend cannot import).
  [[nodiscard]] physical_handle import_physical(int fd, std::size_t bytes);
  /// Releases a handle from import_physical (unmapped). The memory goes
  /// back to the device once its owner released it too.
  void release_imported(physical_handle handle, std::size_t bytes);
  /// map, set_access and unmap for a handle from import_physical: the same
  /// runtime calls, but not fragctl's memory, so neither counted among this
  /// backend's calls nor reported to watch_spans' observer (a trace tracker
  /// would otherwise register another process's memory with NCCL).
  [[nodiscard]] bool map_imported(void* va, std::size_t bytes, physical_handle handle) {
    return do_map(va, bytes, handle);
  }
  [[nodiscard]] bool set_access_imported(void* va, std::size_t bytes) { return do_set_access(va, bytes); }
  void unmap_imported(void* va, std::size_t bytes) { do_unmap(va, bytes); }
  /// The runtime's IPC handle of `base`, a pointer from allocate() (the
  /// whole allocation). Throws backend_error ("not_supported" where the
  /// backend has no IPC of raw memory).
  [[nodiscard]] ipc_memory_handle export_allocation(void* base);
  /// Opens another process's raw allocation from its IPC handle; returns
  /// its base address in this process. Throws backend_error.
  [[nodiscard]] void* open_allocation(const ipc_memory_handle& handle);
  /// Closes an allocation open_allocation opened.
  void close_allocation(void* base);
  /// Handles exported and not yet released (descriptors held).
  [[nodiscard]] std::size_t exported_handles() const;
  /// Whether export_physical exported `handle` and it was not released
  /// since (another process may have imported it).
  [[nodiscard]] bool exported(physical_handle handle) const noexcept;

  // --- Counters --------------------------------------------------------------

  [[nodiscard]] backend_counters counters() const noexcept;
  /// Starts a new window for window_peak_held_bytes (PyTorch's
  /// reset_peak_memory_stats); the lifetime peak is kept.
  void reset_window_peak() noexcept;

 protected:
  device_backend();

 private:
  virtual void* do_allocate(std::size_t bytes) = 0;
  virtual void do_free(void* ptr, std::size_t bytes) = 0;
  virtual void* do_reserve_address(std::size_t bytes, std::size_t alignment) = 0;
  virtual void do_release_address(void* base, std::size_t bytes) = 0;
  virtual std::optional<physical_handle> do_create_physical(std::size_t bytes) = 0;
  virtual void do_release_physical(physical_handle handle, std::size_t bytes) = 0;
  virtual bool do_map(void* va, std::size_t bytes, physical_handle handle) = 0;
  virtual bool do_set_access(void* va, std::size_t bytes) = 0;
  virtual void do_unmap(void* va, std::size_t bytes) = 0;
  virtual event_t do_create_event() = 0;
  virtual void do_destroy_event(event_t event) = 0;
  virtual void do_record_event(event_t event, stream_t stream) = 0;
  virtual bool do_query_event(event_t event) = 0;
  virtual void do_synchronize_event(event_t event) = 0;
  virtual void do_synchronize_stream(stream_t stream) = 0;
  virtual void do_wait_event(stream_t /*stream*/, event_t event) { do_synchronize_event(event); }
  /// Binds the device to the calling thread; returns a token for the
  /// binding to put back (do_unbind_device). The base implementation, for
  /// backends without a current device, does nothing.
  virtual std::uintptr_t do_bind_device() { return 0; }
  virtual void do_unbind_device(std::uintptr_t /*previous*/) noexcept {}
  friend class device_binding;
  virtual stream_t do_create_stream() = 0;
  virtual void do_destroy_stream(stream_t stream) = 0;
  virtual memory_info do_get_memory_info() = 0;
  /// The default: no per-process figures.
  virtual process_memory do_get_process_memory() const noexcept { return {}; }
  virtual void* do_allocate_host(std::size_t bytes) = 0;
  virtual void do_free_host(void* ptr, std::size_t bytes) = 0;
  virtual void do_memcpy_async(void* dst, const void* src, std::size_t bytes, stream_t stream) = 0;
  /// Checks that `peer` (not this device, not negative) exists and can
  /// access this device. The default refuses (not_supported).
  virtual void do_check_access_peer(int peer) const;
  /// Makes do_set_access grant `peer` (checked, not added before) from now on.
  virtual void do_add_access_peer(int /*peer*/) {}
  /// Forgets the `index`-th peer added (0-based, in add order). The default does nothing.
  virtual void do_remove_access_peer(std::size_t /*index*/) noexcept {}
  /// Sharing (export_physical ... close_allocation). The defaults refuse
  /// (not_supported); do_close_export closes an exported descriptor when its
  /// handle is released (the default does nothing).
  virtual int do_export_physical(physical_handle handle);
  virtual void do_close_export(int /*fd*/) noexcept {}
  virtual physical_handle do_import_physical(int fd, std::size_t bytes);
  virtual ipc_memory_handle do_export_allocation(void* base);
  virtual void* do_open_allocation(const ipc_memory_handle& handle);
  virtual void do_close_allocation(void* base);
  [[noreturn]] void refuse_sharing(const char* call) const;
  /// Forgets (closing its descriptor) the export of a handle being released.
  void forget_export(physical_handle handle) noexcept;

  void count(backend_call c) noexcept {
    calls_[static_cast<std::size_t>(c)].fetch_add(1, std::memory_order_relaxed);
  }
  void add_held(std::size_t bytes) noexcept;
  void sub_held(std::size_t bytes) noexcept;

  std::array<std::atomic<std::uint64_t>, static_cast<std::size_t>(backend_call::count_)> calls_{};
  std::atomic<std::size_t> held_bytes_{0};
  std::atomic<std::size_t> peak_held_bytes_{0};
  std::atomic<std::size_t> window_peak_held_bytes_{0};
  std::atomic<std::size_t> held_total_{0};
  std::atomic<std::size_t> released_total_{0};
  std::atomic<std::size_t> host_bytes_{0};
  std::atomic<std::uint64_t> failed_allocations_{0};
  std::vector<int> peers_;  // add_access_peer's, in order
  std::shared_ptr<span_registry> spans_;  // src/backend/span_registry.hpp

  // export_physical's descriptors by handle value; `any_exports_` keeps
  // release_physical from taking the lock when nothing was ever exported.
  mutable std::mutex exports_mutex_;
  std::unordered_map<std::uint64_t, exported_handle> exports_;
  std::atomic<bool> any_exports_{false};
};

struct config;  // fragctl/config.hpp

/// Creates the backend `cfg.backend` names for device `cfg.device`
/// (FRAGCTL_BACKEND). `automatic` tries cuda, then hip, then falls back to sim
/// with one info log line saying why. Asking for cuda or hip explicitly when
/// the runtime or device is missing throws backend_error whose message is one
/// line naming what is missing (e.g. "libcuda.so.1 not found").
[[nodiscard]] std::unique_ptr<device_backend> make_backend(const config& cfg);

/// Creates the CUDA driver backend for `device`; throws backend_error if the
/// driver cannot be loaded or the device does not exist.
[[nodiscard]] std::unique_ptr<device_backend> make_cuda_backend(int device);
/// Creates the HIP backend for `device`; throws backend_error as above.
[[nodiscard]] std::unique_ptr<device_backend> make_hip_backend(int device);

}  // namespace fragctl
