// Pinned host memory for the checkpoint store's host tier (docs/checkpoint.md).
//
// Pinning (cuMemHostAlloc / hipHostMalloc) costs milliseconds per call and
// takes the driver's locks, so the arena pins large extents once and serves
// buffers of any size from them for the life of the arena: after the first
// iteration of a training loop no call pins anything.
//
// Two providers serve the buffers:
//  * `jemalloc`: a dedicated jemalloc arena (mallctl "arenas.create") whose
//    extent hooks obtain pinned pages from the backend's allocate_host;
//    requests are mallocx(size, MALLOCX_ARENA(a) | MALLOCX_TCACHE_NONE).
//    The hooks never give an extent back (jemalloc retains it), never merge
//    extents pinned by different calls (one copy must not span two pinned
//    allocations), and the whole arena is destroyed, then unpinned, when the
//    pinned_host_arena is. jemalloc is never linked into libfragctl.so:
//    it comes from libfragctl_jemalloc.so (Debian's static jemalloc, every
//    symbol hidden, only fragctl_jemalloc_* exported) when the program links
//    or preloads it, else from a jemalloc already serving the process. See
//    docs/checkpoint.md for why (initial-exec TLS, unprefixed symbols).
//  * `size_classes`: when no jemalloc can be found, or on request: pinned
//    blocks rounded up to 8 size classes per doubling, cached by class and
//    reused, never unpinned before the arena is destroyed.
//
// Threads: every member function may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "fragctl/backend.hpp"

namespace fragctl::checkpoint {

/// Which provider a pinned_host_arena uses.
enum class host_provider : std::uint8_t {
  automatic,     ///< jemalloc where one can be found, else size_classes
  jemalloc,      ///< jemalloc or throw backend_error
  size_classes,  ///< the built-in class cache
};

/// "automatic", "jemalloc" or "size_classes".
[[nodiscard]] std::string_view to_string(host_provider provider) noexcept;

struct host_arena_stats {
  std::size_t live_bytes = 0;       ///< bytes handed out and not returned (requested sizes)
  std::size_t peak_live_bytes = 0;  ///< maximum of live_bytes
  std::size_t pinned_bytes = 0;     ///< bytes held from the backend's allocate_host now
  std::uint64_t pin_calls = 0;      ///< allocate_host calls made (successful)
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
};

class pinned_host_arena {
 public:
  /// Creates the arena on `backend`, which must outlive it. `automatic`
  /// settles on a provider now (see provider()). Throws backend_error when
  /// `jemalloc` is asked for and none is available, or arenas.create fails.
  explicit pinned_host_arena(device_backend& backend, host_provider provider = host_provider::automatic);
  /// Destroys the jemalloc arena (or drops the class cache) and unpins every
  /// extent. Buffers still handed out become invalid; no queued copy may
  /// still use any of them.
  ~pinned_host_arena();
  pinned_host_arena(const pinned_host_arena&) = delete;
  pinned_host_arena& operator=(const pinned_host_arena&) = delete;

  /// A pinned buffer of at least `bytes` (> 0), aligned to 16 bytes at least
  /// and to the page from 16 KiB on. Throws out_of_memory when the backend
  /// cannot pin more.
  [[nodiscard]] void* allocate(std::size_t bytes);
  /// Returns a buffer from allocate(bytes). Never throws; a null pointer does
  /// nothing.
  void deallocate(void* ptr, std::size_t bytes) noexcept;

  /// The provider in use: host_provider::jemalloc or size_classes.
  [[nodiscard]] host_provider provider() const noexcept;
  /// Where the jemalloc in use comes from: "libfragctl_jemalloc" (the private
  /// copy), "process" (a jemalloc already loaded), or "" for size_classes.
  [[nodiscard]] std::string_view jemalloc_source() const noexcept;
  [[nodiscard]] host_arena_stats stats() const;

  class impl;

 private:
  std::unique_ptr<impl> impl_;
};

/// Whether a jemalloc with arenas.create and extent hooks can be used in this
/// process, and from where ("libfragctl_jemalloc", "process", or "" when
/// none). Loads nothing new after the first call.
[[nodiscard]] std::string_view jemalloc_available();

}  // namespace fragctl::checkpoint
