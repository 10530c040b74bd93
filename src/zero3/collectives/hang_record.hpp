// What a rank says when one of its collectives passes its deadline (issue
// 31), shared by the thread group and the NCCL communicator: the line that
// places a missing rank ("rank 1 has not entered all_gather #41 of block 3
// 'layers.2'; it completed #40 (...) at 12.3 s and has been silent 20.1 s"),
// and the record of the hang written into the process's reports
// (fragctl/stats_export.hpp, record_stats_export_hang; docs/reports.md,
// "Hangs"). Internal to src/zero3.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fragctl::zero3 {

/// The last collective a peer completed, as the waiting rank sees it.
struct peer_mark {
  std::uint64_t number = 0;  ///< 0: it completed none
  std::string operation;     ///< "all_gather", "reduce_scatter"
  std::string tag;           ///< the block, "block 3 'layers.2'"
  double completed_s = 0;    ///< when, seconds since the peer (or its group) started
  double silent_s = 0;       ///< how long ago it completed it (or started, when none)
};

/// "rank R has not entered OP #N of TAG; it completed #M (OP2 of TAG2) at
/// 0.2 s and has been silent 0.4 s"; "not finished" with `finishing`.
[[nodiscard]] std::string missing_line(int rank, bool finishing, std::string_view operation, std::uint64_t number,
                                       std::string_view tag, const peer_mark& last);

/// One hang, as the reports carry it.
struct hang_record {
  int rank = 0;
  int size = 1;
  std::string communicator;  ///< "threads", "nccl", "rccl"
  std::string collective;    ///< the operation that passed its deadline
  std::uint64_t sequence = 0;
  std::string block;      ///< the caller's tag
  std::size_t bytes = 0;  ///< 0: not known
  std::chrono::milliseconds deadline{0};
  double elapsed_s = 0;            ///< since this rank entered the collective
  std::vector<int> missing;        ///< ranks that had not entered (or not finished) it
  std::vector<std::string> peers;  ///< one line per other rank that was read: where it was
  std::string message;             ///< the collective_error's text
};

/// Records `h` in this process's reports and rewrites them (reason "hang"):
/// the process is likely to end soon. Never throws (a failure is a log line).
/// Call without holding a lock an allocator or a report may take.
void record_hang(const hang_record& h) noexcept;

}  // namespace fragctl::zero3
