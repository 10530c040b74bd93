// Reading a trace file: decompression (zlib reads plain files too), format
// detection, and the helpers the per-format parsers share.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <new>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "fragctl/trace.hpp"
#include "trace/formats.hpp"
#include "trace/pickle_reader.hpp"
#include "util/strings.hpp"
#include "zlib.h"

namespace fragctl {

namespace trace_detail {

bool line_scanner::next(std::string_view& line) noexcept {
  if (rest_.empty()) return false;
  const std::size_t end = rest_.find('\n');
  unterminated_ = end == std::string_view::npos;
  if (unterminated_) {
    line = rest_;
    rest_ = {};
  } else {
    line = rest_.substr(0, end);
    rest_.remove_prefix(end + 1);
  }
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  ++number_;
  return true;
}

void split_row(std::string_view line, std::vector<std::string_view>& out) {
  out.clear();
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = line.find(',', start);
    if (comma == std::string_view::npos) {
      out.push_back(util::trim(line.substr(start)));
      return;
    }
    out.push_back(util::trim(line.substr(start, comma - start)));
    start = comma + 1;
  }
}

bool skippable(std::string_view line) noexcept {
  const std::string_view t = util::trim(line);
  return t.empty() || t.front() == '#';
}

bool parse_address(std::string_view text, std::uint64_t& out) noexcept {
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    text.remove_prefix(2);
    if (text.empty() || text.size() > 16) return false;
    std::uint64_t value = 0;
    for (const char c : text) {
      int digit = 0;
      if (c >= '0' && c <= '9') {
        digit = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        digit = c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        digit = c - 'A' + 10;
      } else {
        return false;
      }
      value = value << 4 | static_cast<std::uint64_t>(digit);
    }
    out = value;
    return true;
  }
  return util::parse_u64(text, out);
}

// Shown escaped (util::printable): a NUL byte in a field cut the message
// there once it reached the terminal as a C string.
std::string quote(std::string_view text) {
  constexpr std::size_t max = 60;
  if (text.size() <= max) return fmt::format("'{}'", util::printable(text));
  return fmt::format("'{}...'", util::printable(text.substr(0, max)));
}

absl::StatusOr<format_kind> detect_format(std::string_view content, std::string_view file) {
  if (looks_like_pickle(content)) return format_kind::pytorch_snapshot;
  line_scanner lines(content);
  std::string_view line;
  while (lines.next(line)) {
    const std::string_view t = util::trim(line);
    if (t.empty()) continue;
    if (t.front() == '{') return format_kind::pytorch_snapshot;
    if (t.front() == '#') continue;
    std::vector<std::string_view> fields;
    split_row(t, fields);
    std::set<std::string> names;
    for (const std::string_view f : fields) names.insert(util::lower(f));
    if (names.count("action") != 0 && names.count("addr") != 0) return format_kind::fragctl_csv;
    if (names.count("action") != 0 && names.count("pointer") != 0) return format_kind::rmm_csv;
    return line_error(file, lines.line_number(),
                      "unknown trace format: first line is {} (expected the fragctl CSV header "
                      "'action,addr,size,stream,time_us', the RMM log header "
                      "'Thread,Time,Action,Pointer,Size,Stream', or a PyTorch snapshot JSON "
                      "object)",
                      quote(t));
  }
  return line_error(file, std::max<std::size_t>(lines.line_number(), 1),
                    "the file is empty (expected a fragctl CSV, an RMM log CSV or a PyTorch "
                    "snapshot JSON)");
}

}  // namespace trace_detail

