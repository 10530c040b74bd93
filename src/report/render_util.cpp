// Shared helpers of the report renderers.
#include "report/render_util.hpp"

#include <algorithm>
#include <cstdint>

#include "fmt/format.h"
#include "util/strings.hpp"

namespace fragctl::report_detail {

std::string bytes(std::size_t n) { return util::human_bytes(n); }

std::string signed_bytes(std::size_t from, std::size_t to) {
  if (from == to) return "0 B";
  // fmt, not "+" + std::string&&: GCC 12 at -O3 reports a false -Wrestrict
  // on the operator+ form.
  return to > from ? fmt::format("+{}", bytes(to - from)) : fmt::format("-{}", bytes(from - to));
}

std::string percent_change(double from, double to) {
  if (from == 0) return {};
  return fmt::format("{:+.1f}%", 100.0 * (to - from) / from);
}

std::string pow2_label(std::size_t log2) {
  constexpr const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  const std::size_t unit = std::min<std::size_t>(log2 / 10, 5);
  return fmt::format("{} {}", std::uint64_t{1} << (log2 - unit * 10), units[unit]);
}

std::string stream_name(std::uintptr_t s) { return s == 0 ? "default" : fmt::format("{:#x}", s); }
std::string stream_name(stream_t s) { return stream_name(reinterpret_cast<std::uintptr_t>(s)); }

std::vector<std::string> inconsistencies(const allocator_stats& s) {
  std::vector<std::string> out;
  const auto above_peak = [&](std::string_view name, const byte_gauge& g) {
    if (g.current > g.peak)
      out.push_back(fmt::format("inconsistent report: current {} bytes ({}) above their peak ({})", name,
                                bytes(g.current), bytes(g.peak)));
  };
  above_peak("requested", s.requested);
  above_peak("allocated", s.allocated);
  above_peak("reserved", s.reserved);
  if (s.requested.current > s.reserved.current)
    out.push_back(fmt::format("inconsistent report: {} requested now, more than the {} reserved",
                              bytes(s.requested.current), bytes(s.reserved.current)));
  if (s.requested.peak > s.reserved.peak)
    out.push_back(fmt::format("inconsistent report: peak requested {} above peak reserved {}", bytes(s.requested.peak),
                              bytes(s.reserved.peak)));
  return out;
}

std::vector<std::string> map_inconsistencies(const memory_snapshot& m, std::size_t most) {
  std::vector<std::string> out;
  std::size_t found = 0;
  const auto note = [&](std::string sentence) {
    if (++found <= most) out.push_back(std::move(sentence));
  };
  // A damaged file may hold any value: an end past the address space is
  // read as its last address (a block whose end wraps is past every
  // segment's, below).
  const auto end_of = [](std::uintptr_t address, std::size_t size) -> std::uintptr_t {
    return size > UINTPTR_MAX - address ? UINTPTR_MAX : address + size;
  };
  std::vector<const memory_block*> blocks;
  for (const memory_segment& seg : m.segments) {
    const std::uintptr_t seg_end = end_of(seg.address, seg.size);
    blocks.clear();
    for (const memory_block& b : seg.blocks) {
      const bool wraps = b.size > UINTPTR_MAX - b.address;
      if (b.address < seg.address || wraps || b.address + b.size > seg_end) {
        note(fmt::format("inconsistent report: a block of {} at {:#x} is not within its segment [{:#x}, +{})",
                         bytes(b.size), b.address, seg.address, bytes(seg.size)));
      }
      blocks.push_back(&b);
    }
    // In address order, each block against the one reaching furthest
    // before it; a block of 0 bytes overlaps nothing.
    std::sort(blocks.begin(), blocks.end(),
              [](const memory_block* a, const memory_block* b) { return a->address < b->address; });
    const memory_block* reacher = nullptr;
    std::uintptr_t reach = 0;
    for (const memory_block* b : blocks) {
      if (b->size == 0) continue;
      if (reacher != nullptr && b->address < reach) {
        note(fmt::format("inconsistent report: blocks at {:#x} (+{}) and {:#x} overlap in segment {:#x}",
                         reacher->address, bytes(reacher->size), b->address, seg.address));
      }
      const std::uintptr_t end = end_of(b->address, b->size);
      if (reacher == nullptr || end > reach) {
        reacher = b;
        reach = end;
      }
    }
  }
  if (found > most) out.push_back(fmt::format("inconsistent report: {} more such contradictions", found - most));
  return out;
}

std::vector<segment_waste> rank_wasted(const memory_snapshot& m) {
  std::vector<segment_waste> out;
  for (const memory_segment& s : m.segments) {
    segment_waste w;
    w.segment = &s;
    for (const memory_block& b : s.blocks) {
      switch (b.use) {
        case block_use::live: w.live += b.size; break;
        case block_use::pending: w.pending += b.size; break;
        case block_use::free:
          w.free += b.size;
          ++w.free_blocks;
          w.largest_free = std::max(w.largest_free, b.size);
          break;
      }
    }
    if (s.blocks.empty()) continue;  // blocks omitted: nothing known
    if (w.wasted() > 0) out.push_back(w);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const segment_waste& a, const segment_waste& b) { return a.wasted() > b.wasted(); });
  return out;
}

