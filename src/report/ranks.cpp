// One job's ranks side by side (fragctl/run_report.hpp, render_rank_table
// and render_rank_json; docs/reports.md, "Every rank side by side"): the
// rows, the imbalance between ranks, and the device memory that is not
// fragctl's, as text and as JSON.
#include "report/ranks.hpp"

#include <algorithm>
#include <set>
#include <utility>

#include "core/json_io.hpp"
#include "core/stats_json.hpp"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "report/hangs.hpp"
#include "report/render_util.hpp"
#include "util/strings.hpp"

namespace fragctl {

namespace report_detail {

namespace {

std::size_t minus(std::size_t a, std::size_t b) noexcept { return a > b ? a - b : 0; }

template <class Figure>
rank_extremes extremes_of(const std::vector<rank_row>& rows, Figure figure, bool measured_only = false) {
  rank_extremes e;
  for (const rank_row& row : rows) {
    if (measured_only && !row.device_measured) continue;
    const std::size_t v = figure(row);
    if (e.largest == nullptr || v > e.max) {
      e.largest = &row;
      e.max = v;
    }
    if (e.smallest == nullptr || v < e.min) {
      e.smallest = &row;
      e.min = v;
    }
  }
  return e;
}

}  // namespace

std::vector<rank_row> rank_rows(const std::vector<run_report>& runs) {
  std::vector<rank_row> rows;
  for (const run_report& r : runs) {
    const allocator_stats& s = r.stats;
    rank_row row;
    row.run = &r;
    row.rank = r.writer.rank.value_or(-1);
    row.device = s.device;
    row.cached = minus(s.reserved.current, s.allocated.current);
    if (s.device_memory.measured) {
      row.device_measured = true;
      row.device_used = minus(s.device_memory.total, s.device_memory.free);
      row.not_fragctl = minus(row.device_used, s.reserved.current);
      row.at_start = std::min(row.not_fragctl, s.device_memory.outside_at_start);
      row.since_start = row.not_fragctl - row.at_start;
      if (s.device_memory.split) row.split = &*s.device_memory.split;
    }
    for (const oom_event& e : s.oom_events) {
      for (std::size_t i = 0; i < rank_verdicts.size(); ++i)
        if (e.verdict == rank_verdicts[i]) ++row.verdicts[i];
    }
    rows.push_back(row);
  }
  std::stable_sort(rows.begin(), rows.end(), [](const rank_row& a, const rank_row& b) {
    return std::pair(a.rank, a.device) < std::pair(b.rank, b.device);
  });
  return rows;
}

double rank_extremes::excess() const noexcept {
  return min == 0 ? 0.0 : static_cast<double>(max - min) / static_cast<double>(min);
}

bool rank_extremes::imbalanced() const noexcept { return min == 0 ? max > 0 : excess() > rank_imbalance_threshold; }

rank_extremes peak_reserved_extremes(const std::vector<rank_row>& rows) {
  return extremes_of(rows, [](const rank_row& r) { return r.run->stats.reserved.peak; });
}

rank_extremes peak_requested_extremes(const std::vector<rank_row>& rows) {
  return extremes_of(rows, [](const rank_row& r) { return r.run->stats.requested.peak; });
}

rank_extremes not_fragctl_extremes(const std::vector<rank_row>& rows) {
  const auto not_fragctl = [](const rank_row& r) { return r.not_fragctl; };
  return extremes_of(rows, not_fragctl, true);
}

std::pair<const split_part*, std::size_t> widest_split_part(const rank_extremes& e) {
  if (e.largest == nullptr || e.largest->split == nullptr || e.smallest->split == nullptr) return {nullptr, 0};
  const split_part* widest = nullptr;
  std::size_t by = 0;
  for (const split_part& part : split_parts) {
    const std::size_t a = e.largest->split->*part.field;
    const std::size_t b = e.smallest->split->*part.field;
    if (a > b && a - b > by) {
      widest = &part;
      by = a - b;
    }
  }
  return {widest, by};
}

std::string rank_label(const rank_row& row, const std::vector<rank_row>& rows) {
  const bool several_devices = std::any_of(
      rows.begin(), rows.end(), [&](const rank_row& other) { return &other != &row && other.rank == row.rank; });
  return several_devices ? fmt::format("rank {} device {}", row.rank, row.device) : fmt::format("rank {}", row.rank);
}

}  // namespace report_detail

namespace {

using report_detail::bytes;
using report_detail::rank_extremes;
using report_detail::rank_row;
using util::printable;

std::string oom_cell(const rank_row& row) {
  const allocator_stats& s = row.run->stats;
  if (s.ooms == 0) return "0";
  std::string verdicts;
  for (std::size_t i = 0; i < row.verdicts.size(); ++i) {
    if (row.verdicts[i] == 0) continue;
    verdicts += fmt::format("{}{} {}", verdicts.empty() ? "" : ", ", to_string(report_detail::rank_verdicts[i]),
                            row.verdicts[i]);
  }
  return fmt::format("{}: {}{}", s.ooms, verdicts,
                     s.oom_events.size() < s.ooms ? fmt::format(" (last {})", s.oom_events.size()) : "");
}

std::string job_line(const std::vector<rank_row>& rows) {
  std::set<std::int64_t> ranks;
  std::set<std::string> hosts;
  std::set<std::string> launchers;
  std::optional<std::int64_t> world;
  for (const rank_row& row : rows) {
    ranks.insert(row.rank);
    if (!row.run->writer.host.empty()) hosts.insert(row.run->writer.host);
    if (!row.run->writer.launcher.empty()) launchers.insert(row.run->writer.launcher);
    if (row.run->writer.world_size) world = row.run->writer.world_size;
  }
  std::string details;
  for (const std::string& l : launchers) details += printable(l) + ", ";
  if (world) details += fmt::format("world size {}, ", *world);
  details += fmt::format("{} host{}", hosts.size(), hosts.size() == 1 ? "" : "s");
  std::string missing;
  if (world && static_cast<std::int64_t>(ranks.size()) < *world) {
    std::vector<std::int64_t> absent;
    for (std::int64_t r = 0; r < *world && absent.size() < 16; ++r)
      if (!ranks.contains(r)) absent.push_back(r);
    missing = fmt::format("\n  no report of rank{} {}{}", absent.size() == 1 ? "" : "s", fmt::join(absent, ", "),
                          static_cast<std::int64_t>(ranks.size() + absent.size()) < *world ? ", ..." : "");
  }
  return fmt::format("fragctl report: {} ranks side by side ({}){}", ranks.size(), details, missing);
}

// The device memory that is not fragctl's, largest against smallest, and
// the part of its split that differs most.
void not_fragctl_imbalance_lines(std::string& out, const std::vector<rank_row>& rows) {
  const rank_extremes e = report_detail::not_fragctl_extremes(rows);
  if (e.largest == nullptr) return;
  out += fmt::format("  {:<15} largest {} ({}), smallest {} ({}): {} more{}\n", "not fragctl's", bytes(e.max),
                     report_detail::rank_label(*e.largest, rows), bytes(e.min),
                     report_detail::rank_label(*e.smallest, rows), bytes(e.max - e.min),
                     e.min == 0 ? "" : fmt::format(" (+{:.1f}%)", 100.0 * e.excess()));
  if (!e.imbalanced()) return;
  const auto [part, by] = report_detail::widest_split_part(e);
  std::string line = fmt::format("  ! {} holds {} more device memory that is not fragctl's than {}",
                                 report_detail::rank_label(*e.largest, rows), bytes(e.max - e.min),
                                 report_detail::rank_label(*e.smallest, rows));
  if (part != nullptr) line += fmt::format("; {} differs most: {} more", part->name, bytes(by));
  out += line;
  out += '\n';
}

void imbalance_lines(std::string& out, const std::vector<rank_row>& rows) {
  const rank_extremes reserved = report_detail::peak_reserved_extremes(rows);
  const rank_extremes requested = report_detail::peak_requested_extremes(rows);
  out += "\nImbalance\n";
  for (const auto& [what, e] : {std::pair{"peak reserved", reserved}, std::pair{"peak requested", requested}}) {
    out += fmt::format("  {:<15} largest {} ({}), smallest {} ({}){}\n", what, bytes(e.max),
                       report_detail::rank_label(*e.largest, rows), bytes(e.min),
                       report_detail::rank_label(*e.smallest, rows),
                       e.min == 0 ? "" : fmt::format(": {:.1f}% more", 100.0 * e.excess()));
  }
  if (reserved.imbalanced()) {
    const bool live_too = requested.imbalanced();
    out += fmt::format(
        "  ! {} holds {} more at peak than {} ({}), over the {:.0f}% a balanced job stays within; {}\n",
        report_detail::rank_label(*reserved.largest, rows), bytes(reserved.max - reserved.min),
        report_detail::rank_label(*reserved.smallest, rows),
        reserved.min == 0 ? std::string("which reserved nothing") : fmt::format("+{:.1f}%", 100.0 * reserved.excess()),
        100.0 * rank_imbalance_threshold,
        live_too ? "its live bytes differ as much (the work is not split evenly)"
                 : "the live bytes are balanced, so the difference is the allocator's (cache, fragmentation)");
  } else {
    out += fmt::format("  balanced: peak reserved within {:.0f}% across ranks\n", 100.0 * rank_imbalance_threshold);
  }
  not_fragctl_imbalance_lines(out, rows);
}

// The split of each rank's device memory that is not fragctl's
// (fragctl/device_memory.hpp), one row per rank.
void split_lines(std::string& out, const std::vector<rank_row>& rows) {
  out += "\nDevice memory that is not fragctl's, split (docs/reports.md)\n";
  out += fmt::format("  {:<18} {:>13}", "", "not fragctl's");
  for (const report_detail::split_part& part : report_detail::split_parts) out += fmt::format(" {:>15}", part.name);
  out += '\n';
  for (const rank_row& row : rows) {
    out += fmt::format("  {:<18}", report_detail::rank_label(row, rows));
    if (row.split == nullptr) {
      out += " not recorded\n";
      continue;
    }
    out += fmt::format(" {:>13}", bytes(row.not_fragctl));
    for (const report_detail::split_part& part : report_detail::split_parts) {
      const bool known = row.split->per_process || part.field != &device_memory_split::other_processes;
      out += fmt::format(" {:>15}", known ? bytes(row.split->*part.field) : std::string("-"));
    }
    out += '\n';
  }
  out +=
      "  context: this process's device memory when its first allocator on the device started, less fragctl's\n"
      "  (NVML; without it, the device memory outside fragctl then, other processes' included); NCCL: what\n"
      "  the communicators measured and reported; graph pools and other fragctl: the process's other fragctl\n"
      "  allocators on the device; other processes: NVML (-: no per-process figures, so they are in other);\n"
      "  other: the rest (cuBLAS and cuDNN workspaces, lazily loaded kernels, another allocator's cache)\n";
}

void device_lines(std::string& out, const std::vector<rank_row>& rows) {
  const bool any = std::any_of(rows.begin(), rows.end(), [](const rank_row& r) { return r.device_measured; });
  out += "\nDevice memory that is not fragctl's (when each report was written)\n";
  if (!any) {
    out +=
        "  not recorded: these reports carry no device_memory (written by an earlier fragctl, or the backend\n"
        "  gave no figures)\n";
    return;
  }
  out += fmt::format("  {:<18} {:>11} {:>11} {:>11} {:>13} {:>11} {:>11}\n", "", "device used", "of total", "fragctl",
                     "not fragctl's", "at start", "since");
  for (const rank_row& row : rows) {
    const allocator_stats& s = row.run->stats;
    if (!row.device_measured) {
      out += fmt::format("  {:<18} not recorded\n", report_detail::rank_label(row, rows));
      continue;
    }
    out += fmt::format("  {:<18} {:>11} {:>11} {:>11} {:>13} {:>11} {:>11}\n", report_detail::rank_label(row, rows),
                       bytes(row.device_used), bytes(s.device_memory.total), bytes(s.reserved.current),
                       bytes(row.not_fragctl), bytes(row.at_start), bytes(row.since_start));
  }
  out +=
      "  at start: held outside fragctl when its allocator was built (the CUDA or HIP context, libraries\n"
      "  loaded before it, other processes); since: taken since (NCCL communicators and buffers, cuBLAS and\n"
      "  cuDNN workspaces, graph pools, other allocators and processes).";
  if (std::none_of(rows.begin(), rows.end(), [](const rank_row& r) { return r.split != nullptr; })) {
    out +=
        " Telling the context, NCCL and other\n"
        "  processes apart needs NVML's per-process figures and NCCL's own, which these reports do not carry\n"
        "  (docs/reports.md).\n";
    return;
  }
  out += " The split below tells them apart.\n";
  split_lines(out, rows);
}

}  // namespace

bool runs_are_ranks(const std::vector<run_report>& runs) {
  if (runs.size() < 2) return false;
  std::set<std::pair<std::int64_t, int>> seen;
  std::set<std::int64_t> ranks;
  std::set<std::int64_t> worlds;
  for (const run_report& r : runs) {
    if (r.kind != "report" || !r.writer.rank) return false;
    if (!seen.insert({*r.writer.rank, r.stats.device}).second) return false;
    ranks.insert(*r.writer.rank);
    if (r.writer.world_size) worlds.insert(*r.writer.world_size);
  }
  return ranks.size() >= 2 && worlds.size() <= 1;
}

std::string render_rank_table(const std::vector<run_report>& runs) {
  const std::vector<rank_row> rows = report_detail::rank_rows(runs);
  if (rows.empty()) return {};
  std::string out = job_line(rows) + "\n";
  for (const rank_row& row : rows) {
    const run_report& r = *row.run;
    out += fmt::format("  {} = {} ({} on {} device {}{})\n", report_detail::rank_label(row, rows), printable(r.source),
                       printable(r.stats.allocator), printable(r.stats.backend), r.stats.device,
                       r.writer.host.empty() ? "" : ", host " + printable(r.writer.host));
    for (const std::string& warning : report_detail::inconsistencies(r.stats))
      out += fmt::format("      warning ({}): {}\n", report_detail::rank_label(row, rows), warning);
  }
  struct column {
    std::string_view head;
    std::vector<std::string> cells;
  };
  std::vector<column> columns{
      {"rank", {}},      {"reserved", {}},       {"peak reserved", {}}, {"requested", {}},    {"peak requested", {}},
      {"allocated", {}}, {"peak allocated", {}}, {"cached", {}},        {"largest free", {}}, {"not fragctl's", {}},
      {"OOMs", {}}};
  for (const rank_row& row : rows) {
    const allocator_stats& s = row.run->stats;
    const std::string label = report_detail::rank_label(row, rows);
    const std::string cells[] = {label.substr(5),  // "2", "2 device 1"
                                 bytes(s.reserved.current),
                                 bytes(s.reserved.peak),
                                 bytes(s.requested.current),
                                 bytes(s.requested.peak),
                                 bytes(s.allocated.current),
                                 bytes(s.allocated.peak),
                                 bytes(row.cached),
                                 bytes(s.pool.largest_free_block),
                                 row.device_measured ? bytes(row.not_fragctl) : std::string("-"),
                                 oom_cell(row)};
    for (std::size_t i = 0; i < columns.size(); ++i) columns[i].cells.push_back(cells[i]);
  }
  std::vector<std::size_t> widths;
  for (const column& c : columns) {
    std::size_t w = c.head.size();
    for (const std::string& cell : c.cells) w = std::max(w, cell.size());
    widths.push_back(w);
  }
  // Numbers right-aligned; the rank and the OOM verdicts read from the left.
  const auto table_line = [&](auto cell) {
    std::string line;
    for (std::size_t i = 0; i < columns.size(); ++i) {
      const bool left = i == 0 || i + 1 == columns.size();
      line += left ? fmt::format("  {:<{}}", cell(i), widths[i]) : fmt::format("  {:>{}}", cell(i), widths[i]);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    return line + "\n";
  };
  // Appended in two steps: "\n" + a temporary trips GCC 12's -Wrestrict at -O3.
  out += '\n';
  out += table_line([&](std::size_t i) { return std::string(columns[i].head); });
  for (std::size_t row = 0; row < rows.size(); ++row)
    out += table_line([&](std::size_t i) { return columns[i].cells[row]; });
  out +=
      "  (cached: reserved - allocated now; largest free: the largest block one request could get without a\n"
      "  device call; not fragctl's: device memory in use less fragctl's reserved bytes, see below)\n";
  imbalance_lines(out, rows);
  device_lines(out, rows);
  report_detail::rank_hang_lines(out, runs);
  return out;
}

std::string render_rank_json(const std::vector<run_report>& runs) {
  using nlohmann::ordered_json;
  const std::vector<rank_row> rows = report_detail::rank_rows(runs);
  const auto figure = [](const std::optional<std::int64_t>& n) { return n ? ordered_json(*n) : ordered_json(); };
  const auto gauge = [](const byte_gauge& g) { return ordered_json{{"current", g.current}, {"peak", g.peak}}; };
  ordered_json ranks = ordered_json::array();
  for (const rank_row& row : rows) {
    const run_report& r = *row.run;
    const allocator_stats& s = r.stats;
    ordered_json verdicts = ordered_json::object();
    for (std::size_t i = 0; i < row.verdicts.size(); ++i)
      verdicts[std::string(to_string(report_detail::rank_verdicts[i]))] = row.verdicts[i];
    ordered_json device = nullptr;
    if (row.device_measured) {
      device = {{"free", s.device_memory.free},
                {"total", s.device_memory.total},
                {"used", row.device_used},
                {"not_fragctl", row.not_fragctl},
                {"not_fragctl_at_start", row.at_start},
                {"not_fragctl_since_start", row.since_start}};
      if (row.split != nullptr)
        device["split"] = ordered_json::parse(detail::dump_json(detail::device_memory_split_to_json_value(*row.split)));
    }
    ranks.push_back({{"rank", row.rank},
                     {"local_rank", figure(r.writer.local_rank)},
                     {"world_size", figure(r.writer.world_size)},
                     {"host", r.writer.host},
                     {"launcher", r.writer.launcher},
                     {"device", row.device},
                     {"source", r.source},
                     {"allocator", s.allocator},
                     {"reserved", gauge(s.reserved)},
                     {"requested", gauge(s.requested)},
                     {"allocated", gauge(s.allocated)},
                     {"cached", row.cached},
                     {"largest_free_block", s.pool.largest_free_block},
                     {"ooms", s.ooms},
                     {"oom_verdicts", std::move(verdicts)},
                     {"device_memory", std::move(device)},
                     {"hangs", report_detail::hangs_json(r.hangs)},
                     {"stats", ordered_json::parse(to_json(s))}});
  }
  const auto extremes = [](const rank_extremes& e) {
    return ordered_json{{"max", e.max},        {"max_rank", e.largest->rank},  {"max_device", e.largest->device},
                        {"min", e.min},        {"min_rank", e.smallest->rank}, {"min_device", e.smallest->device},
                        // null where the smallest is 0 and the largest not: no finite ratio
                        // (was 0.0 beside over_threshold: true)
                        {"excess", e.min == 0 && e.max > 0 ? ordered_json() : ordered_json(e.excess())}};
  };
  ordered_json imbalance = ordered_json::object();
  if (!rows.empty()) {
    const rank_extremes reserved = report_detail::peak_reserved_extremes(rows);
    imbalance = {{"threshold", rank_imbalance_threshold},
                 {"peak_reserved", extremes(reserved)},
                 {"peak_requested", extremes(report_detail::peak_requested_extremes(rows))},
                 {"over_threshold", reserved.imbalanced()}};
    if (const rank_extremes outside = report_detail::not_fragctl_extremes(rows); outside.largest != nullptr) {
      imbalance["not_fragctl"] = extremes(outside);
      imbalance["not_fragctl"]["difference"] = outside.max - outside.min;
      imbalance["not_fragctl"]["over_threshold"] = outside.imbalanced();
      const auto [part, by] = report_detail::widest_split_part(outside);
      if (part != nullptr) {
        imbalance["not_fragctl"]["differs_most"] = std::string(part->name);
        imbalance["not_fragctl"]["differs_most_by"] = by;
      }
    }
  }
  const ordered_json doc{{"ranks", std::move(ranks)}, {"imbalance", std::move(imbalance)}};
  return detail::dump_json(doc) + "\n";
}

}  // namespace fragctl