namespace {

struct gz_closer {
  void operator()(gzFile f) const noexcept { gzclose(f); }
};
using gz_file = std::unique_ptr<gzFile_s, gz_closer>;

std::size_t count_lines(std::string_view s) {
  return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n')) + 1;
}

// What the start of a file read so far shows: that it may be a trace (read
// on), that it is none (an error), or nothing yet.
enum class start_verdict : std::uint8_t { trace, undecided };

// The first line that is neither blank nor a comment longer than this, with
// no line end yet and not opening a JSON snapshot, is no trace's header; nor
// is a file whose first significant line does not start within
// longest_preamble bytes (blank lines and comments only before it).
constexpr std::size_t longest_first_line = std::size_t{64} << 10;
constexpr std::size_t longest_preamble = std::size_t{1} << 20;

// How far judge_start has looked: the blank and comment lines before `pos`
// are behind it, so each byte is looked at once however the file comes in.
struct start_scan {
  std::size_t pos = 0;
  std::size_t line = 1;  // the line that starts at pos
};

// Judges the start of a file as read so far, so that a file that is no
// trace fails on its first chunk instead of being read whole: /dev/zero, a
// model checkpoint passed by mistake, a gzip bomb of zeros or of blank
// lines. A trace is known by its first significant line (its header, or the
// '{' of a JSON snapshot) or its first bytes (a pickled snapshot);
// detect_format judges that line as it judges a whole file, with the same
// message and line number.
absl::StatusOr<start_verdict> judge_start(std::string_view content, std::string_view file, start_scan& scan) {
  const std::size_t body = content.substr(0, 3) == "\xEF\xBB\xBF" ? 3 : 0;  // after a UTF-8 mark
  if (trace_detail::looks_like_pickle(content.substr(body))) return start_verdict::trace;
  scan.pos = std::max(scan.pos, body);
  const auto no_header = [&] {
    return trace_detail::line_error(file, scan.line,
                                    "unknown trace format: no header in its first {} MiB, only blank and comment "
                                    "lines (expected a fragctl CSV, an RMM log CSV or a PyTorch snapshot)",
                                    longest_preamble >> 20);
  };
  while (scan.pos < content.size()) {
    if (scan.pos >= longest_preamble) return no_header();
    const std::size_t end = content.find('\n', scan.pos);
    const std::size_t stop = end == std::string_view::npos ? content.size() : end;
    const std::string_view text = util::trim(content.substr(scan.pos, stop - scan.pos));
    const bool significant = !text.empty() && text.front() != '#';
    if (end == std::string_view::npos) {  // the line goes on past what was read
      if (significant && text.front() == '{') return start_verdict::trace;
      if (!significant) {  // a blank or comment line that has not ended: the header comes later
        if (content.size() >= longest_preamble) return no_header();
        return start_verdict::undecided;
      }
      if (content.size() - scan.pos <= longest_first_line) return start_verdict::undecided;
      return trace_detail::line_error(file, scan.line,
                                      "unknown trace format: its first line runs past {} KiB with no line end "
                                      "(expected a fragctl CSV, an RMM log CSV or a PyTorch snapshot)",
                                      longest_first_line >> 10);
    }
    if (significant) {
      const auto kind = trace_detail::detect_format(content.substr(body, end + 1 - body), file);
      if (!kind.ok()) return kind.status();
      return start_verdict::trace;
    }
    scan.pos = end + 1;
    ++scan.line;
  }
  return start_verdict::undecided;
}

// The whole file, decompressed when it is gzip; read no further than its
// start once that shows it is no trace (judge_start).
absl::StatusOr<std::string> read_content(const std::string& path) {
  errno = 0;
  gz_file file(gzopen(path.c_str(), "rb"));
  if (!file) {
    const int err = errno;
    const std::string why = err != 0 ? std::strerror(err) : "out of memory";
    if (err == ENOENT) return absl::NotFoundError(fmt::format("{}: cannot open: {}", path, why));
    return absl::PermissionDeniedError(fmt::format("{}: cannot open: {}", path, why));
  }
  gzbuffer(file.get(), 1 << 18);
  std::string content;
  bool judged = false;  // the start showed a trace: read on without looking
  start_scan scan;
  constexpr unsigned chunk = 1u << 20;
  for (;;) {
    const std::size_t old = content.size();
    content.resize(old + chunk);
    const int n = gzread(file.get(), content.data() + old, chunk);
    content.resize(old + static_cast<std::size_t>(std::max(n, 0)));
    int code = Z_OK;
    const char* message = gzerror(file.get(), &code);
    if (n < 0 || (code != Z_OK && code != Z_STREAM_END)) {
      const std::size_t line = count_lines(content);
      if (code == Z_ERRNO)
        return absl::DataLossError(fmt::format("{}: cannot read: {}", path, std::strerror(errno)));
      if (code == Z_BUF_ERROR)
        return absl::DataLossError(fmt::format(
            "{}:{}: the gzip data is truncated (the compressed file ends before its data does)",
            path, line));
      // zlib's message begins with the path it was opened as: said once.
      std::string_view why = message != nullptr ? message : "unknown";
      if (why.starts_with(path) && why.substr(path.size()).starts_with(": ")) why.remove_prefix(path.size() + 2);
      return absl::DataLossError(fmt::format("{}:{}: corrupt gzip data: {}", path, line, why));
    }
    if (n == 0) break;
    if (!judged) {
      const auto verdict = judge_start(content, path, scan);
      if (!verdict.ok()) return verdict.status();
      judged = *verdict == start_verdict::trace;
    }
  }
  return content;
}

absl::StatusOr<trace> parse_labelled(std::string_view content, std::string_view file,
                                     const trace_options& options) {
  using namespace trace_detail;
  if (content.size() >= 3 && content.substr(0, 3) == "\xEF\xBB\xBF") content.remove_prefix(3);
  auto kind = detect_format(content, file);
  if (!kind.ok()) return kind.status();
  switch (*kind) {
    case format_kind::fragctl_csv: return parse_fragctl_csv(content, file);
    case format_kind::rmm_csv: return parse_rmm_csv(content, file);
    case format_kind::pytorch_snapshot: return parse_pytorch_snapshot(content, file, options);
  }
  return absl::InternalError("unreachable");
}

}  // namespace

