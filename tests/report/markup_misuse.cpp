// Compiled, never run, by the CTest entries markup_misuse_N
// (tests/CMakeLists.txt): report/markup.hpp must refuse at compile time
// every way of putting a runtime string into HTML or SVG unescaped (issue 27,
// H1). MISUSE=0 holds the allowed uses and must compile; each other case
// must not.
#include <string>
#include <string_view>

#include "report/markup.hpp"

namespace fragctl::report_detail {

void write(markup& out, const std::string& text, std::string_view view, const char* pointer, double number) {
#if MISUSE == 0
  out.emit("<td>{}</td><td>{}</td><td>{}</td><td>{:.1f}</td>", text, view, pointer, number);
  out.emit("{}", constant_markup("<br>"));
  markup inner;
  inner.emit("<b>{}</b>", text);
  out.emit("<p>{}</p>", inner);
#elif MISUSE == 1
  out.emit(fmt::runtime(text));  // a runtime format string
#elif MISUSE == 2
  out.emit("{}", constant_markup(view));  // runtime text as constant markup
#elif MISUSE == 3
  out.emit("{}", number > 0);  // a bool
#elif MISUSE == 4
  out.emit("{}", static_cast<const void*>(pointer));  // a pointer
#elif MISUSE == 5
  out.emit("<td>{}</td>");  // a field without its argument
#elif MISUSE == 6
  const char* format = pointer;
  out.emit(format, text);  // a format that is not a literal
#endif
}

}  // namespace fragctl::report_detail
