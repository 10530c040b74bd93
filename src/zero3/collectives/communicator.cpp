// What every communicator shares: element types, the error, unique id text.
#include "fragctl/zero3/communicator.hpp"

#include "fmt/format.h"
#include "util/strings.hpp"

namespace fragctl::zero3 {

std::size_t size_of(data_type t) noexcept {
  switch (t) {
    case data_type::uint8: return 1;
    case data_type::float16: return 2;
    case data_type::bfloat16: return 2;
    case data_type::float32: return 4;
  }
  return 1;
}

std::string_view to_string(data_type t) noexcept {
  switch (t) {
    case data_type::uint8: return "uint8";
    case data_type::float16: return "float16";
    case data_type::bfloat16: return "bfloat16";
    case data_type::float32: return "float32";
  }
  return "?";
}

absl::StatusOr<data_type> parse_data_type(std::string_view text) {
  const std::string t = util::lower(util::trim(text));
  if (t == "bf16" || t == "bfloat16") return data_type::bfloat16;
  if (t == "fp16" || t == "float16" || t == "half") return data_type::float16;
  if (t == "fp32" || t == "float32" || t == "float") return data_type::float32;
  if (t == "uint8" || t == "u8") return data_type::uint8;
  return absl::InvalidArgumentError(
      fmt::format("\"{}\" is not an element type: expected bf16, fp16, fp32 or uint8", text));
}

collective_error::collective_error(const std::string& what, int rank, std::string operation, std::string tag,
                                   bool timed_out)
    : error(what), rank_(rank), operation_(std::move(operation)), tag_(std::move(tag)), timed_out_(timed_out) {}

std::string to_hex(const unique_id& id) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(id.size() * 2);
  for (const unsigned char c : id) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

absl::StatusOr<unique_id> unique_id_from_hex(std::string_view hex) {
  hex = util::trim(hex);
  unique_id id{};
  if (hex.size() != id.size() * 2) {
    return absl::InvalidArgumentError(
        fmt::format("a unique id is {} hex digits, got {}", id.size() * 2, hex.size()));
  }
  const auto value = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < id.size(); ++i) {
    const int hi = value(hex[2 * i]);
    const int lo = value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return absl::InvalidArgumentError(fmt::format("a unique id is hex digits; byte {} is \"{}\"", i,
                                                    hex.substr(2 * i, 2)));
    }
    id[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
  return id;
}

}  // namespace fragctl::zero3
