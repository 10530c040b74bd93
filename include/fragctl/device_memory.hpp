// The device memory that is not fragctl's, split where it can be measured
// (docs/reports.md, "The device memory that is not fragctl's").
//
// Theory. A device's used memory (total - free, the runtime's figures) is
// one allocator's reserved bytes plus everything else. fragctl knows some
// of the rest and measures some:
//
//   other fragctl    the reserved bytes of the process's other fragctl
//                    allocators on the device (not graph pools)
//   graph pools      the reserved bytes of its graph_pool allocators there
//   context          this process's device memory when the first allocator
//                    on the device joined the ledger, less fragctl's then:
//                    the CUDA context, and whatever the process held before
//                    fragctl (NVML's per-process figure). Without NVML it is
//                    that allocator's outside_at_start (the device's used
//                    memory outside fragctl then: other processes' included)
//   NCCL             bytes callers attribute (attribute_device_memory): the
//                    ZeRO-3 NCCL communicator measures each communicator's
//                    init, the Python side a process group's
//   other processes  NVML's figure for every other process on the device
//   other            the remainder: this process's memory no one attributed
//                    (cuBLAS and cuDNN workspaces, kernel modules loaded
//                    lazily, another framework's cache) and, without NVML,
//                    other processes'
//
// The parts after the allocator's own bytes add up to used - reserved, the
// report's "not fragctl's": where the known parts exceed it (figures read a
// moment apart, or bytes attributed that the device does not hold) `other`
// is 0 and the parts take what is left in this order: other fragctl, graph
// pools, other processes (counted or measured now), NCCL (measured around
// each communicator), then the context, the estimate that may already hold
// a communicator made before fragctl's first allocator. Devices are told apart by backend name and ordinal, so two sim
// backends of one ordinal in a process are one device to the ledger.
//
// Threads: every function is thread-safe. The ledger's lock is a leaf: it
// is taken after a backend's process figures are read, never around them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "fragctl/backend.hpp"

namespace fragctl {

/// One device's memory split by whose it is (the theory above).
struct device_memory_split {
  /// this_process and other_processes come from the backend's per-process
  /// figures (NVML); false: other processes' memory is part of `other`.
  bool per_process = false;
  std::size_t total = 0;            ///< the device's memory
  std::size_t used = 0;             ///< total - free
  std::size_t this_process = 0;     ///< NVML's figure for this process (per_process only)
  std::size_t fragctl = 0;          ///< the allocator's own reserved bytes
  std::size_t other_fragctl = 0;    ///< reserved by the process's other fragctl allocators on the device
  std::size_t graph_pools = 0;      ///< reserved by its graph_pool allocators on the device
  std::size_t context = 0;          ///< the CUDA context (the theory says how it is measured)
  std::size_t nccl = 0;             ///< attributed to NCCL communicators
  std::size_t other = 0;            ///< the remainder
  std::size_t other_processes = 0;  ///< NVML's figure for the other processes (per_process only)

  /// used - fragctl (0 if negative): what the other fields share.
  [[nodiscard]] std::size_t not_fragctl() const noexcept { return used > fragctl ? used - fragctl : 0; }
  friend bool operator==(const device_memory_split&, const device_memory_split&) = default;
};

/// What device_memory_split is computed from.
struct device_memory_inputs {
  std::size_t total = 0, free = 0;  ///< the runtime's figures
  std::size_t reserved = 0;         ///< the allocator's own
  process_memory process;           ///< the backend's per-process figures
  std::size_t other_fragctl = 0, graph_pools = 0, context = 0, nccl = 0;
};

/// The split of the theory above, from its inputs (pure arithmetic).
[[nodiscard]] device_memory_split split_device_memory(const device_memory_inputs& in) noexcept;

/// The split for the allocator on `backend` holding `reserved` bytes, the
/// device having `free` of `total` bytes: asks the backend for its
/// per-process figures and the ledger for the rest. `outside_at_start` is
/// the allocator's (statistics_adaptor), the context where the ledger has
/// none. Never throws (host memory exhausted: an empty split).
[[nodiscard]] device_memory_split device_memory_split_of(const device_backend& backend, std::size_t reserved,
                                                         std::size_t free, std::size_t total,
                                                         std::size_t outside_at_start) noexcept;

/// One line: "not fragctl's 1.50 GiB: context 512.00 MiB, NCCL 256.00 MiB,
/// graph pools 0 B, other fragctl allocators 0 B, other 0 B, other processes
/// 768.00 MiB (NVML; this process 1.25 GiB)".
[[nodiscard]] std::string describe(const device_memory_split& s);

/// Adds the allocator whose backend is `backend` to the ledger of its device
/// (allocator_stack does, once built): its reserved bytes are then "other
/// fragctl" (or "graph pools" when `graph_pool`) in the splits of the other
/// allocators there. The first allocator of a device also fixes the
/// device's context figure. Call leave_device_memory_ledger before the
/// backend is destroyed.
void join_device_memory_ledger(const device_backend& backend, bool graph_pool, std::size_t outside_at_start);
/// Removes it; a device with no allocator and nothing attributed is
/// forgotten (its context is measured again by the next one). Unknown
/// backends are ignored.
void leave_device_memory_ledger(const device_backend& backend) noexcept;

/// Who device memory outside the allocators is attributed to.
enum class device_memory_use : std::uint8_t { nccl };

/// "nccl".
[[nodiscard]] std::string_view to_string(device_memory_use use) noexcept;
/// The use to_string names; nullopt for any other text.
[[nodiscard]] std::optional<device_memory_use> parse_device_memory_use(std::string_view text) noexcept;

/// Records that `label` (a communicator's name) holds `bytes` of device
/// memory of `backend`'s device for `use`, replacing what `label` held
/// before; 0 bytes removes it.
void attribute_device_memory(const device_backend& backend, device_memory_use use, std::string_view label,
                             std::size_t bytes);

/// This process's device memory on `backend`'s device that no fragctl
/// allocator holds (the backend's per-process figure less every fragctl
/// allocator's reserved bytes there), or SIZE_MAX where the backend has no
/// per-process figures. What a caller measures before and after creating a
/// communicator to attribute its bytes.
[[nodiscard]] std::size_t process_memory_outside_fragctl(const device_backend& backend) noexcept;

}  // namespace fragctl
