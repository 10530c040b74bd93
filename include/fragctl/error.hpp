// The one error vocabulary of fragctl (DESIGN.md, "Errors").
//
// Inside C++ errors are exceptions of this family; across the C API and the
// LD_PRELOAD shim they become codes plus one log line; parsing returns
// absl::StatusOr. `out_of_memory` derives from std::bad_alloc so code that
// already catches allocation failures keeps working.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>

namespace fragctl {

/// Base of every fragctl error except out_of_memory (which must be a bad_alloc).
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A caller broke a documented precondition (bad size, bad option, bad name).
class invalid_argument : public error {
 public:
  using error::error;
};

/// A call not valid in the object's present state, which another thread may
/// have just changed: pause() of a paused allocator, resume() of one not
/// paused, an allocation or a share() while paused. An invalid_argument, so code that catches those still does; the
/// C API answers it with FRAGCTL_ERROR_STATE.
class state_error : public invalid_argument {
 public:
  using invalid_argument::invalid_argument;
};

/// The GPU runtime returned an error other than out-of-memory. Carries the
/// runtime's numeric code and its symbolic name (e.g. 2, "CUDA_ERROR_OUT_OF_MEMORY").
class backend_error : public error {
 public:
  backend_error(std::string what, int code, std::string code_name);
  [[nodiscard]] int code() const noexcept { return code_; }
  [[nodiscard]] const std::string& code_name() const noexcept { return code_name_; }

 private:
  int code_;
  std::string code_name_;
};

struct oom_details;

/// Why an allocation failed: the one verdict that out_of_memory::what(), the
/// statistics' OOM events and their log line all print (diagnose; the rules
/// are in fragctl/oom.hpp's theory comment).
enum class oom_verdict : std::uint8_t {
  fragmentation,  ///< enough bytes free, none contiguous enough
  capacity,       ///< the live bytes and the request exceed the device
  other_process,  ///< it would fit without memory held outside this allocator
  declined,       ///< the device had the memory; the allocator would not take it
};

/// "fragmentation", "capacity", "other_process" or "declined".
[[nodiscard]] std::string_view to_string(oom_verdict v) noexcept;

/// The verdict of the theory comment in fragctl/oom.hpp.
[[nodiscard]] oom_verdict diagnose(const oom_details& d) noexcept;

/// Device bytes held outside the allocator: total - free - reserved, or 0.
[[nodiscard]] std::size_t memory_used_by_others(const oom_details& d) noexcept;

/// What the process's own runtime is allowed to hold outside the allocator
/// before memory is blamed on others: min(2 GiB, device_total / 32).
[[nodiscard]] std::size_t runtime_allowance(const oom_details& d) noexcept;

/// Memory held outside beyond the runtime's allowance:
/// memory_used_by_others(d) - runtime_allowance(d), or 0.
[[nodiscard]] std::size_t memory_beyond_runtime(const oom_details& d) noexcept;

/// What an allocator knew when it could not satisfy a request. Every field is
/// in bytes. Filled by the policy that failed; formatted by out_of_memory.
struct oom_details {
  std::size_t requested = 0;           ///< bytes the caller asked for
  std::size_t reserved = 0;            ///< bytes the allocator holds from the backend (a byte cap's refusal: the bytes it counts)
  std::size_t cached_free = 0;         ///< reserved but not allocated (free in cache)
  std::size_t largest_free_block = 0;  ///< largest contiguous free block in the cache
  std::size_t device_free = 0;         ///< free memory the backend reports
  std::size_t device_total = 0;        ///< total memory the backend reports
  /// Device bytes held outside this allocator when it was created (the
  /// runtime's context, other processes): shown beside the OOM verdict
  /// (fragctl/oom.hpp) to tell memory taken since from memory held before.
  /// The statistics adaptor fills it in.
  std::size_t outside_at_start = 0;

  /// True when the request would have fit had the free bytes been
  /// contiguous: diagnose(*this) is oom_verdict::fragmentation.
  [[nodiscard]] bool caused_by_fragmentation() const noexcept {
    return diagnose(*this) == oom_verdict::fragmentation;
  }
};

/// Allocation failure. what() states requested, reserved, free in cache,
/// the largest free block, and whether fragmentation caused it (the verdict
/// of diagnose).
class out_of_memory : public std::bad_alloc {
 public:
  explicit out_of_memory(const oom_details& details, const char* allocator_name = "fragctl");
  [[nodiscard]] const char* what() const noexcept override { return message_.c_str(); }
  [[nodiscard]] const oom_details& details() const noexcept { return details_; }
  /// Appends "; " and `note` to what(): what an adaptor above the failing
  /// policy knows and the policy did not (the statistics adaptor's split of
  /// the device memory that is not fragctl's).
  void add_note(std::string_view note);

 private:
  oom_details details_;
  std::string message_;
};

}  // namespace fragctl
