// Collectives for ZeRO-3 behind one small interface.
//
// Implementations:
//  * NCCL (CUDA) and RCCL (HIP), loaded with dlopen (same symbol names), one
//    process per GPU, any number of hosts; the communicator is non-blocking so
//    that every wait has a deadline (make_nccl_communicator).
//  * threads as ranks in one process over the sim backend, for tests
//    (make_thread_communicator).
//
// Semantics follow NCCL: every rank calls the same collectives in the same
// order with the same sizes; a collective is queued on `stream` and ordered
// with the work queued there before and after it. The thread implementation
// runs it on the calling thread (sim work completes at once).
//
// Deadlines. Every collective must complete within timeout(). One that does
// not (a rank never joins, a peer died) aborts the communicator and raises
// collective_error naming the rank, the operation and the caller's tag (for
// the block manager: the block), never a silent hang. With NCCL the error is
// raised by the next call into the communicator, by check() or synchronize();
// a watchdog thread aborts the communicator at the deadline, which also
// releases a thread blocked in a stream synchronization on it.
//
// Threads: one thread drives a communicator (the watchdog is internal).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "fragctl/error.hpp"
#include "fragctl/types.hpp"

namespace fragctl {
class device_backend;
}

namespace fragctl::zero3 {

/// Element types collectives reduce.
enum class data_type : std::uint8_t { uint8, float16, bfloat16, float32 };

[[nodiscard]] std::size_t size_of(data_type t) noexcept;
[[nodiscard]] std::string_view to_string(data_type t) noexcept;
/// "bf16"/"bfloat16", "fp16"/"float16", "fp32"/"float32", "uint8".
[[nodiscard]] absl::StatusOr<data_type> parse_data_type(std::string_view text);

/// A collective that failed, was aborted, or did not finish before its deadline.
class collective_error : public error {
 public:
  collective_error(const std::string& what, int rank, std::string operation, std::string tag, bool timed_out);
  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] const std::string& operation() const noexcept { return operation_; }
  [[nodiscard]] const std::string& tag() const noexcept { return tag_; }
  [[nodiscard]] bool timed_out() const noexcept { return timed_out_; }

 private:
  int rank_;
  std::string operation_;
  std::string tag_;
  bool timed_out_;
};

/// One buffer pair of an all-gather: recv[r * bytes, (r + 1) * bytes) receives
/// rank r's send. In place when send == recv + rank * bytes.
struct gather_part {
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t bytes = 0;  ///< per rank
};

/// One buffer pair of a reduce-scatter (sum): recv = sum over ranks of their
/// send[rank * elements, (rank + 1) * elements). In place when
/// recv == send + rank * elements * size_of(type).
struct scatter_part {
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t elements = 0;  ///< per rank
};

class communicator {
 public:
  virtual ~communicator() = default;
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;

  [[nodiscard]] virtual int rank() const noexcept = 0;
  [[nodiscard]] virtual int size() const noexcept = 0;
  /// "nccl", "rccl" or "threads".
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
  [[nodiscard]] virtual std::chrono::milliseconds timeout() const noexcept = 0;

  /// All-gathers every part as one grouped operation on `stream`. `tag` names
  /// what is gathered in errors. Throws collective_error (see above).
  virtual void all_gather(std::span<const gather_part> parts, stream_t stream, std::string_view tag) = 0;
  /// Reduce-scatters (sum) every part of element type `type` as one grouped
  /// operation on `stream`. Throws collective_error.
  virtual void reduce_scatter(std::span<const scatter_part> parts, data_type type, stream_t stream,
                              std::string_view tag) = 0;
  /// Raises the error of a collective that failed or passed its deadline;
  /// returns at once otherwise. Never blocks.
  virtual void check() = 0;
  /// Blocks until every collective queued so far has completed, or raises
  /// collective_error at the deadline of the oldest.
  virtual void synchronize() = 0;
  /// Aborts the communicator: pending and later collectives fail. Idempotent.
  virtual void abort() noexcept = 0;
  /// Host time spent blocked inside this communicator (waiting for peers or
  /// for a collective to be queued or completed), in nanoseconds.
  [[nodiscard]] virtual std::uint64_t blocked_ns() const noexcept = 0;

