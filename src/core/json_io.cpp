// Bounded JSON reading (core/json_io.hpp).
#include "core/json_io.hpp"

#include "fmt/format.h"

namespace fragctl::detail {

std::optional<std::size_t> json_too_deep(std::string_view text, std::size_t limit) noexcept {
  std::size_t depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"': in_string = true; break;
      case '[':
      case '{':
        if (++depth > limit) return i;
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;
        break;
      default: break;
    }
  }
  return std::nullopt;
}

absl::Status json_too_deep_error(std::string_view where, std::size_t offset) {
  return absl::InvalidArgumentError(
      fmt::format("{}{}JSON nested deeper than {} levels (byte {}); fragctl reads at "
                  "most {}",
                  where, where.empty() ? "" : ": ", json_max_depth, offset, json_max_depth));
}

absl::StatusOr<nlohmann::json> parse_json(std::string_view text, std::string_view where) {
  if (const auto deep = json_too_deep(text)) return json_too_deep_error(where, *deep);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    return absl::InvalidArgumentError(fmt::format("{}{}not valid JSON", where, where.empty() ? "" : ": "));
  return j;
}

}  // namespace fragctl::detail
