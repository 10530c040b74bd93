// The ranks of one job in the HTML report (report/ranks.hpp): the table,
// the imbalance, and one picture, two bars per rank on one scale: at peak,
// reserved with the requested bytes inside it; when the report was
// written, allocated + cached (= reserved) + the device memory that is not
// fragctl's (= the device's used bytes, where recorded). Written through
// markup::emit, so every string from a report is escaped (report/markup.hpp).
#include <algorithm>
#include <cstdint>

#include "fmt/format.h"
#include "report/ranks.hpp"
#include "report/render_util.hpp"

namespace fragctl::report_detail {

namespace {

constexpr double label_width = 130;
constexpr double bar_width = 780;
constexpr double bar_height = 12;
constexpr double pair_height = 34;

// a + b + c, or SIZE_MAX where a damaged report's figures overflow.
std::size_t saturated_sum(std::size_t a, std::size_t b, std::size_t c) noexcept {
  const std::size_t ab = a > SIZE_MAX - b ? SIZE_MAX : a + b;
  return ab > SIZE_MAX - c ? SIZE_MAX : ab + c;
}

// A bar segment from `x` of `width` pixels with a tooltip.
void segment(markup& out, double x, double y, double width, constant_markup colour, std::string_view what,
             std::size_t n) {
  if (width <= 0) return;
  out.emit(
      "<rect class=\"rank-bar\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\">"
      "<title>{}: {}</title></rect>\n",
      x, y, width, bar_height, colour, what, bytes(n));
}

void picture(markup& out, const std::vector<rank_row>& rows, const rank_extremes& reserved) {
  std::size_t scale = 1;
  for (const rank_row& row : rows) {
    const allocator_stats& s = row.run->stats;
    scale = std::max({scale, s.reserved.peak, saturated_sum(s.allocated.current, row.cached, row.not_fragctl)});
  }
  const auto px = [scale](std::size_t n) { return bar_width * static_cast<double>(n) / static_cast<double>(scale); };
  const double height = pair_height * static_cast<double>(rows.size()) + 44;
  out.emit(
      "<svg class=\"rank-bars\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
      "font-size=\"11\" font-family=\"sans-serif\">\n",
      label_width + bar_width + 20, height);
  constexpr constant_markup red("#ef9a9a");
  constexpr constant_markup blue("#1f78b4");
  constexpr constant_markup orange("#ff9800");
  constexpr constant_markup grey("#b0bec5");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const rank_row& row = rows[i];
    const allocator_stats& s = row.run->stats;
    const double y = 6 + pair_height * static_cast<double>(i);
    const bool largest = reserved.imbalanced() && &row == reserved.largest;
    out.emit("<text x=\"0\" y=\"{:.1f}\"{}>{}</text>\n", y + 11,
             largest ? constant_markup(" font-weight=\"bold\" fill=\"#c62828\"") : constant_markup(""),
             rank_label(row, rows));
    out.emit("<text x=\"0\" y=\"{:.1f}\" fill=\"#607d8b\">peak / written</text>\n", y + 25);
    segment(out, label_width, y, px(s.reserved.peak), red, "peak reserved", s.reserved.peak);
    segment(out, label_width, y, px(s.requested.peak), blue, "peak requested", s.requested.peak);
    const double y2 = y + bar_height + 2;
    segment(out, label_width, y2, px(s.allocated.current), blue, "allocated", s.allocated.current);
    segment(out, label_width + px(s.allocated.current), y2, px(row.cached), orange, "cached (reserved - allocated)",
            row.cached);
    segment(out, label_width + px(s.allocated.current) + px(row.cached), y2, px(row.not_fragctl), grey,
            "not fragctl's (device used - reserved)", row.not_fragctl);
  }
  out.emit(
      "<text x=\"{0:.0f}\" y=\"{1:.1f}\" fill=\"#607d8b\">{2} across. Upper bar, at peak: reserved (red), "
      "requested (blue).</text>\n<text x=\"{0:.0f}\" y=\"{3:.1f}\" fill=\"#607d8b\">Lower bar, when the "
      "report was written: allocated (blue), cached (orange), not fragctl's (grey).</text>\n</svg>\n",
      label_width, height - 22, bytes(scale), height - 8);
}

// The split of the device memory that is not fragctl's, a row per rank,
// and its imbalance.
void split_table(markup& out, const std::vector<rank_row>& rows) {
  const rank_extremes outside = not_fragctl_extremes(rows);
  out.emit("<h3>Device memory that is not fragctl's, split</h3>\n");
  if (outside.largest != nullptr && outside.imbalanced()) {
    const auto [part, by] = widest_split_part(outside);
    markup widest;
    if (part != nullptr) widest.emit("; {} differs most: {} more", part->name, bytes(by));
    out.emit("<p class=\"headline imbalance\">{} holds {} more device memory that is not fragctl's than {}{}</p>\n",
             rank_label(*outside.largest, rows), bytes(outside.max - outside.min), rank_label(*outside.smallest, rows),
             widest);
  } else if (outside.largest != nullptr) {
    out.emit("<p class=\"headline\">device memory that is not fragctl's: largest {} ({}), smallest {} ({})</p>\n",
             bytes(outside.max), rank_label(*outside.largest, rows), bytes(outside.min),
             rank_label(*outside.smallest, rows));
  }
  out.emit("<table class=\"ranks split\"><tr><th>rank</th><th>not fragctl's</th>");
  for (const split_part& part : split_parts) out.emit("<th>{}</th>", part.name);
  out.emit("</tr>\n");
  for (const rank_row& row : rows) {
    out.emit("<tr><td>{}</td>", rank_label(row, rows));
    if (row.split == nullptr) {
      out.emit("<td colspan=\"{}\">not recorded</td></tr>\n", split_parts.size() + 1);
      continue;
    }
    out.emit("<td>{}</td>", bytes(row.not_fragctl));
    for (const split_part& part : split_parts) {
      const bool known = row.split->per_process || part.field != &device_memory_split::other_processes;
      out.emit("<td>{}</td>", known ? bytes(row.split->*part.field) : std::string("-"));
    }
    out.emit("</tr>\n");
  }
  out.emit(
      "</table>\n<p class=\"note\">context: this process's device memory when its first allocator on the device "
      "started, less fragctl's (NVML; without it, the device memory outside fragctl then); NCCL: what the "
      "communicators measured and reported; other processes: NVML (-: no per-process figures, so they are in "
      "other); other: the rest (library workspaces, lazily loaded kernels, another allocator's cache).</p>\n");
}

}  // namespace