 protected:
  communicator() = default;
};

// --- threads as ranks (sim) -------------------------------------------------

/// The shared state of one group of thread ranks. Create one, then one
/// communicator per rank, each used by its own thread.
class thread_group;

/// A group of `size` ranks whose collectives time out after `timeout`.
[[nodiscard]] std::shared_ptr<thread_group> make_thread_group(int size, std::chrono::milliseconds timeout);

/// Rank `rank` of `group`, on `backend` (a sim backend: backed sim moves the
/// data through host memory; accounting sim only checks and counts). Throws
/// invalid_argument for a rank out of range, a rank taken twice, or a backend
/// that is not sim.
[[nodiscard]] std::unique_ptr<communicator> make_thread_communicator(std::shared_ptr<thread_group> group, int rank,
                                                                     device_backend& backend);

// --- the caller's collectives ------------------------------------------------

/// What a caller-provided collective returns: done, failed, or past its
/// deadline (the caller's runtime enforces the deadline, e.g. a
/// torch.distributed process group's timeout).
enum class callback_result : std::uint8_t { ok, failed, timed_out };

/// Collectives run by the caller's own runtime (fragctl.torch.zero3 passes
/// torch.distributed's). Each function runs one grouped operation with the
/// semantics of communicator::all_gather / reduce_scatter and returns when it
/// is queued on `stream` (or done); on failure it may fill `message`.
struct callback_collectives {
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{600000};
  std::function<callback_result(std::span<const gather_part>, stream_t, std::string_view tag, std::string& message)>
      all_gather;
  std::function<callback_result(std::span<const scatter_part>, data_type, stream_t, std::string_view tag,
                                std::string& message)>
      reduce_scatter;
};

/// A communicator over `c`. A failed or timed-out collective raises
/// collective_error naming the rank, the operation and the tag (the block),
/// with the caller's message; the communicator is then aborted and every
/// later call raises the same. Throws invalid_argument for a rank outside
/// [0, size) or a missing function.
[[nodiscard]] std::unique_ptr<communicator> make_callback_communicator(callback_collectives c);

// --- NCCL / RCCL --------------------------------------------------------------

/// NCCL's opaque unique id (ncclUniqueId: 128 bytes).
using unique_id = std::array<unsigned char, 128>;

/// Lower-case hex of an id (256 characters), and back.
[[nodiscard]] std::string to_hex(const unique_id& id);
[[nodiscard]] absl::StatusOr<unique_id> unique_id_from_hex(std::string_view hex);

enum class collective_library : std::uint8_t { nccl, rccl };

struct nccl_options {
  collective_library library = collective_library::nccl;
  int rank = 0;
  int size = 1;
  /// Path of the library to dlopen; empty means $FRAGCTL_NCCL_LIBRARY, else
  /// libnccl.so.2 / libnccl.so (librccl.so.1 / librccl.so for RCCL).
  std::string library_path;
  /// The unique id is read from this environment variable when it is set
  /// (hex, as to_hex writes it; a launcher generates it once)...
  std::string unique_id_env = "FRAGCTL_NCCL_UNIQUE_ID";
  /// ...else rank 0 creates it and writes it to this file (atomically) and the
  /// other ranks wait for the file, up to `timeout`. A shared file system
  /// reaches every host; use a fresh path per job.
  std::string unique_id_file;
  /// Deadline of initialization and of every collective.
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
};

/// Creates rank `options.rank` of an NCCL/RCCL communicator on the device of
/// `backend` (a cuda backend for NCCL, hip for RCCL). Throws backend_error
/// when the library or a symbol is missing (one line naming it),
/// invalid_argument for bad options or no way to get the unique id, and
/// collective_error when initialization fails or passes its deadline.
[[nodiscard]] std::unique_ptr<communicator> make_nccl_communicator(device_backend& backend,
                                                                   const nccl_options& options);

/// Creates a new unique id with the library `options` names (for launchers
/// that pass it to every rank through unique_id_env). Throws backend_error.
[[nodiscard]] unique_id make_unique_id(const nccl_options& options);

}  // namespace fragctl::zero3
