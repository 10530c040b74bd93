// The terminal renderers: one run's summary and the side-by-side comparison.
// Every string that came from outside (names, paths, pools, advice) is
// shown through util::printable, so a report cannot move the cursor, change
// colours or add lines on the terminal it is printed on.
#include <algorithm>
#include <iterator>

#include "fmt/format.h"
#include "fragctl/run_report.hpp"
#include "report/hangs.hpp"
#include "report/render_util.hpp"
#include "util/strings.hpp"

namespace fragctl {

namespace {

using report_detail::bytes;
using util::printable;

void line(std::string& out, std::string_view text = {}) {
  out.append(text);
  out.push_back('\n');
}

void section(std::string& out, std::string_view title) {
  out.push_back('\n');
  line(out, title);
}

void memory_section(std::string& out, const allocator_stats& s) {
  section(out, "Memory");
  out += fmt::format("  {:<24} {:>14} {:>14}\n", "", "current", "peak");
  out += fmt::format("  {:<24} {:>14} {:>14}\n", "requested", bytes(s.requested.current), bytes(s.requested.peak));
  out += fmt::format("  {:<24} {:>14} {:>14}\n", "allocated (rounded)", bytes(s.allocated.current),
                     bytes(s.allocated.peak));
  out += fmt::format("  {:<24} {:>14} {:>14}\n", "reserved", bytes(s.reserved.current), bytes(s.reserved.peak));
  out += fmt::format("  {:<24} {:>14.3f}   (1.000 is ideal)\n", "reserved/requested", s.reserved_over_requested());
  out += fmt::format("  {:<24} {:>13.1f}%   of peak reserved never live at once\n", "fragmentation",
                     100.0 * s.fragmentation());
  out += fmt::format("  {:<24} {:>13.1f}%   1 - largest free block / free in cache\n", "external fragmentation",
                     100.0 * s.external_fragmentation());
  out += fmt::format("  {:<24} {:>14}   of {} free in cache, {} segment{}\n", "largest free block",
                     bytes(s.pool.largest_free_block), bytes(s.pool.cached_free), s.pool.segments,
                     s.pool.segments == 1 ? "" : "s");
  out += fmt::format("  {:<24} {:>14}   lost to rounding now\n", "internal waste", bytes(s.internal_waste()));
  out += fmt::format("  {:<24} {:>14}   allocations {}, frees {}, retries {}\n", "calls", "", s.allocations,
                     s.frees, s.retries);
  if (s.misuse_not_owned + s.misuse_size_mismatch > 0) {
    out += fmt::format("  {:<24} {:>14}   foreign or double frees {}, wrong sizes {}\n", "misuse", "",
                       s.misuse_not_owned, s.misuse_size_mismatch);
  }
}

void replay_section(std::string& out, const run_report& r) {
  if (r.kind != "replay") return;
  const replay_result& p = r.replay;
  section(out, "Replay");
  out += fmt::format("  {} timed operations, median {:.0f} ns, p99 {:.0f} ns; OOMs {}, unknown frees {}, "
                     "lost frees {}\n",
                     p.operations, p.median_ns, p.p99_ns, p.ooms, p.unknown_frees, p.lost_frees);
}

void wasted_section(std::string& out, const run_report& r, std::size_t top) {
  const labelled_map* m = report_detail::primary_map(r);
  if (m == nullptr) {
    section(out, "Top wasted regions");
    line(out, "  " + printable(report_detail::no_map_reason(r)));
    return;
  }
  section(out, fmt::format("Top wasted regions (memory map {})", printable(m->label)));
  for (const std::string& warning : report_detail::map_inconsistencies(m->map)) line(out, "  warning: " + warning);
  const std::vector<report_detail::segment_waste> ranked = report_detail::rank_wasted(m->map);
  out += fmt::format("  {} segment{}, {} reserved: {} live, {} free, {} pending\n", m->map.segments.size(),
                     m->map.segments.size() == 1 ? "" : "s",
                     bytes(m->map.reserved_bytes()), bytes(m->map.bytes(block_use::live)),
                     bytes(m->map.bytes(block_use::free)), bytes(m->map.bytes(block_use::pending)));
  if (ranked.empty()) {
    line(out, "  no segment holds free or pending bytes");
    return;
  }
  out += fmt::format("  {:>3}  {:<18} {:>11} {:<6} {:<14} {:>11} {:>11} {:>11} {:>6} {:>12}\n", "#", "segment",
                     "size", "pool", "stream", "live", "free", "pending", "holes", "largest hole");
  for (std::size_t i = 0; i < ranked.size() && i < top; ++i) {
    const auto& w = ranked[i];
    out += fmt::format("  {:>3}  {:<18} {:>11} {:<6} {:<14} {:>11} {:>11} {:>11} {:>6} {:>12}\n", i + 1,
                       fmt::format("{:#x}", w.segment->address), bytes(w.segment->size), printable(w.segment->pool),
                       report_detail::stream_name(w.segment->stream), bytes(w.live), bytes(w.free), bytes(w.pending),
                       w.free_blocks, bytes(w.largest_free));
  }
  if (ranked.size() > top) out += fmt::format("  ... {} more segments with free bytes\n", ranked.size() - top);
}

void histogram_section(std::string& out, const allocator_stats& s, std::size_t width) {
  section(out, "Request sizes (allocations per power-of-two bucket)");
  std::size_t first = size_histogram_buckets;
  std::size_t last = 0;
  std::uint64_t most = 0;
  for (std::size_t i = 0; i < size_histogram_buckets; ++i) {
    if (s.size_histogram[i] == 0) continue;
    first = std::min(first, i);
    last = i;
    most = std::max(most, s.size_histogram[i]);
  }
  if (most == 0) {
    line(out, "  no allocations");
    return;
  }
  for (std::size_t i = first; i <= last; ++i) {
    const std::uint64_t n = s.size_histogram[i];
    // Bars in eighths of a character, so that small counts still show.
    const std::size_t eighths =
        n == 0 ? 0 : std::max<std::size_t>(1, static_cast<std::size_t>(static_cast<double>(n) / static_cast<double>(most) *
                                                                          static_cast<double>(width * 8)));
    std::string bar;
    for (std::size_t k = 0; k < eighths / 8; ++k) bar += "\u2588";
    static constexpr const char* partial[] = {"", "\u258f", "\u258e", "\u258d", "\u258c", "\u258b", "\u258a", "\u2589"};
    bar += partial[eighths % 8];
    const std::size_t cells = eighths / 8 + (eighths % 8 != 0 ? 1 : 0);
    out += fmt::format("  {:>8} - {:<8} |{}{} {}\n", report_detail::pow2_label(i), report_detail::pow2_label(i + 1),
                       bar, std::string(width - std::min(width, cells), ' '), n);
  }
}

void backend_section(std::string& out, const allocator_stats& s) {
  section(out, fmt::format("Backend calls ({} memory calls, {} in all)", s.backend_calls.memory_calls(),
                           s.backend_calls.total_calls()));
  std::string row;
  for (std::size_t i = 0; i < s.backend_calls.calls.size(); ++i) {
    const std::uint64_t n = s.backend_calls.calls[i];
    if (n == 0) continue;
    const std::string cell = fmt::format("{} {}", to_string(static_cast<backend_call>(i)), n);
    if (!row.empty() && row.size() + cell.size() + 2 > 76) {
      line(out, "  " + row);
      row.clear();
    }
    row += row.empty() ? cell : ", " + cell;
  }
  line(out, "  " + (row.empty() ? std::string("none") : row));
  if (s.backend_calls.failed_allocations > 0) {
    out += fmt::format("  {} backend allocations ran out of memory\n", s.backend_calls.failed_allocations);
  }
}

void step_plan_section(std::string& out, const allocator_stats& s) {
  const step_plan_state& p = s.pool.plan;
  if (p.steps_detected == 0) return;
  section(out, "Steady-state plan");
  out += fmt::format("  {:<24} {:>14}   repeating steps found {}, steps served from a plan {}, plans left {}\n",
                     "steps", "", p.steps_detected, p.planned_steps, p.dropped);
  out += fmt::format("  {:<24} {:>14}   {} of them unplanned\n", "bytes allocated",
                     bytes(p.planned_bytes + p.unplanned_bytes), bytes(p.unplanned_bytes));
  if (p.step_allocations != 0) {
    out += fmt::format("  {:<24} {:>14}   held; {} allocations per step, {} allocated per step from it\n",
                       "current plan", bytes(p.region_bytes), p.step_allocations, bytes(p.step_planned_bytes));
  }
  const double per_step =
      p.planned_steps != 0 ? static_cast<double>(p.planned_step_driver_calls) / static_cast<double>(p.planned_steps)
                           : 0.0;
  out += fmt::format("  {:<24} {:>14.1f}   per planned step (latest {})\n", "driver calls", per_step,
                     p.last_step_driver_calls);
  if (p.starts_refused_calls != 0 || p.starts_refused_memory != 0) {
    out += fmt::format("  {:<24} {:>14}   {} for their calls (best fit made fewer in the step before and in a "
                       "row at its shape), {} for the memory (past the high-water mark)\n",
                       "plan starts refused", "", p.starts_refused_calls, p.starts_refused_memory);
  }
}

void oom_section(std::string& out, const allocator_stats& s) {
  if (s.ooms == 0) {
    section(out, "OOM events: none");
    return;
  }
  section(out, fmt::format("OOM events: {}{}", s.ooms,
                           s.oom_events.size() < s.ooms ? fmt::format(" (the last {} kept)", s.oom_events.size()) : ""));
  for (const oom_event& e : s.oom_events) {
    out += fmt::format("  allocation #{} [{}] {}\n", e.sequence, to_string(e.verdict),
                       printable(describe(e, s.allocator)));
  }
}

}  // namespace

std::string render_text(const run_report& r, const text_options& options) {
  const allocator_stats& s = r.stats;
  std::string out;
  line(out, fmt::format("fragctl report: {}", printable(r.name)));
  if (r.kind == "replay") {
    line(out, fmt::format("  trace {} replayed through {} on {} (device {})", printable(r.replay.trace),
                          printable(s.allocator), printable(s.backend), s.device));
  } else {
    line(out, fmt::format("  {}: allocator {} on {} device {}", printable(r.source), printable(s.allocator),
                          printable(s.backend), s.device));
  }
  for (const std::string& warning : report_detail::inconsistencies(s)) line(out, "  warning: " + warning);
  memory_section(out, s);
  replay_section(out, r);
  wasted_section(out, r, options.top_regions);
  histogram_section(out, s, options.bar_width);
  backend_section(out, s);
  step_plan_section(out, s);
  oom_section(out, s);
  report_detail::hangs_text(out, r.hangs);
  return out;
}

std::string render_comparison(const std::vector<run_report>& runs) {
  if (runs.empty()) return {};
  const std::vector<report_detail::comparison_row> rows = report_detail::comparison_rows(runs);
  std::size_t label_width = 6;
  for (const auto& row : rows) label_width = std::max(label_width, row.label.size());
  std::vector<std::string> names;
  for (const run_report& r : runs) names.push_back(printable(r.name));
  std::vector<std::size_t> widths;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    std::size_t w = names[i].size();
    for (const auto& row : rows) {
      w = std::max(w, row.values[i].size());
      if (i > 0) w = std::max(w, row.deltas[i - 1].size() + 2);
    }
    widths.push_back(w);
  }
  std::string out;
  line(out, "fragctl report: comparison");
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const char letter = static_cast<char>('A' + std::min<std::size_t>(i, 25));
    out += fmt::format("  {} = {} ({}, {} on {})\n", letter, names[i], printable(runs[i].source),
                       printable(runs[i].stats.allocator), printable(runs[i].stats.backend));
    for (const std::string& warning : report_detail::inconsistencies(runs[i].stats))
      out += fmt::format("      warning ({}): {}\n", letter, warning);
  }
  out.push_back('\n');
  std::string head = fmt::format("  {:<{}}", "", label_width);
  for (std::size_t i = 0; i < runs.size(); ++i)
    head += fmt::format("  {:>{}}", static_cast<char>('A' + std::min<std::size_t>(i, 25)), widths[i]);
  line(out, head);
  for (const auto& row : rows) {
    std::string text = fmt::format("  {:<{}}", row.label, label_width);
    for (std::size_t i = 0; i < runs.size(); ++i) text += fmt::format("  {:>{}}", row.values[i], widths[i]);
    line(out, text);
    if (runs.size() > 1) {
      std::string deltas = fmt::format("  {:<{}}", "", label_width);
      deltas += fmt::format("  {:>{}}", "", widths[0]);
      for (std::size_t i = 1; i < runs.size(); ++i)
        deltas += fmt::format("  {:>{}}", "(" + row.deltas[i - 1] + ")", widths[i]);
      if (row.label == "peak reserved" || row.label == "reserved/requested") line(out, deltas);
    }
  }
  out.push_back('\n');
  for (std::size_t i = 1; i < runs.size(); ++i)
    line(out, printable(report_detail::comparison_headline(runs[0], runs[i])));
  return out;
}

}  // namespace fragctl
