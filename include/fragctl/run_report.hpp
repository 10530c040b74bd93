// Fragmentation reports people can read and look at: what `fragctl report`
// prints and draws (docs/reports.md).
//
// A run_report gathers what is known about one allocator's run: its
// statistics (fragctl/stats.hpp), memory maps (fragctl/memory_map.hpp) taken
// at telling moments, and, for a replayed trace, a timeline of requested and
// reserved bytes with the OOMs marked. It is read from a JSON report
// (FRAGCTL_REPORT, the C API, Python), from `fragctl replay --json` output,
// or made by replaying a trace. Renderers turn it into a terminal summary, a
// side-by-side comparison, one self-contained HTML page, or an SVG map.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "fragctl/memory_map.hpp"
#include "fragctl/replay.hpp"
#include "fragctl/stats.hpp"
#include "fragctl/trace.hpp"

namespace fragctl {

/// A memory map and the moment it shows.
struct labelled_map {
  std::string label;  ///< "at peak reserved (event 1234)", "at exit", ...
  memory_snapshot map;
};

/// One point of a timeline: requested and reserved bytes after an event.
struct timeline_point {
  std::size_t event = 0;      ///< index of the trace event
  double time_ms = 0;         ///< trace time since the first event
  std::size_t requested = 0;  ///< the largest value since the previous point
  std::size_t reserved = 0;   ///< the largest value since the previous point
};

/// An allocation that ran out of memory during a replay.
struct timeline_oom {
  std::size_t event = 0;
  double time_ms = 0;
  std::size_t requested = 0;  ///< requested bytes live when it failed
  std::size_t reserved = 0;
  std::size_t bytes = 0;      ///< size of the failed request
};

/// Requested vs reserved bytes over a replay, at most `max_points` points
/// (each the maximum over its stretch of events, so peaks survive).
struct timeline {
  bool by_time = true;  ///< x axis: trace time (ms); false: event index (the trace had no times)
  std::vector<timeline_point> points;
  std::vector<timeline_oom> ooms;  ///< every OOM, in order
};

/// Where a JSON report's writer stood in its job, as the report document
/// records it (docs/statistics.md, "The report file"): each figure unknown
/// in replays, in reports of processes no launcher started, and in reports
/// of earlier fragctl.
struct writer_rank {
  std::optional<std::int64_t> rank;        ///< global rank
  std::optional<std::int64_t> local_rank;  ///< rank on its host
  std::optional<std::int64_t> world_size;  ///< processes in the job
  std::string host;                        ///< empty when not recorded
  std::string launcher;                    ///< "torchrun", "openmpi", "slurm"; empty when none
};

/// A collective that passed its deadline, as its rank recorded it in its
/// JSON report ("hangs", docs/reports.md "Hangs"; fragctl/stats_export.hpp).
struct hang_note {
  std::int64_t rank = -1;      ///< the rank that waited; -1 when not recorded
  std::string communicator;    ///< "gloo", "nccl", "threads", ...
  std::string collective;      ///< "all_gather", "reduce_scatter"
  std::uint64_t sequence = 0;  ///< its number, the same on every rank
  std::string block;           ///< "block 3 'model.layers.2'"
  std::vector<std::string> modules;
  std::size_t bytes = 0;
  double deadline_s = 0;                  ///< fragctl's deadline in force
  std::optional<double> group_timeout_s;  ///< the process group's timeout, when known
  double elapsed_s = 0;                   ///< how long the rank waited
  bool timed_out = true;                  ///< false: it failed otherwise (a peer gave up first)
  std::vector<std::int64_t> missing;      ///< ranks that had not entered it
  std::vector<std::string> peers;         ///< one line per other rank: where it was
  std::string message;                    ///< the error the rank raised
};

/// Everything known about one allocator's run.
struct run_report {
  std::string name;    ///< what it is called in tables: "gpt2m / caching", "job.json"
  std::string source;  ///< the file it came from
  std::string kind;    ///< "report" (a JSON report) or "replay" (a trace replayed here)
  allocator_stats stats;
  std::vector<labelled_map> maps;  ///< may be empty (no map in the report, or a policy without one)
  timeline time;                   ///< replays only
  replay_result replay;            ///< replays only (kind == "replay")
  writer_rank writer;              ///< JSON reports only
  std::vector<hang_note> hangs;    ///< JSON reports only: its process's hung collectives
  /// Replays only: why the trace replayed is not whole (completeness_note()
  /// of a cut trace: its writer was killed), else empty.
  std::string cut_note;
};

/// How load_run_reports treats a trace.
struct report_options {
  /// Replay options (policy, backend, capacity, conf) for traces; the
  /// default replays on sim with the backend's default policy.
  replay_options replay;
  trace_options trace;
  std::size_t max_timeline_points = 2000;
};

/// Reads `path`: a JSON report (one run_report per allocator it holds),
/// `fragctl replay --json` output (one per result), or a trace in any format
/// trace.hpp reads, replayed through options.replay (one run_report with a
/// timeline and maps at peak reserved, at the first OOM, and after the last
/// event). Errors name the file; a trace with no allocation or free, and a
/// replay's backend or policy error, are errors too. Does not throw.
[[nodiscard]] absl::StatusOr<std::vector<run_report>> load_run_reports(const std::string& path,
                                                                       const report_options& options = {});

/// Replays `t` and gathers its report (load_run_reports does this for traces).
/// Throws what replay() throws.
[[nodiscard]] run_report replay_run_report(const trace& t, const report_options& options = {});

/// A JSON report document's allocators as run_reports, with the memory maps
/// the document carries ("memory_map" of each allocator). `source` names the
/// file in errors.
[[nodiscard]] absl::StatusOr<std::vector<run_report>> run_reports_from_json(std::string_view json,
                                                                            const std::string& source);

/// Options of the text renderers.
struct text_options {
  std::size_t top_regions = 10;  ///< rows of "top wasted regions"
  std::size_t bar_width = 40;    ///< characters of the longest histogram bar
};

/// The terminal summary of one run: current and peak requested and reserved
/// bytes, reserved_over_requested, external fragmentation, largest free
/// block, top wasted regions, the size histogram as a bar chart, backend
/// calls, OOM events with their diagnosis, and the hung collectives its
/// process recorded (run_report::hangs), if any.
[[nodiscard]] std::string render_text(const run_report& r, const text_options& options = {});

/// Runs side by side, one column each, and the difference of each against
/// the first run (peak reserved first).
[[nodiscard]] std::string render_comparison(const std::vector<run_report>& runs);

/// True when `runs` are one job's ranks side by side rather than
/// alternatives to compare: every run a JSON report whose writer recorded
/// its rank, at least two ranks, no rank and device twice, and one world
/// size among those recorded. `fragctl report run.*.json` shows such runs
/// with render_rank_table.
[[nodiscard]] bool runs_are_ranks(const std::vector<run_report>& runs);

/// Imbalance between ranks worth a line of its own: the largest peak
/// reserved more than this fraction above the smallest.
inline constexpr double rank_imbalance_threshold = 0.05;

/// Every rank in one table, a row per rank (and device), ordered by rank:
/// reserved bytes now and at peak, requested and allocated bytes now and at
/// peak, cached bytes (reserved - allocated), the largest free block, the
/// device memory that is not fragctl's when the report recorded the
/// device's, and the OOMs by verdict; then the imbalance (largest and
/// smallest peak reserved and requested, with their ranks, and a line when
/// peak reserved differs by more than rank_imbalance_threshold), and the
/// device memory outside fragctl split as far as the reports allow; then,
/// when a report recorded hung collectives, a line per rank that waited
/// naming the ranks it waited for.
[[nodiscard]] std::string render_rank_table(const std::vector<run_report>& runs);

/// The same as one JSON document: {"ranks": [a row per rank with its
/// figures and its full "stats"], "imbalance": {...}} (docs/reports.md,
/// "Every rank side by side").
[[nodiscard]] std::string render_rank_json(const std::vector<run_report>& runs);

/// One self-contained HTML page (inline CSS, JavaScript and SVG; nothing
/// fetched) with, per run, its figures, its memory maps and, for replays, the
/// timeline; with several runs, a comparison table first.
[[nodiscard]] std::string render_html(const std::vector<run_report>& runs);

/// Options of the memory map picture.
struct map_options {
  double width = 960;         ///< pixels of the drawing area
  double row_height = 14;     ///< pixels per row
  std::size_t max_rows = 400;  ///< rows beyond are summarized in one line
};

/// The memory map as a standalone SVG document: rows of reserved memory,
/// segments packed in address order, live blocks coloured by size class,
/// free and pending space visible, each block with a tooltip (address, size,
/// requested, stream), and a legend.
[[nodiscard]] std::string render_map_svg(const labelled_map& m, const map_options& options = {});

/// Size classes the map colours live blocks by: upper bounds in bytes
/// (the last class is open) and the colour of each.
struct size_class {
  std::size_t below = 0;  ///< exclusive upper bound; SIZE_MAX for the last class
  std::string_view label;
  std::string_view colour;
};
[[nodiscard]] const std::vector<size_class>& map_size_classes();

}  // namespace fragctl
