// Allocation traces: what a program asked of its allocator, in order
// (DESIGN.md, "Traces"; docs/traces.md describes every format).
//
// A trace is the sequence of allocations and frees a program made, with the
// address the allocator returned (it names a live block between its alloc and
// its free), the size asked for, the stream, and a time. Three formats are read,
// detected from the content (gzip-compressed or not):
//
//  * fragctl CSV: header `action,addr,size,stream,time_us`, PyTorch's action
//    names (`alloc`, `free_requested`, ...). Written by write_trace_csv and by
//    tracing_adaptor.
//  * PyTorch snapshot JSON: `json.dump(torch.cuda.memory._snapshot())`; its
//    `device_traces` hold one list of events per device.
//  * RMM logging CSV: header `Thread,Time,Action,Pointer,Size,Stream`
//    (rmm::mr::logging_resource_adaptor), pointers in hex.
//
// Only allocs and frees become events. What the recording allocator did on
// its own (segment_*, free_completed), snapshots and OOM markers are counted
// in `ignored_rows`: a replay puts another allocator in its place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fragctl {

/// One allocation or free of a trace.
struct trace_event {
  enum class action : std::uint8_t { alloc, free };
  action kind = action::alloc;
  std::uint64_t addr = 0;    ///< address the recording allocator returned; names the block
  std::size_t size = 0;      ///< bytes the program asked for (for a free: as recorded)
  std::uint64_t stream = 0;  ///< stream id as recorded; 0 is the default stream
  std::int64_t time_us = 0;  ///< microseconds, monotonic within one trace (origin arbitrary)

  friend bool operator==(const trace_event&, const trace_event&) = default;
};

/// Whether a trace file shows that it holds all its writer recorded
/// (docs/traces.md, "fragctl CSV").
enum class trace_completeness : std::uint8_t {
  /// The file cannot tell: an RMM log, or a fragctl CSV without any `end`
  /// row (written by another tool, or by fragctl before it began every trace
  /// with one).
  unknown,
  /// A fragctl CSV whose last row is an `end` row counting every row before
  /// it, or a PyTorch snapshot (read whole or refused).
  complete,
  /// A fragctl CSV that does not end with its `end` row: rows after the
  /// last one, a last row cut short, or none at all where the file promises
  /// one (its line after the header says so: tracing_adaptor). Its writer was
  /// killed (SIGKILL, the OOM killer) or ended by _exit() without
  /// fragctl_flush(); the tail it recorded is missing.
  cut,
};

/// A whole trace in memory.
struct trace {
  std::string name;    ///< file name without directories and known suffixes ("gpt2m")
  std::string format;  ///< "fragctl-csv", "pytorch-snapshot" or "rmm-csv"
  std::vector<trace_event> events;
  /// Rows read and deliberately not replayed: segment_alloc/free/map/unmap,
  /// free_completed, snapshot, oom, RMM "allocate failure".
  std::uint64_t ignored_rows = 0;
  trace_completeness completeness = trace_completeness::unknown;
  /// Cut: rows read after the last `end` row, or all of them where there is
  /// none (they are in `events`).
  std::uint64_t rows_after_end = 0;
  /// Cut: the last row had no newline and was dropped unread.
  bool cut_row = false;
};

/// What a reader tells its user about `t`'s completeness: empty for a
/// complete trace, else one sentence without the file name ("the trace is
/// cut: 3 rows follow its last end row ...; its tail is missing").
[[nodiscard]] std::string completeness_note(const trace& t);

/// What a replaying command says of a trace with no allocation or free, one
/// sentence without the file name: a report of 0 B would read as a result.
[[nodiscard]] std::string empty_trace_note(const trace& t);

/// Options of the readers.
struct trace_options {
  /// PyTorch snapshot: which entry of `device_traces` to read. -1 reads the
  /// first device that has any events (device 0 when none has).
  int device = -1;
};

/// Reads a trace file in any supported format, gzip-compressed or not
/// (detected by its magic bytes). A trace cut short (trace_completeness::cut)
/// is read, what is there, and says so in `completeness`. Errors (never throws):
///  * the file cannot be opened or read: NotFound / DataLoss naming the file;
///  * truncated or corrupt gzip data: DataLoss "<file>:<line>: ..." where
///    <line> is the line at which the data stops;
///  * an empty file, an unknown format, a malformed row: InvalidArgument
///    "<file>:<line>: <what is wrong>";
///  * a fragctl CSV `end` row that counts other than the rows before it
///    (rows lost, or several processes writing one file): DataLoss.
/// The trace's name is the file name without directories and without the
/// suffixes .gz, .csv, .json and .trace.
[[nodiscard]] absl::StatusOr<trace> read_trace(const std::string& path,
                                               const trace_options& options = {});

/// Parses a trace held in memory (uncompressed). `name` is used as the trace
/// name and as <file> in error messages. Errors as read_trace.
[[nodiscard]] absl::StatusOr<trace> parse_trace(std::string_view content, std::string name,
                                                const trace_options& options = {});

/// Writes `t` as fragctl CSV (header, then one row per event with actions
/// `alloc` and `free_requested`, then an `end` row counting them);
/// gzip-compressed when `path` ends in ".gz". A `t` read cut is written cut
/// (the line promising an end row, and no end row), so it reads cut again.
/// Ignored rows are not written. Errors: the file cannot be written.
[[nodiscard]] absl::Status write_trace_csv(const trace& t, const std::string& path);

/// The trace name read_trace derives from a path: "dir/gpt2m.trace.csv.gz" -> "gpt2m".
[[nodiscard]] std::string trace_name_from_path(std::string_view path);

/// Summary of a trace without replaying it: what the program itself held.
struct trace_summary {
  std::size_t allocs = 0;
  std::size_t frees = 0;
  std::size_t peak_live_bytes = 0;   ///< maximum over time of the bytes live per the trace (SIZE_MAX when above)
  std::size_t live_at_end = 0;       ///< blocks never freed
  std::size_t unmatched_frees = 0;   ///< frees of an address not live
  std::size_t streams = 0;           ///< distinct stream ids
  std::size_t largest_request = 0;
  std::int64_t duration_us = 0;      ///< latest time - earliest time (at most INT64_MAX)
  /// Allocations at an address still live: the trace lost that block's free
  /// (PyTorch's ring buffer drops events), or its allocator handed the
  /// address out twice. The trace's reading frees the old block first.
  std::size_t lost_frees = 0;
  /// Allocations whose bytes meet those of another live block: memory the
  /// allocator handed out twice (0 for any correct allocator; a trace a
  /// fragctl run wrote checks the allocator that ran).
  std::size_t overlapping_allocs = 0;
  /// The first one's index in trace::events (allocations and frees, from 0); SIZE_MAX: none.
  std::size_t first_overlap_event = SIZE_MAX;
};

/// Walks the trace as the program ran it (an alloc at a live address first
/// frees the old block). Pure; O(events log live blocks).
[[nodiscard]] trace_summary summarize(const trace& t);

}  // namespace fragctl
