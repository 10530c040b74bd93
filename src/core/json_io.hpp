// The two rules every JSON reader and writer of fragctl follows, in one place
// (STYLE.md, habit 12):
//
// * Reading: nothing deeper than json_max_depth levels reaches nlohmann.
//   nlohmann parses and destroys without recursion, but copying, comparing
//   and dumping a value recurse once per level: a 200 KB file of 100,000 '['
//   overflows the stack in the first copy. A linear scan of the text (the
//   bracket depth outside strings, as nlohmann's lexer reads it) refuses such
//   a document before it is parsed. fragctl's own documents nest 8 levels
//   (report, allocators, memory map, segments, blocks); PyTorch snapshots
//   about as much; the pickle reader has the same limit (pickle_options).
// * Writing: text fragctl did not make (trace names taken from file names,
//   environment values) need not be UTF-8, which nlohmann's dump() refuses
//   with an exception (type_error 316). dump_json replaces each invalid byte
//   with U+FFFD instead: the document is still written, and still valid JSON.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace fragctl::detail {

/// The deepest nesting of arrays and objects a JSON reader of fragctl accepts.
inline constexpr std::size_t json_max_depth = 256;

/// The offset of the first '[' or '{' of `text` that opens a level deeper
/// than `limit`, or nullopt when the text nests no deeper (or is not JSON in
/// a way the parser will report). Linear, no recursion; does not throw.
[[nodiscard]] std::optional<std::size_t> json_too_deep(std::string_view text,
                                                       std::size_t limit = json_max_depth) noexcept;

/// The error of a document nested too deep: "WHERE: JSON nested deeper than
/// 256 levels (byte N); fragctl reads at most 256" (`where` empty: no prefix).
[[nodiscard]] absl::Status json_too_deep_error(std::string_view where, std::size_t offset);

/// Parses `text`: the value, or InvalidArgument "WHERE: not valid JSON" or
/// json_too_deep_error. Does not throw.
[[nodiscard]] absl::StatusOr<nlohmann::json> parse_json(std::string_view text, std::string_view where);

/// `j` as text (indented by `indent` spaces, or compact when negative), with
/// every byte of a string that is not UTF-8 written as U+FFFD. Does not throw
/// on any string content.
template <class Json>
[[nodiscard]] std::string dump_json(const Json& j, int indent = 2) {
  return j.dump(indent, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
}

}  // namespace fragctl::detail