void rank_section_html(markup& out, const std::vector<run_report>& runs) {
  const std::vector<rank_row> rows = rank_rows(runs);
  if (rows.empty()) return;
  const rank_extremes reserved = peak_reserved_extremes(rows);
  const rank_extremes requested = peak_requested_extremes(rows);
  out.emit("<section id=\"ranks\"><h2>Ranks side by side</h2>\n");
  if (reserved.imbalanced()) {
    out.emit(
        "<p class=\"headline imbalance\">{} holds {} more at peak than {} ({}); peak requested differs by {}</p>\n",
        rank_label(*reserved.largest, rows), bytes(reserved.max - reserved.min), rank_label(*reserved.smallest, rows),
        reserved.min == 0 ? std::string("which reserved nothing") : fmt::format("+{:.1f}%", 100.0 * reserved.excess()),
        requested.min == 0 ? bytes(requested.max) : fmt::format("{:.1f}%", 100.0 * requested.excess()));
  } else {
    out.emit("<p class=\"headline\">balanced: peak reserved within {:.0f}% across ranks</p>\n",
             100.0 * rank_imbalance_threshold);
  }
  for (const rank_row& row : rows) {
    for (const std::string& warning : inconsistencies(row.run->stats))
      out.emit("<p class=\"warning\">warning ({}): {}</p>\n", rank_label(row, rows), warning);
  }
  out.emit("<div class=\"figure\">\n");
  picture(out, rows, reserved);
  out.emit(
      "</div>\n<table class=\"ranks\"><tr><th>rank</th><th>host</th><th>reserved</th><th>peak reserved</th>"
      "<th>requested</th><th>peak requested</th><th>allocated</th><th>peak allocated</th><th>cached</th>"
      "<th>largest free</th><th>not fragctl's</th><th>at start</th><th>since</th><th>OOMs</th></tr>\n");
  for (const rank_row& row : rows) {
    const allocator_stats& s = row.run->stats;
    markup verdicts;
    for (std::size_t i = 0; i < row.verdicts.size(); ++i) {
      if (row.verdicts[i] > 0)
        verdicts.emit(" <span class=\"verdict {0}\">{0} {1}</span>", to_string(rank_verdicts[i]), row.verdicts[i]);
    }
    const auto device = [&row](std::size_t n) { return row.device_measured ? bytes(n) : std::string("-"); };
    out.emit(
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}{}</td></tr>\n",
        rank_label(row, rows), row.run->writer.host, bytes(s.reserved.current), bytes(s.reserved.peak),
        bytes(s.requested.current), bytes(s.requested.peak), bytes(s.allocated.current), bytes(s.allocated.peak),
        bytes(row.cached), bytes(s.pool.largest_free_block), device(row.not_fragctl), device(row.at_start),
        device(row.since_start), s.ooms, verdicts);
  }
  const bool split = std::any_of(rows.begin(), rows.end(), [](const rank_row& r) { return r.split != nullptr; });
  out.emit(
      "</table>\n<p class=\"note\">not fragctl's: device memory in use less fragctl's reserved bytes when the "
      "report was written; at start: what was held outside fragctl when its allocator was built (the CUDA or HIP "
      "context, libraries loaded before it, other processes); since: taken since (NCCL communicators and "
      "buffers, library workspaces, other processes). {}</p>\n",
      split ? constant_markup("The split below tells them apart.")
            : constant_markup("Telling those apart needs NVML and NCCL figures the reports do not carry."));
  if (split) split_table(out, rows);
  out.emit("</section>\n");
}

}  // namespace fragctl::report_detail
