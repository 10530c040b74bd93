// The two CSV formats: fragctl's own (PyTorch action names) and RMM's
// logging_resource_adaptor log. Columns are found by header name, so extra
// columns and another column order are accepted; every row must have as many
// fields as the header.
#include <array>
#include <optional>

#include "fragctl/adaptors.hpp"
#include "trace/formats.hpp"
#include "util/strings.hpp"

namespace fragctl::trace_detail {

namespace {

// Header columns by lower-case name; nullopt for absent ones.
template <std::size_t N>
std::array<std::optional<std::size_t>, N> find_columns(const std::vector<std::string_view>& header,
                                                       const std::array<std::string_view, N>& names,
                                                       std::string_view& twice) {
  std::array<std::optional<std::size_t>, N> at{};
  for (std::size_t i = 0; i < header.size(); ++i) {
    const std::string field = util::lower(header[i]);
    for (std::size_t k = 0; k < N; ++k) {
      if (field != names[k]) continue;
      if (at[k] && twice.empty()) twice = names[k];  // which of the two was meant cannot be told
      if (!at[k]) at[k] = i;
    }
  }
  return at;
}

// Reads the header (first non-skippable line) into `header`.
bool read_header(line_scanner& lines, std::vector<std::string_view>& header) {
  std::string_view line;
  while (lines.next(line)) {
    if (skippable(line)) continue;
    split_row(line, header);
    return true;
  }
  return false;
}

// PyTorch's actions. Only alloc and free_requested are replayed.
enum class row_kind : std::uint8_t { alloc, free, ignored, unknown };

row_kind pytorch_action(std::string_view a) noexcept {
  if (a == "alloc") return row_kind::alloc;
  if (a == "free_requested") return row_kind::free;
  for (const std::string_view ignored :
       {"free_completed", "segment_alloc", "segment_free", "segment_map", "segment_unmap",
        "snapshot", "oom", "user_defined"}) {
    if (a == ignored) return row_kind::ignored;
  }
  return row_kind::unknown;
}

row_kind rmm_action(std::string_view a) noexcept {
  if (a == "allocate") return row_kind::alloc;
  if (a == "free" || a == "deallocate") return row_kind::free;
  if (a == "allocate failure") return row_kind::ignored;
  return row_kind::unknown;
}

// RMM pointers and streams: "0x7f..", decimal, or glibc's "(nil)" for null.
bool parse_pointer(std::string_view text, std::uint64_t& out) noexcept {
  if (text == "(nil)" || text == "nil" || text == "nullptr") {
    out = 0;
    return true;
  }
  return parse_address(text, out);
}

// RMM time: spdlog's "%H:%M:%S.%f" (time of day, microseconds), or seconds
// as a decimal fraction (some RMM versions document seconds since the epoch).
bool parse_rmm_time(std::string_view text, std::int64_t& us) noexcept {
  if (text.find(':') == std::string_view::npos) {
    double seconds = 0;
    if (!util::parse_double(text, seconds) || !(seconds >= 0) || seconds > 1e12) return false;
    us = static_cast<std::int64_t>(seconds * 1e6 + 0.5);
    return true;
  }
  const std::vector<std::string_view> parts = util::split(text, ':');
  if (parts.size() != 3) return false;
  std::uint64_t hours = 0;
  std::uint64_t minutes = 0;
  if (!util::parse_u64(parts[0], hours) || !util::parse_u64(parts[1], minutes) || hours > 23 ||
      minutes > 59)
    return false;
  std::string_view sec = parts[2];
  std::string_view frac;
  if (const std::size_t dot = sec.find('.'); dot != std::string_view::npos) {
    frac = sec.substr(dot + 1);
    sec = sec.substr(0, dot);
  }
  std::uint64_t seconds = 0;
  if (!util::parse_u64(sec, seconds) || seconds > 60 || frac.size() > 9) return false;
  std::uint64_t micros = 0;
  if (!frac.empty()) {
    std::uint64_t f = 0;
    if (!util::parse_u64(frac, f)) return false;
    // Scale the fraction to six digits.
    for (std::size_t d = frac.size(); d < 6; ++d) f *= 10;
    for (std::size_t d = 6; d < frac.size(); ++d) f /= 10;
    micros = f;
  }
  us = static_cast<std::int64_t>(((hours * 60 + minutes) * 60 + seconds) * 1'000'000 + micros);
  return true;
}

}  // namespace

absl::StatusOr<trace> parse_fragctl_csv(std::string_view content, std::string_view file) {
  trace t;
  t.format = "fragctl-csv";
  line_scanner lines(content);
  std::vector<std::string_view> header;
  if (!read_header(lines, header))
    return line_error(file, 1, "the file is empty (expected the header action,addr,size,stream,time_us)");
  const std::size_t header_line = lines.line_number();
  enum { action, addr, size, stream, time_us };
  std::string_view twice;
  const auto col = find_columns<5>(header, {"action", "addr", "size", "stream", "time_us"}, twice);
  if (!twice.empty()) return line_error(file, header_line, "the header names the column '{}' twice", twice);
  for (const int required : {action, addr, size}) {
    if (!col[required])
      return line_error(file, header_line, "the header lacks the column '{}' (expected action,addr,size,stream,time_us)",
                        std::array{"action", "addr", "size"}[required]);
  }

  std::vector<std::string_view> f;
  std::string_view line;
  std::uint64_t rows = 0;               // rows read, `end` rows aside
  std::optional<std::uint64_t> ended;   // `rows` at the last `end` row
  bool promised = false;                // the file says it ends with an `end` row
  bool cut_line = false;                // a last row without its newline, in such a file
  while (lines.next(line)) {
    if (skippable(line)) {
      promised = promised || util::trim(line) == trace_end_row_promise;
      continue;
    }
    const std::size_t n = lines.line_number();
    // A writer of `end` rows ends every row with a newline: one without it
    // was cut inside the row, which may read as valid ("alloc,4096,1" of
    // "alloc,4096,1048576,0,5"), so it is dropped, never read.
    if ((promised || ended) && lines.unterminated()) {
      cut_line = true;
      break;
    }
    split_row(line, f);
    if (f.size() != header.size())
      return line_error(file, n, "expected {} columns, found {}", header.size(), f.size());
    if (f[*col[action]] == "end") {
      std::uint64_t said = 0;
      if (!util::parse_u64(f[*col[size]], said))
        return line_error(file, n, "bad row count {} in the end row", quote(f[*col[size]]));
      if (said != rows)
        return absl::DataLossError(fmt::format(
            "{}:{}: the end row counts {} rows but {} precede it: rows were lost, or several processes wrote "
            "this file (give each its own path with %p)",
            file, n, said, rows));
      ended = rows;
      continue;
    }
    ++rows;
    const row_kind kind = pytorch_action(f[*col[action]]);
    if (kind == row_kind::unknown)
      return line_error(file, n, "unknown action {} (expected alloc, free_requested, free_completed, "
                        "segment_alloc, segment_free, segment_map, segment_unmap, snapshot, oom or end)",
                        quote(f[*col[action]]));
    if (kind == row_kind::ignored) {
      ++t.ignored_rows;
      continue;
    }
    trace_event e;
    e.kind = kind == row_kind::alloc ? trace_event::action::alloc : trace_event::action::free;
    if (!parse_address(f[*col[addr]], e.addr))
      return line_error(file, n, "bad addr {} (expected a decimal or 0x-hexadecimal integer)", quote(f[*col[addr]]));
    std::uint64_t bytes = 0;
    if (!util::parse_u64(f[*col[size]], bytes))
      return line_error(file, n, "bad size {} (expected a non-negative decimal integer)", quote(f[*col[size]]));
    e.size = static_cast<std::size_t>(bytes);
    if (col[stream] && !parse_address(f[*col[stream]], e.stream))
      return line_error(file, n, "bad stream {} (expected a decimal or 0x-hexadecimal integer)", quote(f[*col[stream]]));
    if (col[time_us] && !util::parse_i64(f[*col[time_us]], e.time_us))
      return line_error(file, n, "bad time_us {} (expected a decimal integer)", quote(f[*col[time_us]]));
    t.events.push_back(e);
  }
  if (promised || ended) {
    t.rows_after_end = rows - ended.value_or(0);
    t.cut_row = cut_line;
    t.completeness =
        ended && t.rows_after_end == 0 && !cut_line ? trace_completeness::complete : trace_completeness::cut;
  }
  return t;
}

absl::StatusOr<trace> parse_rmm_csv(std::string_view content, std::string_view file) {
  trace t;
  t.format = "rmm-csv";
  line_scanner lines(content);
  std::vector<std::string_view> header;
  if (!read_header(lines, header))
    return line_error(file, 1, "the file is empty (expected the header Thread,Time,Action,Pointer,Size,Stream)");
  const std::size_t header_line = lines.line_number();
  enum { time, action, pointer, size, stream };
  std::string_view twice;
  const auto col = find_columns<5>(header, {"time", "action", "pointer", "size", "stream"}, twice);
  if (!twice.empty()) return line_error(file, header_line, "the header names the column '{}' twice", twice);
  for (const int required : {action, pointer, size}) {
    if (!col[required])
      return line_error(file, header_line, "the header lacks the column '{}' (expected Thread,Time,Action,Pointer,Size,Stream)",
                        std::array{"Time", "Action", "Pointer", "Size"}[required]);
  }

  // Times of day wrap at midnight; a step back of over 12 hours is a new day.
  constexpr std::int64_t day_us = 86'400'000'000;
  std::int64_t day_offset = 0;
  std::int64_t last_us = 0;
  bool time_of_day = false;

  std::vector<std::string_view> f;
  std::string_view line;
  while (lines.next(line)) {
    if (skippable(line)) continue;
    const std::size_t n = lines.line_number();
    split_row(line, f);
    if (f.size() != header.size())
      return line_error(file, n, "expected {} columns, found {}", header.size(), f.size());
    const row_kind kind = rmm_action(f[*col[action]]);
    if (kind == row_kind::unknown)
      return line_error(file, n, "unknown action {} (expected allocate, free or allocate failure)",
                        quote(f[*col[action]]));
    if (kind == row_kind::ignored) {
      ++t.ignored_rows;
      continue;
    }
    trace_event e;
    e.kind = kind == row_kind::alloc ? trace_event::action::alloc : trace_event::action::free;
    if (!parse_pointer(f[*col[pointer]], e.addr))
      return line_error(file, n, "bad Pointer {} (expected 0x-hexadecimal)", quote(f[*col[pointer]]));
    std::uint64_t bytes = 0;
    if (!util::parse_u64(f[*col[size]], bytes))
      return line_error(file, n, "bad Size {} (expected a non-negative decimal integer)", quote(f[*col[size]]));
    e.size = static_cast<std::size_t>(bytes);
    if (col[stream] && !parse_pointer(f[*col[stream]], e.stream))
      return line_error(file, n, "bad Stream {} (expected 0x-hexadecimal)", quote(f[*col[stream]]));
    if (col[time]) {
      const std::string_view text = f[*col[time]];
      std::int64_t us = 0;
      if (!parse_rmm_time(text, us))
        return line_error(file, n, "bad Time {} (expected HH:MM:SS.microseconds or seconds)", quote(text));
      time_of_day = text.find(':') != std::string_view::npos;
      if (time_of_day && us + day_offset < last_us - day_us / 2) day_offset += day_us;
      e.time_us = us + (time_of_day ? day_offset : 0);
      last_us = e.time_us;
    }
    t.events.push_back(e);
  }
  return t;
}

}  // namespace fragctl::trace_detail
