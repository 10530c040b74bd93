// The SVG pictures of a report, as elements the HTML page inlines and
// render_map_svg wraps into a document; written through markup::emit, so
// every string in them is escaped (report/markup.hpp).
#pragma once

#include <string>
#include <string_view>

#include "fragctl/run_report.hpp"
#include "report/markup.hpp"

namespace fragctl::report_detail {

/// The memory map as one <svg> element (with xmlns when `standalone`); `id`
/// prefixes the ids it defines, unique within a page.
/// Blocks are <rect class="block live|free|pending"> with data-address,
/// data-size, data-requested, data-stream attributes and a <title>; runs of
/// blocks too thin to see are drawn as one <rect class="block cluster ...">
/// with data-blocks. The legend is a <g class="legend"> of <g class="legend-item">.
[[nodiscard]] markup map_svg(const labelled_map& m, const map_options& options, bool standalone, std::string_view id);

/// The timeline as one <svg class="timeline"> element: <path class="line
/// requested"> and <path class="line reserved">, the gap between them shaded
/// (<path class="gap">), and one <g class="oom"> per OOM (at most 200 drawn;
/// data-count on the svg says how many there were).
[[nodiscard]] markup timeline_svg(const timeline& t, double width, double height);

}  // namespace fragctl::report_detail
