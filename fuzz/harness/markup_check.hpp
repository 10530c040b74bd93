// The oracle of fuzz_report_render: is a page the report renderers wrote
// free of markup that came from its input?
//
// Theory. The renderers' markup (which elements, which attributes, in what
// order) depends on the figures of a report, never on its strings: a name,
// a pool or a path is only ever element text or an attribute value. So a
// report rendered twice, once with its strings and once with every string
// replaced by a harmless "x", must give pages of the same *skeleton* (the
// sequence of start tags with their attribute names, end tags, and the
// verbatim content of <script> and <style>). Escaping that failed anywhere
// shows as a difference: a tag, an attribute or a script that only the
// hostile strings produced. On top of the comparison, each page is checked
// on its own: it tokenizes as the renderers write markup (every '<' opens a
// tag of a known name, every '&' an entity, no '>' in text, attribute values
// quoted and free of '<' and '>'), it is valid UTF-8 without control,
// bidirectional or non-character code points (which would also make a
// standalone SVG ill-formed XML), no attribute is an event handler or a
// link, and an HTML page has exactly its own one <script>, an SVG none.
// Terminal text is checked likewise: no control character but its own line
// breaks, and as many lines as the harmless rendering.
#pragma once

#include <cctype>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fmt/format.h"
#include "fuzz/harness/block_model.hpp"

namespace fragctl::fuzz {

/// What a page is made of once its text and attribute values are dropped.
struct markup_skeleton {
  std::vector<std::string> items;  ///< "<tag attr attr", "</tag", "script:CONTENT", "style:CONTENT"
  std::size_t scripts = 0;
  bool operator==(const markup_skeleton&) const = default;
};

namespace markup_check_detail {

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> what, Args&&... args) {
  throw invariant_violation(fmt::format(what, std::forward<Args>(args)...));
}

inline bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == ':';
}

// The elements the renderers write (HTML page, inline and standalone SVG).
inline bool known_element(std::string_view name) {
  static constexpr std::string_view known[] = {
      "html", "head",    "meta",    "title", "style", "body", "h1", "h2",   "h3",     "p",       "b",
      "div",  "section", "table",   "tr",    "th",    "td",   "ul", "li",   "span",   "details", "summary",
      "svg",  "defs",    "pattern", "rect",  "line",  "text", "g",  "path", "circle", "script"};
  for (const std::string_view k : known)
    if (k == name) return true;
  return false;
}

// The code point at s[i] (advancing i), or -1 where s[i] starts no
// well-formed UTF-8 character.
inline std::int32_t next_code_point(std::string_view s, std::size_t& i) {
  const auto b = [&](std::size_t k) { return static_cast<std::uint8_t>(s[k]); };
  const std::uint8_t b0 = b(i);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  std::size_t n = 0;
  std::int32_t c = 0;
  std::int32_t min = 0;
  if ((b0 & 0xE0) == 0xC0)
    n = 2, c = b0 & 0x1F, min = 0x80;
  else if ((b0 & 0xF0) == 0xE0)
    n = 3, c = b0 & 0x0F, min = 0x800;
  else if ((b0 & 0xF8) == 0xF0)
    n = 4, c = b0 & 0x07, min = 0x10000;
  else
    return -1;
  if (i + n > s.size()) return -1;
  for (std::size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return -1;
    c = (c << 6) | (b(i + k) & 0x3F);
  }
  if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return -1;
  i += n;
  return c;
}

inline bool control_or_hidden(std::int32_t c) {
  return c < 0x20 || (c >= 0x7F && c <= 0x9F) || c == 0x061C || c == 0x200E || c == 0x200F ||
         (c >= 0x2028 && c <= 0x202E) || (c >= 0x2066 && c <= 0x2069) || c == 0xFFFE || c == 0xFFFF;
}

// Valid UTF-8 whose only control characters are `allowed` ones.
inline void check_characters(std::string_view text, std::string_view allowed, std::string_view what) {
  std::size_t i = 0;
  while (i < text.size()) {
    const std::size_t at = i;
    const std::int32_t c = next_code_point(text, i);
    if (c < 0) fail("{}: byte {} (0x{:02x}) is not UTF-8", what, at, static_cast<std::uint8_t>(text[at]));
    if (c >= 0 && control_or_hidden(c)) {
      if (!(c < 0x80 && allowed.find(static_cast<char>(c)) != std::string_view::npos))
        fail("{}: control or hidden character U+{:04X} at byte {}", what, c, at);
    }
  }
}

// An entity at text[i] ('&'): "&name;", "&#123;" or "&#x1F;".
inline std::size_t entity_length(std::string_view text, std::size_t i) {
  std::size_t k = i + 1;
  if (k < text.size() && text[k] == '#') {
    ++k;
    const bool hex = k < text.size() && text[k] == 'x';
    if (hex) ++k;
    const std::size_t digits = k;
    while (k < text.size() && (hex ? std::isxdigit(static_cast<unsigned char>(text[k])) != 0
                                   : std::isdigit(static_cast<unsigned char>(text[k])) != 0))
      ++k;
    if (k == digits) return 0;
  } else {
    const std::size_t letters = k;
    while (k < text.size() && std::isalpha(static_cast<unsigned char>(text[k])) != 0) ++k;
    if (k == letters) return 0;
  }
  return k < text.size() && text[k] == ';' ? k + 1 - i : 0;
}

}  // namespace markup_check_detail