std::string empty_trace_note(const trace& t) {
  return fmt::format("no allocation or free to replay ({} other rows): nothing was recorded, or the recording "
                     "process ended before writing its rows (docs/traces.md)",
                     t.ignored_rows);
}

std::string completeness_note(const trace& t) {
  switch (t.completeness) {
    case trace_completeness::complete: return {};
    case trace_completeness::cut: {
      std::string what;
      if (t.rows_after_end != 0)
        what = fmt::format("{} row{} that no end row counts", t.rows_after_end, t.rows_after_end == 1 ? "" : "s");
      if (t.cut_row) what += fmt::format("{}a last row cut short", what.empty() ? "" : ", ");
      if (what.empty()) what = "no end row";
      return fmt::format(
          "the trace is cut ({}): the recording process was killed (SIGKILL, the OOM killer) or "
          "ended by _exit without fragctl_flush; its tail is missing",
          what);
    }
    case trace_completeness::unknown: break;
  }
  if (t.format == "fragctl-csv")
    return "the trace has no end row, so it cannot show that it is whole (another tool or an older fragctl wrote "
           "it; fragctl's own traces begin with one)";
  return fmt::format("a trace in the {} format has no end marker, so it cannot show that it is whole", t.format);
}

std::string trace_name_from_path(std::string_view path) {
  const std::size_t slash = path.find_last_of('/');
  std::string_view name = slash == std::string_view::npos ? path : path.substr(slash + 1);
  for (const std::string_view suffix : {".gz", ".csv", ".json", ".pickle", ".pkl", ".log", ".trace"}) {
    if (name.size() > suffix.size() && util::lower(name.substr(name.size() - suffix.size())) == suffix)
      name.remove_suffix(suffix.size());
  }
  return std::string(name);
}

