// What a microbenchmark measures: something that allocates and frees device
// memory on streams. One implementation runs a fragctl allocator stack as a
// user gets it (make_allocator: statistics adaptor, thread_safe on); two run
// the CUDA runtime's own allocators for comparison (cuda_runtime.hpp).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "fragctl/config.hpp"

namespace fragctl::bench {

/// Streams every subject creates up front; benchmarks use the first 1 or all.
inline constexpr unsigned subject_streams = 4;

class subject {
 public:
  virtual ~subject() = default;
  /// Allocates `bytes` for use on stream number `stream` (< subject_streams).
  /// Throws std::bad_alloc when out of memory, std::exception on a failure.
  /// Thread-safe.
  [[nodiscard]] virtual void* allocate(std::size_t bytes, unsigned stream) = 0;
  /// Frees `p` (from allocate(bytes, stream)), stream-ordered on `stream`
  /// where the subject is stream-ordered. Thread-safe; never throws.
  virtual void deallocate(void* p, std::size_t bytes, unsigned stream) noexcept = 0;
  /// Waits for every stream's queued work (between runs; untimed).
  virtual void quiesce() {}
};

/// The subject named `name` (a policy expression, or a pseudo-policy of
/// cuda_runtime.hpp) on the backend cfg names. Throws std::exception with a
/// one-line reason when it cannot be built (no GPU, no libcudart).
[[nodiscard]] std::unique_ptr<subject> make_subject(const std::string& name, const config& cfg);

/// The one subject alive at a time, shared by the threads of a benchmark:
/// returns the subject `name`, building it (and destroying the previous one)
/// when the current subject has another name. Benchmarks of one subject run
/// back to back and keep its cache warm. Thread-safe; a build failure is
/// rethrown to every caller until another name is asked for.
[[nodiscard]] subject& acquire_subject(const std::string& name, const config& cfg);

/// Destroys the current subject (before exit, while the runtimes are loaded).
void release_subject();

}  // namespace fragctl::bench
