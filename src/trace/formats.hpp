// Internal to the trace layer: one parser per format, and the line scanner
// the CSV parsers share. `file` is the label used in error messages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fmt/format.h"
#include "fragctl/trace.hpp"

namespace fragctl::trace_detail {

/// Yields the lines of `content` (without "\n" or "\r\n"), counting from 1.
class line_scanner {
 public:
  explicit line_scanner(std::string_view content) noexcept : rest_(content) {}
  /// Next line, or false at the end.
  bool next(std::string_view& line) noexcept;
  /// Number of the line next() returned last.
  [[nodiscard]] std::size_t line_number() const noexcept { return number_; }
  /// True when the line next() returned last ends the content without a newline.
  [[nodiscard]] bool unterminated() const noexcept { return unterminated_; }

 private:
  std::string_view rest_;
  std::size_t number_ = 0;
  bool unterminated_ = false;
};

/// Splits a CSV row at commas into `out` (cleared first), each field trimmed.
/// No quoting: no supported format quotes fields.
void split_row(std::string_view line, std::vector<std::string_view>& out);

/// True for lines a CSV parser skips: blank, or a comment starting with '#'.
[[nodiscard]] bool skippable(std::string_view line) noexcept;

/// Parses a decimal integer or a 0x-prefixed hexadecimal one.
[[nodiscard]] bool parse_address(std::string_view text, std::uint64_t& out) noexcept;

/// InvalidArgument "<file>:<line>: <what>".
template <class... Args>
[[nodiscard]] absl::Status line_error(std::string_view file, std::size_t line,
                                      fmt::format_string<Args...> what, Args&&... args) {
  return absl::InvalidArgumentError(
      fmt::format("{}:{}: {}", file, line, fmt::format(what, std::forward<Args>(args)...)));
}

/// `text` cut to at most 60 characters, for quoting input in messages.
[[nodiscard]] std::string quote(std::string_view text);

/// Which parser a content needs.
enum class format_kind : std::uint8_t { fragctl_csv, rmm_csv, pytorch_snapshot };

/// Detects the format from the first meaningful characters or header line.
[[nodiscard]] absl::StatusOr<format_kind> detect_format(std::string_view content,
                                                        std::string_view file);

[[nodiscard]] absl::StatusOr<trace> parse_fragctl_csv(std::string_view content,
                                                      std::string_view file);
[[nodiscard]] absl::StatusOr<trace> parse_rmm_csv(std::string_view content, std::string_view file);
[[nodiscard]] absl::StatusOr<trace> parse_pytorch_snapshot(std::string_view content,
                                                           std::string_view file,
                                                           const trace_options& options);

}  // namespace fragctl::trace_detail
