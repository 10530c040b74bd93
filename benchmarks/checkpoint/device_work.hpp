// Work the checkpoint benchmark queues on its compute stream: write a
// pattern into a checkpoint (forward), check it (backward), and spin for a
// while (simulated layer compute).
//
// On the cuda backend these are three small kernels, loaded from PTX text
// with the driver's module API. The backend contract has no kernel launch
// (fragctl only manages memory), so this file resolves the four driver calls
// it needs itself, with dlsym and no vendor header. Elsewhere (sim, or when
// the kernels cannot be loaded) the pattern moves by copies through the host
// and the spin does nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "fragctl/backend.hpp"
#include "fragctl/device_allocator.hpp"

namespace fragctl::bench {

class device_work {
 public:
  virtual ~device_work() = default;
  /// Writes word i = (i * 0x9E3779B1) ^ seed into [p, p + bytes) on `stream`.
  virtual void fill(void* p, std::size_t bytes, std::uint32_t seed, stream_t stream) = 0;
  /// Counts the words of [p, p + bytes) that differ from fill's pattern.
  virtual void check(const void* p, std::size_t bytes, std::uint32_t seed, stream_t stream) = 0;
  /// Occupies `stream` for `ms` milliseconds (nothing where computes() is false).
  virtual void spin(double ms, stream_t stream) = 0;
  /// Mismatched words counted so far (synchronizes).
  [[nodiscard]] virtual std::uint64_t errors() = 0;
  /// "cuda kernels" or "host copies".
  [[nodiscard]] virtual std::string_view kind() const noexcept = 0;
  /// Whether spin takes device time.
  [[nodiscard]] virtual bool computes() const noexcept = 0;
};

/// Kernels on the cuda backend where they load, host copies otherwise.
/// `allocator` and `backend` must outlive the result.
[[nodiscard]] std::unique_ptr<device_work> make_device_work(device_backend& backend, device_allocator& allocator);

/// The pattern word fill writes at index i.
[[nodiscard]] constexpr std::uint32_t pattern_word(std::size_t i, std::uint32_t seed) noexcept {
  return static_cast<std::uint32_t>(static_cast<std::uint32_t>(i) * 0x9E3779B1u) ^ seed;
}

}  // namespace fragctl::bench
