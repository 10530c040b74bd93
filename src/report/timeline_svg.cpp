// The timeline picture: requested and reserved bytes over a replay, the gap
// between them (what the allocator held beyond the live bytes) shaded, and
// the OOMs marked.
#include <algorithm>
#include <cmath>
#include <iterator>

#include "fmt/format.h"
#include "report/markup.hpp"
#include "report/render_util.hpp"
#include "report/svg.hpp"

namespace fragctl::report_detail {

namespace {

constexpr double margin_left = 76;
constexpr double margin_right = 16;
constexpr double margin_top = 14;
constexpr double margin_bottom = 40;
constexpr std::size_t max_oom_marks = 200;

// A step of 1, 2 or 5 times a power of ten giving at most `ticks` steps over [0, span].
double nice_step(double span, double ticks) {
  if (span <= 0) return 1;
  const double raw = span / ticks;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double m : {1.0, 2.0, 5.0, 10.0})
    if (m * power >= raw) return m * power;
  return 10 * power;
}

struct byte_axis {
  double unit;
  const char* name;
};

byte_axis unit_for(double max_bytes) {
  if (max_bytes >= static_cast<double>(GiB)) return {static_cast<double>(GiB), "GiB"};
  if (max_bytes >= static_cast<double>(MiB)) return {static_cast<double>(MiB), "MiB"};
  if (max_bytes >= static_cast<double>(KiB)) return {static_cast<double>(KiB), "KiB"};
  return {1.0, "B"};
}

std::string tick_number(double v) {
  std::string s = fmt::format("{:.2f}", v);
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

}  // namespace

markup timeline_svg(const timeline& t, double width, double height) {
  markup out;
  const double plot_w = width - margin_left - margin_right;
  const double plot_h = height - margin_top - margin_bottom;
  double x_max = 0;
  double y_max = 1;
  const auto x_of_point = [&](double ms, std::size_t event) { return t.by_time ? ms : static_cast<double>(event); };
  for (const timeline_point& p : t.points) {
    x_max = std::max(x_max, x_of_point(p.time_ms, p.event));
    y_max = std::max({y_max, static_cast<double>(p.reserved), static_cast<double>(p.requested)});
  }
  for (const timeline_oom& o : t.ooms) x_max = std::max(x_max, x_of_point(o.time_ms, o.event));
  if (x_max <= 0) x_max = 1;
  const byte_axis unit = unit_for(y_max);
  const double y_step = nice_step(y_max / unit.unit, 5) * unit.unit;
  y_max = std::ceil(y_max / y_step) * y_step;
  const double x_step = nice_step(x_max, 8);

  const auto sx = [&](double x) { return margin_left + x / x_max * plot_w; };
  const auto sy = [&](double y) { return margin_top + plot_h - y / y_max * plot_h; };

  out.emit(
      "<svg class=\"timeline\" width=\"{:.0f}\" height=\"{:.0f}\" viewBox=\"0 0 {:.0f} {:.0f}\" "
      "data-points=\"{}\" data-count=\"{}\" font-family=\"sans-serif\" font-size=\"11\">\n",
      width, height, width, height, t.points.size(), t.ooms.size());
  // Grid and axes.
  out.emit("<g class=\"axis y\">\n");
  for (double y = 0; y <= y_max * 1.0001; y += y_step) {
    out.emit(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e0e0e0\"/>"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{} {}</text>\n",
        margin_left, sy(y), margin_left + plot_w, sy(y), margin_left - 6, sy(y) + 4, tick_number(y / unit.unit),
        unit.name);
  }
  out.emit("</g>\n<g class=\"axis x\">\n");
  for (double x = 0; x <= x_max * 1.0001; x += x_step) {
    out.emit(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#9e9e9e\"/>"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
        sx(x), margin_top + plot_h, sx(x), margin_top + plot_h + 4, sx(x), margin_top + plot_h + 16, tick_number(x));
  }
  out.emit("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n</g>\n", margin_left + plot_w / 2,
           height - 6, t.by_time ? "trace time (ms)" : "trace event");

  // Lines, and the gap between them.
  std::string requested;
  std::string reserved;
  std::string gap_back;
  for (std::size_t i = 0; i < t.points.size(); ++i) {
    const timeline_point& p = t.points[i];
    const double x = sx(x_of_point(p.time_ms, p.event));
    const char* cmd = i == 0 ? "M" : "L";
    fmt::format_to(std::back_inserter(requested), "{}{:.1f},{:.1f} ", cmd, x, sy(static_cast<double>(p.requested)));
    fmt::format_to(std::back_inserter(reserved), "{}{:.1f},{:.1f} ", cmd, x, sy(static_cast<double>(p.reserved)));
  }
  for (std::size_t i = t.points.size(); i-- > 0;) {
    const timeline_point& p = t.points[i];
    fmt::format_to(std::back_inserter(gap_back), "L{:.1f},{:.1f} ", sx(x_of_point(p.time_ms, p.event)),
                   sy(static_cast<double>(p.requested)));
  }
  if (!t.points.empty()) {
    out.emit("<path class=\"gap\" d=\"{}{}Z\" fill=\"#ffccbc\" fill-opacity=\"0.6\"/>\n", reserved, gap_back);
    out.emit("<path class=\"line reserved\" d=\"{}\" fill=\"none\" stroke=\"#d84315\" stroke-width=\"1.6\"/>\n",
             reserved);
    out.emit("<path class=\"line requested\" d=\"{}\" fill=\"none\" stroke=\"#1565c0\" stroke-width=\"1.6\"/>\n",
             requested);
  }
  // OOM marks.
  const std::size_t every = std::max<std::size_t>(1, (t.ooms.size() + max_oom_marks - 1) / max_oom_marks);
  for (std::size_t i = 0; i < t.ooms.size(); i += every) {
    const timeline_oom& o = t.ooms[i];
    const double x = sx(x_of_point(o.time_ms, o.event));
    out.emit(
        "<g class=\"oom\" data-event=\"{}\"><line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
        "stroke=\"#b71c1c\" stroke-dasharray=\"3,2\"/><circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4\" "
        "fill=\"#b71c1c\"/><title>OOM at event {} ({:.1f} ms): {} requested with {} live, {} reserved"
        "</title></g>\n",
        o.event, x, margin_top, x, margin_top + plot_h, x, sy(static_cast<double>(o.reserved)), o.event, o.time_ms,
        bytes(o.bytes), bytes(o.requested), bytes(o.reserved));
  }
  // Legend.
  out.emit(
      "<g class=\"timeline-legend\" transform=\"translate({:.1f},{:.1f})\">"
      "<line x1=\"0\" y1=\"0\" x2=\"18\" y2=\"0\" stroke=\"#d84315\" stroke-width=\"2\"/>"
      "<text x=\"22\" y=\"4\">reserved</text>"
      "<line x1=\"90\" y1=\"0\" x2=\"108\" y2=\"0\" stroke=\"#1565c0\" stroke-width=\"2\"/>"
      "<text x=\"112\" y=\"4\">requested (live)</text>"
      "<rect x=\"220\" y=\"-6\" width=\"18\" height=\"12\" fill=\"#ffccbc\"/>"
      "<text x=\"242\" y=\"4\">held beyond live</text>"
      "{}</g>\n",
      margin_left + 8, margin_top + 8,
      t.ooms.empty() ? constant_markup("")
                     : constant_markup("<circle cx=\"356\" cy=\"0\" r=\"4\" fill=\"#b71c1c\"/><text x=\"364\" "
                                       "y=\"4\">OOM</text>"));
  out.emit("</svg>\n");
  return out;
}

}  // namespace fragctl::report_detail
