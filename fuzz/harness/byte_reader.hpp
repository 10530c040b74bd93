// Reading fuzzer input as a stream of decisions. Every read succeeds: past
// the end of the input it yields zeros, so any byte string is a valid program
// and a mutated input stays meaningful up to where it was cut.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace fragctl::fuzz {

class byte_reader {
 public:
  byte_reader(const std::uint8_t* data, std::size_t size) noexcept : data_(data), size_(size) {}

  /// True once every byte was consumed.
  [[nodiscard]] bool empty() const noexcept { return at_ >= size_; }

  /// The next byte, or 0 past the end.
  std::uint8_t byte() noexcept { return at_ < size_ ? data_[at_++] : std::uint8_t{0}; }

  /// A little-endian integer of `bytes` bytes (at most 8).
  std::uint64_t integer(unsigned bytes) noexcept {
    std::uint64_t v = 0;
    for (unsigned i = 0; i < bytes && i < 8; ++i) v |= std::uint64_t{byte()} << (8 * i);
    return v;
  }

  /// A value in [0, n) (n > 0) from one byte, or two when n > 256.
  std::size_t below(std::size_t n) noexcept {
    if (n <= 1) return 0;
    return static_cast<std::size_t>(integer(n > 256 ? 2 : 1) % n);
  }

  /// The rest of the input as text.
  std::string_view rest() noexcept {
    const std::size_t from = at_ < size_ ? at_ : size_;
    at_ = size_;
    return {reinterpret_cast<const char*>(data_ + from), size_ - from};
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t at_ = 0;
};

}  // namespace fragctl::fuzz
