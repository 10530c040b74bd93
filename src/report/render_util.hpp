// Helpers the report renderers share (text, HTML, SVG).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "fragctl/run_report.hpp"

namespace fragctl::report_detail {

/// "1.50 GiB", "512 B".
[[nodiscard]] std::string bytes(std::size_t n);
/// Signed byte difference: "+1.50 GiB", "-512 B", "0 B".
[[nodiscard]] std::string signed_bytes(std::size_t from, std::size_t to);
/// "+12.3%" change from `from` to `to` (empty when from is 0).
[[nodiscard]] std::string percent_change(double from, double to);
/// A power of two as a short size: 512 B, 1 KiB, 64 MiB.
[[nodiscard]] std::string pow2_label(std::size_t log2);
/// "default" for the default stream, else its handle in hex.
[[nodiscard]] std::string stream_name(std::uintptr_t s);
[[nodiscard]] std::string stream_name(stream_t s);

/// Sentences naming the figures of `s` that contradict each other, as a
/// damaged or hand-edited report has them: a current value above its peak
/// (requested, allocated, reserved), or more bytes requested than reserved
/// (now or at peak; requested bytes live in reserved memory). Empty for the
/// statistics of a real run.
[[nodiscard]] std::vector<std::string> inconsistencies(const allocator_stats& s);

/// Sentences naming the blocks of `m` that contradict their segments, as a
/// damaged or hand-edited report has them: a block that starts before its
/// segment or ends past it, and blocks of one segment that overlap (each
/// map a real run writes tiles its segments with its blocks). At most
/// `most` sentences, then one counting the rest. Empty for a real run's map.
/// The text report checks the map it draws (the primary one), the page
/// every map it draws.
[[nodiscard]] std::vector<std::string> map_inconsistencies(const memory_snapshot& m, std::size_t most = 3);

/// One segment of a map and where its bytes went.
struct segment_waste {
  const memory_segment* segment = nullptr;
  std::size_t live = 0;
  std::size_t free = 0;
  std::size_t pending = 0;
  std::size_t free_blocks = 0;
  std::size_t largest_free = 0;
  [[nodiscard]] std::size_t wasted() const noexcept { return free + pending; }
};

/// Segments by wasted (free + pending) bytes, most first; segments with
/// nothing wasted are left out.
[[nodiscard]] std::vector<segment_waste> rank_wasted(const memory_snapshot& m);

/// The map a summary describes: the first available one (at the first OOM
/// when there was one, else at peak reserved, else the report's), or null.
[[nodiscard]] const labelled_map* primary_map(const run_report& r);

/// The sentence shown instead of a map when there is none.
[[nodiscard]] std::string no_map_reason(const run_report& r);

/// Rows of the comparison: a label and a value per run.
struct comparison_row {
  std::string label;
  std::vector<std::string> values;
  std::vector<std::string> deltas;  ///< against the first run; empty for the first
};
[[nodiscard]] std::vector<comparison_row> comparison_rows(const std::vector<run_report>& runs);
/// "arena holds 1.20 GiB less at peak than caching (-23.4%)".
[[nodiscard]] std::string comparison_headline(const run_report& a, const run_report& b);

}  // namespace fragctl::report_detail
