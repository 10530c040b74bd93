// Host arithmetic on the element types collectives reduce: conversions of
// bf16 and fp16 to and from float (round to nearest even, as GPUs do) and an
// element-wise sum, for the thread communicator and for tests' references.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "fragctl/zero3/communicator.hpp"

namespace fragctl::zero3::host_math {

[[nodiscard]] inline float bf16_to_float(std::uint16_t h) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

[[nodiscard]] inline std::uint16_t float_to_bf16(float f) noexcept {
  const auto x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffU) > 0x7f800000U) return static_cast<std::uint16_t>((x >> 16) | 0x0040U);  // quiet NaN
  const std::uint32_t rounded = x + 0x7fffU + ((x >> 16) & 1U);
  return static_cast<std::uint16_t>(rounded >> 16);
}

[[nodiscard]] inline float fp16_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000U) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fU;
  const std::uint32_t mantissa = h & 0x3ffU;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000U | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112U) << 23) | (mantissa << 13));
}

[[nodiscard]] inline std::uint16_t float_to_fp16(float f) noexcept {
  const auto x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000U);
  const std::uint32_t ax = x & 0x7fffffffU;
  if (ax >= 0x7f800000U) return static_cast<std::uint16_t>(sign | (ax > 0x7f800000U ? 0x7e00U : 0x7c00U));
  if (ax >= 0x477ff000U) return static_cast<std::uint16_t>(sign | 0x7c00U);  // rounds to infinity
  if (ax < 0x38800000U) {  // below the smallest normal half: a subnormal (or zero)
    const auto m = static_cast<std::uint32_t>(std::nearbyint(std::bit_cast<float>(ax) * 16777216.0F));
    return static_cast<std::uint16_t>(sign | m);
  }
  std::uint32_t h = (((ax >> 23) - 112U) << 10) | ((ax & 0x7fffffU) >> 13);
  const std::uint32_t rest = ax & 0x1fffU;
  if (rest > 0x1000U || (rest == 0x1000U && (h & 1U) != 0)) ++h;  // a carry rolls into the exponent
  return static_cast<std::uint16_t>(sign | h);
}

/// out[i] += in[i] for `elements` elements of `type` (sums in float for the
/// 16-bit types and rounds once per addition, as a ring reduction does).
inline void accumulate(void* out, const void* in, std::size_t elements, data_type type) noexcept {
  auto* o = static_cast<unsigned char*>(out);
  const auto* s = static_cast<const unsigned char*>(in);
  for (std::size_t i = 0; i < elements; ++i) {
    switch (type) {
      case data_type::uint8: o[i] = static_cast<unsigned char>(o[i] + s[i]); break;
      case data_type::float32: {
        float a = 0, b = 0;
        std::memcpy(&a, o + 4 * i, 4);
        std::memcpy(&b, s + 4 * i, 4);
        a += b;
        std::memcpy(o + 4 * i, &a, 4);
        break;
      }
      case data_type::bfloat16:
      case data_type::float16: {
        std::uint16_t a = 0, b = 0;
        std::memcpy(&a, o + 2 * i, 2);
        std::memcpy(&b, s + 2 * i, 2);
        const bool bf = type == data_type::bfloat16;
        const float sum = bf ? bf16_to_float(a) + bf16_to_float(b) : fp16_to_float(a) + fp16_to_float(b);
        const std::uint16_t r = bf ? float_to_bf16(sum) : float_to_fp16(sum);
        std::memcpy(o + 2 * i, &r, 2);
        break;
      }
    }
  }
}

}  // namespace fragctl::zero3::host_math
