// Small string helpers over std::string_view. (Debian 12's Abseil is built
// with its own absl::string_view, distinct from std::string_view, so
// absl::StrCat/StrSplit do not take std::string_view; fragctl formats with
// fmt and splits with these.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/string_view.h"

namespace fragctl::util {

/// absl::string_view -> std::string_view.
[[nodiscard]] inline std::string_view to_std(absl::string_view s) noexcept { return {s.data(), s.size()}; }

/// `s` without leading and trailing ASCII whitespace.
[[nodiscard]] std::string_view trim(std::string_view s) noexcept;
/// Pieces of `s` between `sep`; empty pieces kept.
[[nodiscard]] std::vector<std::string_view> split(std::string_view s, char sep);
/// ASCII lower case copy.
[[nodiscard]] std::string lower(std::string_view s);
/// Parses a whole decimal unsigned integer; false if `s` is not one or overflows.
[[nodiscard]] bool parse_u64(std::string_view s, std::uint64_t& out) noexcept;
/// Parses a whole decimal signed integer; false if `s` is not one or overflows.
[[nodiscard]] bool parse_i64(std::string_view s, std::int64_t& out) noexcept;
/// Parses a whole floating-point number; false if `s` is not one.
[[nodiscard]] bool parse_double(std::string_view s, double& out) noexcept;
/// "1.50 GiB": a byte count for people.
[[nodiscard]] std::string human_bytes(std::size_t bytes);

}  // namespace fragctl::util
