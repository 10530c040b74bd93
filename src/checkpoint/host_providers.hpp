// The providers behind pinned_host_arena (fragctl/checkpoint/pinned_host_arena.hpp):
// a jemalloc arena with pinning extent hooks, and the size-class cache used
// where no jemalloc can be found.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "fragctl/checkpoint/pinned_host_arena.hpp"

namespace fragctl::checkpoint {

/// What a provider does; pinned_host_arena adds argument checks and the
/// live-byte gauge. Implementations are thread-safe.
class pinned_host_arena::impl {
 public:
  virtual ~impl() = default;
  /// nullptr when nothing more can be pinned.
  [[nodiscard]] virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* ptr, std::size_t bytes) noexcept = 0;
  [[nodiscard]] virtual host_provider provider() const noexcept = 0;
  [[nodiscard]] virtual std::string_view source() const noexcept = 0;
  /// pinned_bytes and pin_calls.
  [[nodiscard]] virtual host_arena_stats pinning() const = 0;

  // The gauge pinned_host_arena keeps, alike for every provider.
  std::atomic<std::size_t> live{0};
  std::atomic<std::size_t> peak{0};
  std::atomic<std::uint64_t> allocations{0};
  std::atomic<std::uint64_t> frees{0};
};

/// The jemalloc entry points in use and where they come from.
struct jemalloc_api {
  void* (*mallocx)(std::size_t size, int flags) = nullptr;
  void (*dallocx)(void* ptr, int flags) = nullptr;
  int (*mallctl)(const char* name, void* oldp, std::size_t* oldlenp, void* newp, std::size_t newlen) = nullptr;
  std::string_view source;  ///< "libfragctl_jemalloc" or "process"
};

/// The jemalloc this process can use, found once (see jemalloc_available());
/// nullptr when there is none or fragctl was built without jemalloc.h.
[[nodiscard]] const jemalloc_api* find_jemalloc();

/// A jemalloc arena whose extents the backend pins. Throws backend_error when
/// arenas.create fails.
[[nodiscard]] std::unique_ptr<pinned_host_arena::impl> make_jemalloc_provider(device_backend& backend,
                                                                             const jemalloc_api& api);
/// Pinned blocks in 8 classes per doubling, cached per class.
[[nodiscard]] std::unique_ptr<pinned_host_arena::impl> make_size_class_provider(device_backend& backend);

/// The class a request of `bytes` is served from: 4 KiB at least, then
/// multiples of 2^(k-3) between 2^k and 2^(k+1) (waste below 12.5%).
[[nodiscard]] std::size_t host_size_class(std::size_t bytes) noexcept;

}  // namespace fragctl::checkpoint
