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

/// `s` as text safe to show a person on a terminal or a page: valid UTF-8
/// with no character that moves the cursor, changes colours, reorders the
/// line or hides. Control characters (U+0000-U+001F and U+007F, newline and
/// tab included) and every byte that is not part of a well-formed UTF-8
/// character are written as a backslash, 'x' and two hex digits (ESC shows
/// as the four characters \x1b); C1 controls (U+0080-U+009F), the
/// bidirectional controls (U+061C, U+200E, U+200F, U+202A-U+202E,
/// U+2066-U+2069), the line and paragraph separators (U+2028, U+2029) and
/// the non-characters U+FFFE and U+FFFF as a backslash, 'u' and four hex
/// digits. Everything else is unchanged (a backslash too: the form is for
/// reading, not reversible). Text from files, file names and the environment
/// passes through this before it is printed. Thread-safe.
[[nodiscard]] std::string printable(std::string_view s);
/// Each line of `s` through printable, the line breaks between them kept:
/// a message of several lines (an error quoting a file, an OOM's
/// description) still reads as lines on the terminal. Thread-safe.
[[nodiscard]] std::string printable_lines(std::string_view s);

}  // namespace fragctl::util
