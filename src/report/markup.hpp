// HTML and SVG written so that no text from a report, a trace or a file name
// can become markup (issue 27, H1: a pool name once closed the SVG and opened
// a <script>).
//
// The renderers write into a `markup` and nothing else, and a markup grows
// only through emit(): its format is a string literal (literal_format; a
// runtime string, fmt::runtime() included, does not compile), checked at
// compile time by fmt, so everything that varies arrives as an argument,
// and each argument is written according to its type:
//
// * text (std::string, std::string_view, const char*, char): first made
//   printable (util::printable: valid UTF-8, no control, bidirectional or
//   non-character code point, which also keeps a standalone SVG well-formed
//   XML), then & < > " ' become entities, so it is safe both as element text
//   and inside a double-quoted attribute;
// * numbers: as fmt writes them (the format spec applies);
// * another markup: as is (it was built the same way);
// * constant_markup: as is; it can only be made from a constant expression
//   (the page's CSS and JavaScript).
//
// Anything else (a bool, a pointer, a type fmt would format through a
// user-defined formatter) does not compile. There is no other way to put a
// runtime string into a markup, so an escaping mistake is a compile error.
#pragma once

#include <concepts>
#include <cstddef>
#include <iterator>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "fmt/format.h"

namespace fragctl::report_detail {

/// Markup the renderer wrote itself, known at compile time (consteval).
class constant_markup {
 public:
  consteval explicit constant_markup(std::string_view text) : text_(text) {}
  [[nodiscard]] constexpr std::string_view text() const noexcept { return text_; }

 private:
  std::string_view text_;
};

/// `text` made printable (util::printable), then with &, <, >, " and '
/// written as entities: safe as HTML or XML text and in a quoted attribute.
[[nodiscard]] std::string escape_markup(std::string_view text);

template <class T>
struct markup_arg;  // how emit() writes an argument of type T (below)

/// emit()'s format: a string literal, its replacement fields checked
/// against the arguments at compile time. Only a char array converts (a
/// fmt::runtime() string does not), so the format is the renderer's own.
template <class... Args>
class literal_format {
 public:
  template <std::size_t N>
  consteval literal_format(const char (&text)[N])  // NOLINT(google-explicit-constructor): a literal converts
      : format_(text) {}
  [[nodiscard]] fmt::string_view get() const noexcept { return format_; }

 private:
  fmt::format_string<Args...> format_;
};

/// A fragment of HTML or SVG that holds no unescaped outside text. Not
/// thread-safe (one writer, as a std::string).
class markup {
 public:
  markup() = default;

  /// Appends `format` with `args` written as the header says. Throws
  /// std::bad_alloc only.
  template <class... Args>
  markup& emit(literal_format<typename markup_arg<Args>::type...> format, const Args&... args) {
    fmt::vformat_to(std::back_inserter(text_), format.get(), fmt::make_format_args(markup_arg<Args>::convert(args)...));
    return *this;
  }

  markup& operator+=(const markup& other) {
    text_ += other.text_;
    return *this;
  }

  [[nodiscard]] const std::string& str() const& noexcept { return text_; }
  [[nodiscard]] std::string str() && noexcept { return std::move(text_); }
  [[nodiscard]] bool empty() const noexcept { return text_.empty(); }

 private:
  std::string text_;
};

/// Numbers (not bool, not char): formatted by fmt.
template <class T>
struct markup_arg {
  static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool> && !std::is_same_v<T, char>,
                "emit() writes text (escaped), numbers, markup and constant_markup only");
  using type = T;
  static T convert(T v) noexcept { return v; }
};

template <>
struct markup_arg<markup> {
  using type = std::string_view;
  static std::string_view convert(const markup& m) noexcept { return m.str(); }
};

template <>
struct markup_arg<constant_markup> {
  using type = std::string_view;
  static std::string_view convert(const constant_markup& m) noexcept { return m.text(); }
};

/// Text of any kind: escaped.
template <class T>
requires std::convertible_to<const T&, std::string_view>
struct markup_arg<T> {
  using type = std::string;
  static std::string convert(const T& text) { return escape_markup(std::string_view(text)); }
};

template <>
struct markup_arg<char> {
  using type = std::string;
  static std::string convert(char c) { return escape_markup(std::string_view(&c, 1)); }
};

}  // namespace fragctl::report_detail