const labelled_map* primary_map(const run_report& r) {
  for (const labelled_map& m : r.maps)
    if (m.map.available) return &m;
  return nullptr;
}

std::string no_map_reason(const run_report& r) {
  if (!r.maps.empty() && !r.maps.front().map.available) {
    return fmt::format("no memory map: the {} policy does not describe its layout (memory_map())",
                       r.maps.front().map.allocator.empty() ? r.stats.allocator : r.maps.front().map.allocator);
  }
  if (r.kind == "report") return "no memory map: the report holds none (write it with a map, see docs/reports.md)";
  return "no memory map";
}

namespace {

std::string ratio(double v) { return fmt::format("{:.3f}", v); }
std::string pct(double v) { return fmt::format("{:.1f}%", 100.0 * v); }

}  // namespace

std::vector<comparison_row> comparison_rows(const std::vector<run_report>& runs) {
  struct metric {
    std::string label;
    std::size_t (*bytes_of)(const allocator_stats&);
    double (*ratio_of)(const allocator_stats&);
    bool percent;
  };
  const std::vector<metric> metrics = {
      {"peak reserved", [](const allocator_stats& s) { return s.reserved.peak; }, nullptr, false},
      {"peak requested", [](const allocator_stats& s) { return s.requested.peak; }, nullptr, false},
      {"reserved/requested", nullptr, [](const allocator_stats& s) { return s.reserved_over_requested(); }, false},
      {"fragmentation", nullptr, [](const allocator_stats& s) { return s.fragmentation(); }, true},
      {"current reserved", [](const allocator_stats& s) { return s.reserved.current; }, nullptr, false},
      {"current requested", [](const allocator_stats& s) { return s.requested.current; }, nullptr, false},
      {"peak allocated", [](const allocator_stats& s) { return s.allocated.peak; }, nullptr, false},
      {"external fragmentation", nullptr, [](const allocator_stats& s) { return s.external_fragmentation(); }, true},
      {"largest free block", [](const allocator_stats& s) { return s.pool.largest_free_block; }, nullptr, false},
      {"backend memory calls", nullptr,
       [](const allocator_stats& s) { return static_cast<double>(s.backend_calls.memory_calls()); }, false},
      {"OOMs", nullptr, [](const allocator_stats& s) { return static_cast<double>(s.ooms); }, false},
  };
  std::vector<comparison_row> rows;
  for (const metric& m : metrics) {
    comparison_row row;
    row.label = m.label;
    const bool counter = m.label == "backend memory calls" || m.label == "OOMs";
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const allocator_stats& s = runs[i].stats;
      const allocator_stats& base = runs[0].stats;
      if (m.bytes_of != nullptr) {
        const std::size_t v = m.bytes_of(s);
        row.values.push_back(bytes(v));
        if (i > 0) {
          const std::string change = percent_change(static_cast<double>(m.bytes_of(base)), static_cast<double>(v));
          row.deltas.push_back(signed_bytes(m.bytes_of(base), v) + (change.empty() ? "" : " (" + change + ")"));
        }
      } else {
        const double v = m.ratio_of(s);
        const double b = m.ratio_of(base);
        row.values.push_back(counter ? fmt::format("{:.0f}", v) : m.percent ? pct(v) : ratio(v));
        if (i > 0) {
          row.deltas.push_back(counter     ? fmt::format("{:+.0f}", v - b)
                               : m.percent ? fmt::format("{:+.1f} pts", 100.0 * (v - b))
                                           : fmt::format("{:+.3f}", v - b));
        }
      }
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

std::string comparison_headline(const run_report& a, const run_report& b) {
  const std::size_t pa = a.stats.reserved.peak;
  const std::size_t pb = b.stats.reserved.peak;
  if (pa == pb) return fmt::format("{} and {} reserve the same at peak ({})", b.name, a.name, bytes(pa));
  const std::string change = percent_change(static_cast<double>(pa), static_cast<double>(pb));
  return fmt::format("{} reserves {} {} at peak than {} ({} vs {}{})", b.name, bytes(pb > pa ? pb - pa : pa - pb),
                     pb > pa ? "more" : "less", a.name, bytes(pb), bytes(pa),
                     change.empty() ? "" : ", " + change);
}

}  // namespace fragctl::report_detail
