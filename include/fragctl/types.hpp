// Vocabulary types shared by every layer.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fragctl {

/// An opaque GPU stream handle (CUstream / hipStream_t). nullptr is the
/// device's default (legacy) stream. fragctl never dereferences it.
using stream_t = void*;

/// An opaque GPU event handle (CUevent / hipEvent_t), created by a backend.
using event_t = void*;

/// Which device backend to build (FRAGCTL_BACKEND; make_backend in
/// fragctl/backend.hpp). Here so that the configuration can name it without
/// including the backend layer.
enum class backend_kind : std::uint8_t { automatic, cuda, hip, sim };

/// Every pointer fragctl hands out is aligned to at least this many bytes.
inline constexpr std::size_t min_alignment = 512;

inline constexpr std::size_t KiB = std::size_t{1} << 10;
inline constexpr std::size_t MiB = std::size_t{1} << 20;
inline constexpr std::size_t GiB = std::size_t{1} << 30;

/// Rounds `n` up to a multiple of `to` (a power of two). Precondition:
/// n + to - 1 does not overflow.
[[nodiscard]] constexpr std::size_t round_up(std::size_t n, std::size_t to) noexcept {
  return (n + to - 1) & ~(to - 1);
}

/// Rounds `n` down to a multiple of `to` (a power of two).
[[nodiscard]] constexpr std::size_t round_down(std::size_t n, std::size_t to) noexcept {
  return n & ~(to - 1);
}

}  // namespace fragctl