/// The skeleton of `page` (HTML, or SVG with its XML declaration); throws
/// invariant_violation naming `what` where the page breaks a rule of the
/// header.
inline markup_skeleton parse_markup(std::string_view page, std::string_view what) {
  using namespace markup_check_detail;
  check_characters(page, "\n", what);
  markup_skeleton out;
  std::size_t i = 0;
  const auto context = [&](std::size_t at) {
    const std::size_t from = at > 60 ? at - 60 : 0;
    return std::string(page.substr(from, 120));
  };
  while (i < page.size()) {
    const char c = page[i];
    if (c == '>') throw invariant_violation(fmt::format("{}: '>' in text at byte {}: ...{}...", what, i, context(i)));
    if (c == '&') {
      const std::size_t n = entity_length(page, i);
      if (n == 0) fail("{}: '&' that starts no entity at byte {}: ...{}...", what, i, context(i));
      i += n == 0 ? 1 : n;
      continue;
    }
    if (c != '<') {
      ++i;
      continue;
    }
    // A declaration the renderers write first: <!DOCTYPE html> or <?xml ...?>.
    if (i == 0 && (page.starts_with("<!DOCTYPE html>") || page.starts_with("<?xml "))) {
      const std::size_t end = page.find('>');
      out.items.emplace_back(page.substr(0, end + 1));
      i = end + 1;
      continue;
    }
    const bool closing = i + 1 < page.size() && page[i + 1] == '/';
    std::size_t k = i + (closing ? 2 : 1);
    const std::size_t name_start = k;
    while (k < page.size() && is_name_char(page[k])) ++k;
    const std::string name(page.substr(name_start, k - name_start));
    if (name.empty() || std::isalpha(static_cast<unsigned char>(name[0])) == 0)
      fail("{}: '<' that opens no tag at byte {}: ...{}...", what, i, context(i));
    if (!known_element(name))
      fail("{}: element <{}> the renderers never write, at byte {}: ...{}...", what, name, i, context(i));
    std::string item = (closing ? "</" : "<") + name;
    bool self_closing = false;
    for (;;) {
      while (k < page.size() && page[k] == ' ') ++k;
      if (k >= page.size()) fail("{}: tag <{}> not closed", what, name);
      if (page[k] == '>') {
        ++k;
        break;
      }
      if (page.substr(k, 2) == "/>") {
        self_closing = true;
        k += 2;
        break;
      }
      if (closing) fail("{}: an end tag with attributes at byte {}", what, i);
      const std::size_t attr_start = k;
      while (k < page.size() && is_name_char(page[k])) ++k;
      const std::string attr(page.substr(attr_start, k - attr_start));
      if (attr.empty() || page.substr(k, 2) != "=\"")
        fail("{}: malformed attribute in <{}> at byte {}: ...{}...", what, name, k, context(k));
      if (attr.size() > 2 && (attr[0] == 'o' || attr[0] == 'O') && (attr[1] == 'n' || attr[1] == 'N'))
        fail("{}: event handler attribute {} in <{}>", what, attr, name);
      if (attr == "href" || attr == "xlink:href" || attr == "src" || attr == "srcdoc")
        fail("{}: link attribute {} in <{}>", what, attr, name);
      k += 2;
      const std::size_t value_end = page.find('"', k);
      if (value_end == std::string_view::npos) fail("{}: attribute {} never closed", what, attr);
      const std::string_view value = page.substr(k, value_end - k);
      if (value.find_first_of("<>") != std::string_view::npos)
        fail("{}: '<' or '>' in attribute {} of <{}>: {}", what, attr, name, std::string(value));
      for (std::size_t a = 0; a < value.size(); ++a) {
        if (value[a] != '&') continue;
        if (entity_length(value, a) == 0)
          fail("{}: '&' that starts no entity in attribute {}: {}", what, attr, std::string(value));
      }
      item += " " + attr;
      k = value_end + 1;
    }
    out.items.push_back(item + (self_closing ? "/" : ""));
    i = k;
    // Raw text elements: their content is kept verbatim in the skeleton.
    if (!closing && !self_closing && (name == "script" || name == "style")) {
      const std::string end = "</" + name + ">";
      const std::size_t stop = page.find(end, i);
      if (stop == std::string_view::npos) fail("{}: <{}> never closed", what, name);
      out.items.push_back(name + ":" + std::string(page.substr(i, stop - i)));
      out.items.push_back("</" + name);
      if (name == "script") ++out.scripts;
      i = stop + end.size();
    }
  }
  return out;
}

/// Checks terminal text: UTF-8, no control character but '\n'.
inline void check_terminal_text(std::string_view text, std::string_view what) {
  markup_check_detail::check_characters(text, "\n", what);
}

}  // namespace fragctl::fuzz
