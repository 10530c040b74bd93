// The HTML report: one self-contained page (inline CSS, JavaScript and SVG;
// nothing is fetched), readable without scripts. The script adds a tooltip
// that follows the pointer over the memory maps and marks the page ready
// (<body data-ready="1">) once it ran, which the browser test checks. Every
// string is written through markup::emit, so escaped (report/markup.hpp).
#include <algorithm>
#include <iterator>

#include "fmt/format.h"
#include "fragctl/run_report.hpp"
#include "report/hangs.hpp"
#include "report/markup.hpp"
#include "report/ranks.hpp"
#include "report/render_util.hpp"
#include "report/svg.hpp"

namespace fragctl {

namespace {

using report_detail::bytes;
using report_detail::constant_markup;
using report_detail::markup;

constexpr constant_markup style{R"css(
:root { --ink: #263238; --muted: #607d8b; --line: #cfd8dc; --bg: #fafafa; }
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink); background: var(--bg);
       margin: 0 auto; padding: 16px 24px 48px; max-width: 1120px; }
h1 { font-size: 22px; margin: 8px 0 4px; }
h2 { font-size: 18px; margin: 32px 0 4px; border-top: 2px solid var(--line); padding-top: 16px; }
h3 { font-size: 15px; margin: 20px 0 6px; }
p.meta, p.note { color: var(--muted); margin: 2px 0 8px; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 10px 0; }
.card { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px; min-width: 120px; }
.card .value { font-size: 18px; font-weight: 600; }
.card .label { font-size: 12px; color: var(--muted); }
.card.bad .value { color: #c62828; }
table { border-collapse: collapse; background: #fff; font-size: 13px; margin: 6px 0; }
th, td { border: 1px solid var(--line); padding: 3px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
td.delta { color: var(--muted); }
.headline { font-weight: 600; }
p.warning { color: #c62828; font-weight: 600; margin: 4px 0; }
.figure { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 6px; overflow-x: auto; }
.bars td.bar { text-align: left; width: 60%; }
.bars .fill { background: #1f78b4; height: 10px; border-radius: 2px; }
.oom-list li { margin: 4px 0; font-family: ui-monospace, monospace; font-size: 12px; }
.verdict { display: inline-block; padding: 0 6px; border-radius: 8px; color: #fff; font-family: sans-serif; }
.verdict.fragmentation { background: #ef6c00; } .verdict.capacity { background: #6a1b9a; }
.verdict.other_process { background: #00838f; } .verdict.declined { background: #546e7a; }
#tooltip { position: fixed; pointer-events: none; background: #263238; color: #fff; font-size: 12px; padding: 6px 8px;
           border-radius: 4px; display: none; white-space: pre; z-index: 10; }
svg .block:hover { stroke: #000; stroke-width: 1; }
details > summary { cursor: pointer; color: var(--muted); margin: 6px 0; }
)css"};

constexpr constant_markup script{R"js(
(function () {
  function human(n) {
    n = Number(n);
    var units = ["B", "KiB", "MiB", "GiB", "TiB"], u = 0;
    while (n >= 1024 && u < units.length - 1) { n /= 1024; u++; }
    return u === 0 ? n + " B" : n.toFixed(2) + " " + units[u];
  }
  var tip = document.getElementById("tooltip");
  function describe(el) {
    var d = el.dataset, seg = el.closest(".segment-group"), lines = [];
    if (el.classList.contains("cluster")) {
      lines.push(d.blocks + " " + (el.classList.contains("live") ? "live" : el.classList.contains("free") ? "free" : "pending") +
                 " blocks, " + human(d.size));
    } else {
      var use = el.classList.contains("live") ? "live" : el.classList.contains("free") ? "free" : "pending";
      lines.push(use + " block " + d.address);
      lines.push("size " + human(d.size) + (use === "live" ? "  (requested " + human(d.requested) + ")" : ""));
      lines.push("stream " + d.stream);
    }
    if (seg) lines.push("segment " + seg.dataset.address + ", " + human(seg.dataset.size) +
                        (seg.dataset.pool ? ", " + seg.dataset.pool + " pool" : ""));
    return lines.join("\n");
  }
  document.querySelectorAll("svg.memory-map .block").forEach(function (el) {
    el.addEventListener("mousemove", function (ev) {
      tip.textContent = describe(el);
      tip.style.display = "block";
      tip.style.left = (ev.clientX + 14) + "px";
      tip.style.top = (ev.clientY + 14) + "px";
    });
    el.addEventListener("mouseleave", function () { tip.style.display = "none"; });
  });
  document.querySelectorAll("[data-bytes]").forEach(function (el) { el.title = el.dataset.bytes + " bytes"; });
  var maps = document.querySelectorAll("svg.memory-map"), blocks = document.querySelectorAll("svg.memory-map .block");
  document.body.dataset.maps = String(maps.length);
  document.body.dataset.blocks = String(blocks.length);
  document.body.dataset.ready = "1";
})();
)js"};

void card(markup& out, std::string_view label, const std::string& value, bool bad = false, std::size_t raw_bytes = 0) {
  markup data;
  if (raw_bytes > 0) data.emit(" data-bytes=\"{}\"", raw_bytes);
  out.emit("<div class=\"card{}\"{}><div class=\"value\">{}</div><div class=\"label\">{}</div></div>\n",
           bad ? constant_markup(" bad") : constant_markup(""), data, value, label);
}

void comparison(markup& out, const std::vector<run_report>& runs) {
  out.emit("<section id=\"comparison\"><h2>Comparison</h2>\n");
  for (std::size_t i = 1; i < runs.size(); ++i) {
    out.emit("<p class=\"headline\">{}</p>\n", report_detail::comparison_headline(runs[0], runs[i]));
  }
  out.emit("<table class=\"comparison\"><tr><th></th>");
  for (std::size_t i = 0; i < runs.size(); ++i) {
    out.emit("<th>{}</th>", runs[i].name);
    if (i > 0) out.emit("<th>vs {}</th>", runs[0].name);
  }
  out.emit("</tr>\n");
  for (const report_detail::comparison_row& row : report_detail::comparison_rows(runs)) {
    out.emit("<tr><td>{}</td>", row.label);
    for (std::size_t i = 0; i < runs.size(); ++i) {
      out.emit("<td>{}</td>", row.values[i]);
      if (i > 0) out.emit("<td class=\"delta\">{}</td>", row.deltas[i - 1]);
    }
    out.emit("</tr>\n");
  }
  out.emit("</table></section>\n");
}

void histogram(markup& out, const allocator_stats& s) {
  std::uint64_t most = 0;
  for (const std::uint64_t n : s.size_histogram) most = std::max(most, n);
  out.emit("<h3>Request sizes</h3>\n");
  if (most == 0) {
    out.emit("<p class=\"note\">no allocations</p>\n");
    return;
  }
  out.emit("<table class=\"bars\"><tr><th>size</th><th>allocations</th><th></th></tr>\n");
  for (std::size_t i = 0; i < size_histogram_buckets; ++i) {
    if (s.size_histogram[i] == 0) continue;
    out.emit(
        "<tr><td>{} - {}</td><td>{}</td><td class=\"bar\"><div class=\"fill\" style=\"width:{:.1f}%\">"
        "</div></td></tr>\n",
        report_detail::pow2_label(i), report_detail::pow2_label(i + 1), s.size_histogram[i],
        100.0 * static_cast<double>(s.size_histogram[i]) / static_cast<double>(most));
  }
  out.emit("</table>\n");
}

void wasted(markup& out, const memory_snapshot& m) {
  const auto ranked = report_detail::rank_wasted(m);
  out.emit("<h3>Top wasted regions</h3>\n");
  for (const std::string& warning : report_detail::map_inconsistencies(m))
    out.emit("<p class=\"warning\">warning: {}</p>\n", warning);
  if (ranked.empty()) {
    out.emit("<p class=\"note\">no segment holds free or pending bytes</p>\n");
    return;
  }
  out.emit(
      "<table class=\"wasted\"><tr><th>segment</th><th>size</th><th>pool</th><th>stream</th><th>live</th>"
      "<th>free</th><th>pending</th><th>holes</th><th>largest hole</th></tr>\n");
  for (std::size_t i = 0; i < ranked.size() && i < 10; ++i) {
    const auto& w = ranked[i];
    out.emit(
        "<tr><td>{:#x}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{}</td></tr>\n",
        w.segment->address, bytes(w.segment->size), w.segment->pool, report_detail::stream_name(w.segment->stream),
        bytes(w.live), bytes(w.free), bytes(w.pending), w.free_blocks, bytes(w.largest_free));
  }
  out.emit("</table>\n");
}

void ooms(markup& out, const allocator_stats& s) {
  if (s.ooms == 0) return;
  out.emit("<h3>OOM events ({}{})</h3>\n<ul class=\"oom-list\">\n", s.ooms,
           s.oom_events.size() < s.ooms ? fmt::format(", the last {} kept", s.oom_events.size()) : "");
  for (const oom_event& e : s.oom_events) {
    out.emit("<li><span class=\"verdict {}\">{}</span> allocation #{}: {}</li>\n", to_string(e.verdict),
             to_string(e.verdict), e.sequence, describe(e, s.allocator));
  }
  out.emit("</ul>\n");
}

void backend_calls(markup& out, const allocator_stats& s) {
  out.emit("<h3>Backend calls ({} memory calls, {} in all)</h3>\n<table class=\"calls\"><tr>",
           s.backend_calls.memory_calls(), s.backend_calls.total_calls());
  markup values;
  for (std::size_t i = 0; i < s.backend_calls.calls.size(); ++i) {
    if (s.backend_calls.calls[i] == 0) continue;
    out.emit("<th>{}</th>", to_string(static_cast<backend_call>(i)));
    values.emit("<td>{}</td>", s.backend_calls.calls[i]);
  }
  out.emit("</tr><tr>{}</tr></table>\n", values);
}

void run_section(markup& out, const run_report& r, std::size_t index) {
  const allocator_stats& s = r.stats;
  out.emit("<section class=\"run\" id=\"run-{}\"><h2>{}</h2>\n", index, r.name);
  markup replayed;
  if (r.kind == "replay") {
    replayed.emit(" &middot; replayed: {} operations, median {:.0f} ns", r.replay.operations, r.replay.median_ns);
  }
  out.emit("<p class=\"meta\">{} &middot; allocator <b>{}</b> on {} device {}{}</p>\n", r.source, s.allocator,
           s.backend, s.device, replayed);
  for (const std::string& warning : report_detail::inconsistencies(s))
    out.emit("<p class=\"warning\">warning: {}</p>\n", warning);
  out.emit("<div class=\"cards\">\n");
  card(out, "peak reserved", bytes(s.reserved.peak), false, s.reserved.peak);
  card(out, "peak requested", bytes(s.requested.peak), false, s.requested.peak);
  card(out, "reserved / requested", fmt::format("{:.3f}", s.reserved_over_requested()), s.reserved_over_requested() > 1.2);
  card(out, "fragmentation", fmt::format("{:.1f}%", 100.0 * s.fragmentation()), s.fragmentation() > 0.2);
  card(out, "external fragmentation", fmt::format("{:.1f}%", 100.0 * s.external_fragmentation()));
  card(out, "largest free block", bytes(s.pool.largest_free_block), false, s.pool.largest_free_block);
  card(out, "reserved now", bytes(s.reserved.current), false, s.reserved.current);
  card(out, "OOMs", fmt::format("{}", s.ooms), s.ooms > 0);
  out.emit("</div>\n");

  if (r.kind == "replay" && !r.time.points.empty()) {
    out.emit("<h3>Timeline: requested vs reserved</h3>\n<div class=\"figure\">\n{}</div>\n",
             report_detail::timeline_svg(r.time, 1060, 300));
  }
  const labelled_map* primary = report_detail::primary_map(r);
  if (primary == nullptr) {
    out.emit("<h3>Memory map</h3>\n<p class=\"note\">{}</p>\n", report_detail::no_map_reason(r));
  } else {
    std::size_t map_index = 0;
    for (const labelled_map& m : r.maps) {
      if (!m.map.available) continue;
      const std::string id = fmt::format("r{}m{}", index, map_index++);
      const map_options options{960, 14, 400};
      if (&m == primary) {
        out.emit("<h3>Memory map {}</h3>\n<div class=\"figure\">\n{}</div>\n", m.label,
                 report_detail::map_svg(m, options, false, id));
      } else {
        out.emit("<details><summary>Memory map {}</summary>\n<div class=\"figure\">\n{}</div></details>\n", m.label,
                 report_detail::map_svg(m, options, false, id));
        for (const std::string& warning : report_detail::map_inconsistencies(m.map))
          out.emit("<p class=\"warning\">warning (memory map {}): {}</p>\n", m.label, warning);
      }
    }
    wasted(out, primary->map);
  }
  histogram(out, s);
  ooms(out, s);
  report_detail::hangs_html(out, r.hangs);
  backend_calls(out, s);
  out.emit("</section>\n");
}

}  // namespace

std::string render_html(const std::vector<run_report>& runs) {
  markup out;
  std::string title = "fragctl report";
  if (runs.size() == 1) title += ": " + runs.front().name;
  out.emit(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>{}</title>\n"
      "<style>{}</style>\n</head>\n<body>\n<h1>{}</h1>\n",
      title, style, title);
  out.emit(
      "<p class=\"meta\">Where the memory went: bytes held from the device (reserved) against bytes the program "
      "had live (requested). Hover a block of a memory map for its address, size and stream.</p>\n");
  if (runs_are_ranks(runs)) {
    report_detail::rank_section_html(out, runs);
  } else if (runs.size() > 1) {
    comparison(out, runs);
  }
  for (std::size_t i = 0; i < runs.size(); ++i) run_section(out, runs[i], i);
  out.emit("<div id=\"tooltip\"></div>\n<script>{}</script>\n</body>\n</html>\n", script);
  return std::move(out).str();
}

}  // namespace fragctl
