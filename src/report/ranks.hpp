// The ranks of one job side by side (docs/reports.md, "Every rank side by
// side"): the rows every rendering of render_rank_table's view shares, and
// the HTML section.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fragctl/run_report.hpp"
#include "report/markup.hpp"

namespace fragctl::report_detail {

/// One allocator of one rank, with the figures derived for the table.
struct rank_row {
  const run_report* run = nullptr;
  std::int64_t rank = 0;
  int device = 0;
  std::size_t cached = 0;  ///< reserved - allocated now
  /// The device's memory when the report was written (allocator_stats::device_memory).
  bool device_measured = false;
  std::size_t device_used = 0;  ///< total - free
  std::size_t not_fragctl = 0;  ///< device_used - reserved now
  std::size_t at_start = 0;     ///< of not_fragctl: held outside when the allocator was built
  std::size_t since_start = 0;  ///< of not_fragctl: the rest
  /// not_fragctl split by whose it is (allocator_stats::device_memory.split);
  /// null in reports written before it.
  const device_memory_split* split = nullptr;
  /// The kept OOM events by verdict, in rank_verdicts' order.
  std::array<std::uint64_t, 4> verdicts{};
};

/// The verdicts rank_row::verdicts counts, in order.
inline constexpr std::array<oom_verdict, 4> rank_verdicts{oom_verdict::fragmentation, oom_verdict::capacity,
                                                          oom_verdict::other_process, oom_verdict::declined};

/// The rows of `runs` (runs_are_ranks), ordered by rank, then device.
[[nodiscard]] std::vector<rank_row> rank_rows(const std::vector<run_report>& runs);

/// The rows with the largest and the smallest of a figure (the first of equals).
struct rank_extremes {
  const rank_row* largest = nullptr;
  const rank_row* smallest = nullptr;
  std::size_t max = 0;
  std::size_t min = 0;
  /// (max - min) / min; 0 when min is 0.
  [[nodiscard]] double excess() const noexcept;
  /// The ranks differ enough to call out: max more than
  /// rank_imbalance_threshold above min, or min 0 and max not.
  [[nodiscard]] bool imbalanced() const noexcept;
};
[[nodiscard]] rank_extremes peak_reserved_extremes(const std::vector<rank_row>& rows);
[[nodiscard]] rank_extremes peak_requested_extremes(const std::vector<rank_row>& rows);
/// Of the rows whose device memory was measured, the device memory that is
/// not fragctl's; largest and smallest are null where none was measured.
[[nodiscard]] rank_extremes not_fragctl_extremes(const std::vector<rank_row>& rows);

/// One part of the split of the device memory that is not fragctl's, as the
/// ranks' renderings show it.
struct split_part {
  std::string_view name;  ///< "context", "NCCL", ...
  std::size_t device_memory_split::*field;
};
/// The parts, in the order of fragctl/device_memory.hpp.
inline constexpr std::array<split_part, 6> split_parts{{{"context", &device_memory_split::context},
                                                        {"NCCL", &device_memory_split::nccl},
                                                        {"graph pools", &device_memory_split::graph_pools},
                                                        {"other fragctl", &device_memory_split::other_fragctl},
                                                        {"other", &device_memory_split::other},
                                                        {"other processes", &device_memory_split::other_processes}}};
/// The part whose bytes differ most between the largest and the smallest of
/// `e` (not_fragctl_extremes), and by how much; nullptr where either lacks a
/// split.
[[nodiscard]] std::pair<const split_part*, std::size_t> widest_split_part(const rank_extremes& e);

/// "rank 2", or "rank 2 device 1" when some rank has several devices.
[[nodiscard]] std::string rank_label(const rank_row& row, const std::vector<rank_row>& rows);

/// Appends the HTML section of the ranks (the table, the imbalance and one
/// SVG picture: a pair of bars per rank) to `out`.
void rank_section_html(markup& out, const std::vector<run_report>& runs);

}  // namespace fragctl::report_detail
