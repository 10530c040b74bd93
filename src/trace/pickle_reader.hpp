// Internal to the trace layer: a reader of Python pickles of plain data, for
// the PyTorch memory snapshots that torch.cuda.memory._dump_snapshot() writes.
//
// Theory. A pickle is a program for a stack machine; Python's unpickler runs
// it and may import and call anything (GLOBAL, REDUCE, ...). This reader
// runs only the opcodes that build plain data (protocols 2 to 5): dict,
// list, tuple, str, bytes, int, float, bool, None, the mark stack and the
// memo. Every opcode that would construct an object is refused with its name
// and byte offset, never executed. The machine builds a flat table of nodes
// (containers hold node ids), so the memo shares objects as Python does: a
// list memoized while empty and filled afterwards is seen filled by every
// later GET. Memory while reading is proportional to the input. The table is
// then turned into JSON the way json.dump would write it (tuples as lists,
// int, bool and None dict keys as strings); shared nodes are copied there, so
// that step is where the depth limit (which also stops cycles) and the size
// limit (which stops exponential sharing) apply. The size limit counts the
// heap the JSON takes, so the reader's memory is the limit plus its tables
// (up to about 60 bytes per byte of input, for the most degenerate
// pickles measured).
#pragma once

#include <cstddef>
#include <functional>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace fragctl::trace_detail {

/// Which dict entries to keep: called with the depth of the dict (1 for the
/// top-level one, as nlohmann's parser callbacks count) and the key; an entry
/// is dropped, value and all, when it returns false.
using pickle_key_filter = std::function<bool(std::size_t depth, std::string_view key)>;

struct pickle_options {
  /// Deepest nesting of containers accepted (a cycle counts as too deep).
  std::size_t max_depth = 256;
  /// Largest result accepted, counted as the heap the JSON takes (each
  /// string, array, object and entry at its size in nlohmann's json, plus
  /// malloc's overhead); 0: 16 times the input size plus 64 MiB.
  std::size_t max_output_bytes = 0;
  /// Entries to keep; empty keeps everything.
  pickle_key_filter keep;
};

/// True when `content` starts like a pickle of protocol 2 or above: with
/// the PROTO opcode (0x80). The protocol itself is checked by read_pickle.
[[nodiscard]] bool looks_like_pickle(std::string_view content) noexcept;

/// Reads the pickle in `content` as JSON. Errors are InvalidArgument
/// "<file>: pickle byte N: what", naming the opcode where one is at fault:
/// a refused or unknown opcode, truncated input, a bad memo index, a stack
/// misuse, an integer outside int64/uint64, a dict key that is not a str,
/// int, bool or None, or a limit of `options` exceeded. Never throws.
[[nodiscard]] absl::StatusOr<nlohmann::json> read_pickle(std::string_view content, std::string_view file,
                                                         const pickle_options& options = {});

}  // namespace fragctl::trace_detail