absl::StatusOr<trace> read_trace(const std::string& path, const trace_options& options) {
  // The whole file is held in memory, decompressed: a gzip bomb, or a trace
  // larger than the machine, ends here with the file named rather than as a
  // bare std::bad_alloc.
  try {
    auto content = read_content(path);
    if (!content.ok()) return content.status();
    auto parsed = parse_labelled(*content, path, options);
    if (parsed.ok()) parsed->name = trace_name_from_path(path);
    return parsed;
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(fmt::format(
        "{}: the trace does not fit in memory once decompressed (a gzip bomb, or a trace larger than this "
        "machine can hold)",
        path));
  }
}

absl::StatusOr<trace> parse_trace(std::string_view content, std::string name,
                                  const trace_options& options) {
  auto parsed = parse_labelled(content, name, options);
  if (parsed.ok()) parsed->name = std::move(name);
  return parsed;
}

namespace {

// Live bytes of a trace as a 128-bit count: each size may be up to 2^64 - 1
// and a trace holds many, so a 64-bit sum would wrap.
struct wide_count {
  std::uint64_t high = 0;
  std::uint64_t low = 0;
  wide_count& operator+=(std::uint64_t v) noexcept {
    low += v;
    if (low < v) ++high;
    return *this;
  }
  wide_count& operator-=(std::uint64_t v) noexcept {
    if (low < v) --high;
    low -= v;
    return *this;
  }
  [[nodiscard]] std::size_t saturated() const noexcept { return high != 0 ? SIZE_MAX : low; }
};

}  // namespace

trace_summary summarize(const trace& t) {
  trace_summary s;
  // Live blocks by address, in address order: a new block meets a live one
  // only if it meets its neighbour below or above.
  std::map<std::uint64_t, std::size_t> live;
  absl::flat_hash_map<std::uint64_t, bool> streams;
  wide_count live_bytes;
  const auto meets = [&](std::map<std::uint64_t, std::size_t>::const_iterator above, std::uint64_t addr,
                         std::size_t size) {
    // By the distance from the lower start, not by ends: a block may end
    // at 2^64 or past it (a trace's numbers are its file's), and its end
    // would wrap to a low address. A block of 0 bytes still holds its
    // address (two at one address are one handed out twice).
    if (above != live.end() && above->first - addr < std::max<std::size_t>(size, 1)) return true;
    if (above == live.begin()) return false;
    const auto below = std::prev(above);
    return addr - below->first < std::max<std::size_t>(below->second, 1);
  };
  std::int64_t earliest = INT64_MAX, latest = INT64_MIN;
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const trace_event& e = t.events[i];
    earliest = std::min(earliest, e.time_us);
    latest = std::max(latest, e.time_us);
    streams.try_emplace(e.stream, true);
    if (e.kind == trace_event::action::alloc) {
      ++s.allocs;
      s.largest_request = std::max(s.largest_request, e.size);
      if (const auto old = live.find(e.addr); old != live.end()) {
        ++s.lost_frees;
        live_bytes -= old->second;
        live.erase(old);
      }
      const auto above = live.lower_bound(e.addr);
      if (meets(above, e.addr, e.size) && s.overlapping_allocs++ == 0) s.first_overlap_event = i;
      live.emplace_hint(above, e.addr, e.size);
      live_bytes += e.size;
      s.peak_live_bytes = std::max(s.peak_live_bytes, live_bytes.saturated());
    } else {
      ++s.frees;
      const auto it = live.find(e.addr);
      if (it == live.end()) {
        ++s.unmatched_frees;
        continue;
      }
      live_bytes -= it->second;
      live.erase(it);
    }
  }
  s.live_at_end = live.size();
  s.streams = streams.size();
  // Unsigned: from INT64_MIN to INT64_MAX wraps a signed difference (and a
  // trace's times need not be in order).
  if (!t.events.empty()) {
    const std::uint64_t span = static_cast<std::uint64_t>(latest) - static_cast<std::uint64_t>(earliest);
    s.duration_us = static_cast<std::int64_t>(std::min<std::uint64_t>(span, INT64_MAX));
  }
  return s;
}

}  // namespace fragctl
