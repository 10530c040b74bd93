// Escaping for the HTML and SVG renderers (report/markup.hpp).
#include "report/markup.hpp"

#include "util/strings.hpp"

namespace fragctl::report_detail {

std::string escape_markup(std::string_view text) {
  const std::string shown = util::printable(text);
  std::string out;
  out.reserve(shown.size());
  for (const char c : shown) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

}  // namespace fragctl::report_detail
