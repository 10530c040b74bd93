// The trace readers: each format on good input, every kind of malformed
// input (the message names the line), gzip, and the CSV writer round trip.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <string>

#include "fragctl/adaptors.hpp"
#include "fragctl/trace.hpp"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "support/test_support.hpp"
#include "zlib.h"

namespace fragctl {
namespace {

using fragctl::testing::test_data;

using ::testing::HasSubstr;
using action = trace_event::action;

std::string temp_path(const std::string& file) {
  return (std::filesystem::path(::testing::TempDir()) / file).string();
}

std::string message_of(const absl::Status& s) { return std::string(s.message()); }

TEST(TraceReader, FragctlCsv) {
  auto t = read_trace(test_data("tiny_fragctl.csv"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->name, "tiny_fragctl");
  EXPECT_EQ(t->format, "fragctl-csv");
  ASSERT_EQ(t->events.size(), 6u);
  EXPECT_EQ(t->ignored_rows, 2u);  // segment_alloc, free_completed
  EXPECT_EQ(t->events[0], (trace_event{action::alloc, 1048576, 1024, 0, 11}));
  EXPECT_EQ(t->events[2], (trace_event{action::free, 1048576, 1024, 0, 13}));
  EXPECT_EQ(t->events[3], (trace_event{action::alloc, 4194304, 3000000, 7, 15}));
  EXPECT_EQ(t->events[5], (trace_event{action::free, 4194304, 3000000, 7, 17}));
}

TEST(TraceReader, FragctlCsvAcceptsOtherColumnOrderHexAndCrlf) {
  auto t = parse_trace("size,action,addr\r\n\r\n# a comment\r\n512,alloc,0x1000\r\n512,free_requested,4096\r\n",
                       "inline");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->events.size(), 2u);
  EXPECT_EQ(t->events[0], (trace_event{action::alloc, 0x1000, 512, 0, 0}));
  EXPECT_EQ(t->events[1], (trace_event{action::free, 0x1000, 512, 0, 0}));
}

TEST(TraceReader, PytorchSnapshotReadsFirstDeviceWithEvents) {
  auto t = read_trace(test_data("tiny_snapshot.json"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->name, "tiny_snapshot");
  EXPECT_EQ(t->format, "pytorch-snapshot");
  ASSERT_EQ(t->events.size(), 3u);
  EXPECT_EQ(t->ignored_rows, 3u);  // segment_alloc, free_completed, snapshot
  EXPECT_EQ(t->events[0], (trace_event{action::alloc, 139637976727552, 512, 0, 1700000000000101}));
  EXPECT_EQ(t->events[1],
            (trace_event{action::alloc, 139637976728064, 1536, 94558913184032, 1700000000000102}));
  EXPECT_EQ(t->events[2].kind, action::free);
}

TEST(TraceReader, PytorchSnapshotOtherDevice) {
  auto t = read_trace(test_data("tiny_snapshot.json"), trace_options{.device = 1});
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->events.size(), 1u);
  EXPECT_EQ(t->events[0], (trace_event{action::alloc, 140000000000000, 4096, 0, 5}));

  auto missing = read_trace(test_data("tiny_snapshot.json"), trace_options{.device = 4});
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(message_of(missing.status()), HasSubstr("2 device(s)"));
}

TEST(TraceReader, RmmCsv) {
  auto t = read_trace(test_data("tiny_rmm.csv"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->format, "rmm-csv");
  ASSERT_EQ(t->events.size(), 4u);
  EXPECT_EQ(t->ignored_rows, 1u);  // allocate failure
  EXPECT_EQ(t->events[0].kind, action::alloc);
  EXPECT_EQ(t->events[0].addr, 0x7f8a40000000u);
  EXPECT_EQ(t->events[0].size, 1024u);
  EXPECT_EQ(t->events[0].stream, 0u);
  EXPECT_EQ(t->events[1].stream, 0x7f8a38001020u);
  EXPECT_EQ(t->events[2].kind, action::free);
  // Times are monotonic across midnight: 23:59:59.999 -> 00:00:00.00025.
  EXPECT_EQ(t->events[2].time_us - t->events[0].time_us, 1250);
  EXPECT_EQ(t->events[3].time_us - t->events[0].time_us, 3000);
}

TEST(TraceReader, RmmSecondsTimestamps) {
  auto t = parse_trace("Thread,Time,Action,Pointer,Size,Stream\n"
                       "1,1634567890.123456,allocate,0x7f8a40000000,1024,0x7f8a38001020\n"
                       "1,1634567890.345678,deallocate,0x7f8a40000000,1024,0x7f8a38001020\n",
                       "inline");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->events.size(), 2u);
  EXPECT_EQ(t->events[1].time_us - t->events[0].time_us, 222222);
}

struct malformed_case {
  const char* name;
  const char* content;
  const char* expected;  // substring of the message, line number included
};

void PrintTo(const malformed_case& c, std::ostream* os) { *os << c.name; }

class MalformedTrace : public ::testing::TestWithParam<malformed_case> {};

TEST_P(MalformedTrace, NamesFileAndLine) {
  auto t = parse_trace(GetParam().content, "bad.csv");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(message_of(t.status()), HasSubstr(GetParam().expected));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, MalformedTrace,
    ::testing::Values(
        malformed_case{"bad_addr", "action,addr,size,stream,time_us\nalloc,1,2,0,0\nalloc,12x,2,0,0\n",
                       "bad.csv:3: bad addr '12x'"},
        malformed_case{"bad_size", "action,addr,size,stream,time_us\nalloc,1,-5,0,0\n", "bad.csv:2: bad size '-5'"},
        malformed_case{"bad_time", "action,addr,size,stream,time_us\nalloc,1,2,0,soon\n", "bad.csv:2: bad time_us"},
        malformed_case{"column_count", "action,addr,size,stream,time_us\nalloc,1,2,0,0\n\nalloc,1,2,0\n",
                       "bad.csv:4: expected 5 columns, found 4"},
        malformed_case{"unknown_action", "action,addr,size,stream,time_us\nmalloc,1,2,0,0\n", "bad.csv:2: unknown action 'malloc'"},
        malformed_case{"missing_column", "action,addr,stream\nalloc,1,0\n", "bad.csv:1: the header lacks the column 'size'"},
        malformed_case{"empty", "", "bad.csv:1: the file is empty"},
        malformed_case{"blank_lines_only", "\n  \n", "bad.csv:2: the file is empty"},
        malformed_case{"unknown_format", "time,what\n1,2\n", "bad.csv:1: unknown trace format"},
        malformed_case{"rmm_bad_pointer", "Thread,Time,Action,Pointer,Size,Stream\n1,00:00:01.5,allocate,0xZZ,8,0x0\n",
                       "bad.csv:2: bad Pointer '0xZZ'"},
        malformed_case{"rmm_bad_time", "Thread,Time,Action,Pointer,Size,Stream\n1,25:00:01.5,allocate,0x10,8,0x0\n",
                       "bad.csv:2: bad Time '25:00:01.5'"},
        malformed_case{"rmm_unknown_action", "Thread,Time,Action,Pointer,Size,Stream\n1,00:00:01.5,reallocate,0x10,8,0x0\n",
                       "bad.csv:2: unknown action 'reallocate'"},
        malformed_case{"invalid_json", "{\n  \"device_traces\": [\n    [ {\"action\": \"alloc\",, } ]\n  ]\n}\n",
                       "bad.csv:3: invalid JSON"},
        malformed_case{"json_without_device_traces", "{\"segments\": []}\n", "bad.csv:1: a JSON trace must be a PyTorch memory snapshot"},
        malformed_case{"json_bad_addr", "{\"device_traces\": [[{\"action\": \"alloc\", \"addr\": \"x\", \"size\": 1}]]}",
                       "bad.csv: device_traces[0][0]: 'alloc' event without a non-negative integer 'addr'"},
        // Issue 18: negative integers became 2^64 - n.
        malformed_case{"json_negative_size", "{\"device_traces\": [[{\"action\": \"alloc\", \"addr\": 1, \"size\": -1}]]}",
                       "bad.csv: device_traces[0][0]: 'alloc' event without a non-negative integer 'addr' and 'size'"},
        malformed_case{"json_negative_addr", "{\"device_traces\": [[{\"action\": \"alloc\", \"addr\": -512, \"size\": 1}]]}",
                       "bad.csv: device_traces[0][0]: 'alloc' event without a non-negative integer"},
        malformed_case{"json_negative_stream",
                       "{\"device_traces\": [[{\"action\": \"alloc\", \"addr\": 1, \"size\": 1, \"stream\": -7}]]}",
                       "bad.csv: device_traces[0][0]: 'stream' is not a non-negative integer"},
        malformed_case{"json_negative_time",
                       "{\"device_traces\": [[{\"action\": \"alloc\", \"addr\": 1, \"size\": 1, \"time_us\": -3}]]}",
                       "bad.csv: device_traces[0][0]: 'time_us' is not a non-negative integer"},
        malformed_case{"json_unknown_action", "{\"device_traces\": [[{\"action\": \"grow\", \"addr\": 1, \"size\": 1}]]}",
                       "bad.csv: device_traces[0][0]: unknown action 'grow'"}),
    [](const ::testing::TestParamInfo<malformed_case>& p) { return std::string(p.param.name); });

TEST(TraceReader, MissingFileIsNotFound) {
  auto t = read_trace(temp_path("does-not-exist.csv"));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(message_of(t.status()), HasSubstr("does-not-exist.csv: cannot open"));
}

trace sample_trace() {
  trace t;
  for (std::uint64_t i = 0; i < 2000; ++i) {
    t.events.push_back({action::alloc, 0x7f0000000000 + i * 4096, 1000 + i, i % 3, std::int64_t(i)});
    if (i % 2 == 1) t.events.push_back({action::free, 0x7f0000000000 + (i - 1) * 4096, 999 + i, 0, std::int64_t(i)});
  }
  return t;
}

TEST(TraceWriter, RoundTripPlainAndGzip) {
  const trace original = sample_trace();
  for (const char* file : {"round_trip.csv", "round_trip.trace.csv.gz"}) {
    const std::string path = temp_path(file);
    ASSERT_TRUE(write_trace_csv(original, path).ok());
    auto back = read_trace(path);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->name, "round_trip");
    EXPECT_EQ(back->format, "fragctl-csv");
    EXPECT_EQ(back->events, original.events);
  }
  // The .gz file really is compressed: it starts with gzip's magic bytes.
  std::ifstream in(temp_path("round_trip.trace.csv.gz"), std::ios::binary);
  char magic[2] = {};
  in.read(magic, 2);
  EXPECT_EQ(static_cast<unsigned char>(magic[0]), 0x1f);
  EXPECT_EQ(static_cast<unsigned char>(magic[1]), 0x8b);
}

TEST(TraceReader, TruncatedGzipNamesTheLine) {
  const std::string path = temp_path("truncated.csv.gz");
  ASSERT_TRUE(write_trace_csv(sample_trace(), path).ok());
  const auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, size / 2);
  auto t = read_trace(path);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(message_of(t.status()), ::testing::MatchesRegex(".*truncated\\.csv\\.gz:[0-9]+: the gzip data is truncated.*"));
}

// Issue 16 item 4: a truncated or interleaved trace of the tracing adaptor
// must be detectable; a file without `end` rows (older recordings, other
// tools) reads as before, its completeness unknown. Issue 27 M3: a cut trace
// is read, what it holds, and says it is cut (it was a DataLoss error when it
// had an earlier `end` row, and read as whole when it had none).
TEST(TraceReader, EndRowsTellCompleteCutAndInterleavedTraces) {
  const std::string head = "action,addr,size,stream,time_us\nalloc,4096,10,0,1\noom,0,99,0,2\n";
  auto complete = parse_trace(head + "end,0,2,0,3\nfree_requested,4096,10,0,4\nend,0,3,0,5\n", "ok.csv");
  ASSERT_TRUE(complete.ok()) << complete.status();
  EXPECT_EQ(complete->events.size(), 2u);
  EXPECT_EQ(complete->completeness, trace_completeness::complete);
  EXPECT_EQ(completeness_note(*complete), "");

  auto old = parse_trace(head, "old.csv");
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->completeness, trace_completeness::unknown);
  EXPECT_THAT(completeness_note(*old), HasSubstr("no end row, so it cannot show that it is whole"));

  auto cut = parse_trace(head + "end,0,2,0,3\nfree_requested,4096,10,0,4\n", "cut.csv");
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_EQ(cut->events.size(), 2u);  // what it holds
  EXPECT_EQ(cut->completeness, trace_completeness::cut);
  EXPECT_EQ(cut->rows_after_end, 1u);
  EXPECT_THAT(completeness_note(*cut), HasSubstr("the trace is cut (1 row that no end row counts)"));

  auto interleaved = parse_trace(head + "alloc,8192,10,0,3\nend,0,2,0,3\n", "mixed.csv");
  ASSERT_FALSE(interleaved.ok());
  EXPECT_TRUE(absl::IsDataLoss(interleaved.status()));
  EXPECT_THAT(message_of(interleaved.status()), HasSubstr("mixed.csv:5: the end row counts 2 rows but 3 precede it"));
}

// Issue 27 M3: what the tracing adaptor writes after the header promises an
// end row, so a trace killed before its first flush (only rows, or nothing,
// after the header) reads as cut rather than as a whole run, and a last row
// cut short (no newline) is dropped unread rather than read as a smaller one.
TEST(TraceReader, APromisedEndRowThatNeverCameIsACutTrace) {
  const std::string head = "action,addr,size,stream,time_us\n" + std::string(trace_end_row_promise) + "\n";
  auto nothing = parse_trace(head, "killed_early.csv");
  ASSERT_TRUE(nothing.ok()) << nothing.status();
  EXPECT_EQ(nothing->completeness, trace_completeness::cut);
  EXPECT_THAT(completeness_note(*nothing), HasSubstr("the trace is cut (no end row)"));

  auto rows = parse_trace(head + "alloc,4096,10,0,1\nalloc,8192,1048576,0,2\nalloc,9", "killed.csv");
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->completeness, trace_completeness::cut);
  EXPECT_EQ(rows->events.size(), 2u);
  EXPECT_EQ(rows->rows_after_end, 2u);
  EXPECT_TRUE(rows->cut_row);
  EXPECT_THAT(completeness_note(*rows), HasSubstr("(2 rows that no end row counts, a last row cut short)"));

  // Positive control: the same rows closed by their end row.
  auto whole = parse_trace(head + "alloc,4096,10,0,1\nalloc,8192,1048576,0,2\nend,0,2,0,3\n", "whole.csv");
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->completeness, trace_completeness::complete);
  // A file without the promise or an end row keeps its last line without a newline.
  auto hand_written = parse_trace("action,addr,size,stream,time_us\nalloc,4096,10,0,1", "hand.csv");
  ASSERT_TRUE(hand_written.ok()) << hand_written.status();
  EXPECT_EQ(hand_written->events.size(), 1u);
  EXPECT_EQ(hand_written->completeness, trace_completeness::unknown);
}

// Regression (issue 18): the peak of live bytes wrapped past 2^64.
TEST(TraceSummary, PeakSaturatesInsteadOfWrapping) {
  trace t;
  const std::size_t huge = SIZE_MAX / 2 + 10;
  t.events = {{action::alloc, 1, huge, 0, 0}, {action::alloc, 2, huge, 0, 1}, {action::free, 2, huge, 0, 2}};
  EXPECT_EQ(summarize(t).peak_live_bytes, SIZE_MAX);
  t.events.pop_back();
  t.events.pop_back();
  EXPECT_EQ(summarize(t).peak_live_bytes, huge);  // positive control
}

// A sanitizer's shadow memory does not fit under an address-space cap.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool under_sanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool under_sanitizer = true;
#else
constexpr bool under_sanitizer = false;
#endif
#else
constexpr bool under_sanitizer = false;
#endif

// Runs check(read_trace(path)) in a child whose address space is capped
// 128 MiB above what it holds, so that a reader that reads a whole endless
// or huge file runs out of memory quickly instead of filling the machine;
// whether the child's check held.
template <class Check>
bool holds_under_memory_cap(const std::string& path, Check check) {
  const pid_t child = ::fork();
  if (child < 0) return false;
  if (child == 0) {
    rlimit cap{};
    ::getrlimit(RLIMIT_AS, &cap);
    std::ifstream maps("/proc/self/statm");
    std::size_t pages = 0;
    maps >> pages;
    cap.rlim_cur = pages * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)) + (128u << 20);
    if (::setrlimit(RLIMIT_AS, &cap) != 0) std::_Exit(2);  // no cap: the check would mean nothing
    ::alarm(60);  // a reader stuck on an endless file fails instead of hanging the suite
    std::_Exit(check(read_trace(path)) ? 0 : 1);
  }
  int status = 0;
  if (::waitpid(child, &status, 0) != child) return false;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// Writes a gzip file of `head` followed by `mib` MiB of `fill` bytes.
void write_gzip(const std::string& path, const std::string& head, char fill, int mib) {
  gzFile out = gzopen(path.c_str(), "wb1");
  ASSERT_NE(out, nullptr);
  if (!head.empty()) gzwrite(out, head.data(), static_cast<unsigned>(head.size()));
  const std::string block(1 << 20, fill);
  for (int i = 0; i < mib; ++i) gzwrite(out, block.data(), static_cast<unsigned>(block.size()));
  gzclose(out);
}

// Regression (issue 18): a gzip bomb gave std::bad_alloc without naming the
// file. Read under an address-space cap, so that the bomb runs out of
// memory at a small size.
TEST(TraceReader, GzipBombIsAnErrorNamingTheFile) {
  if (under_sanitizer) GTEST_SKIP() << "a sanitizer's shadow memory does not fit under an address-space cap";
  const std::string path = temp_path("bomb.csv.gz");
  ASSERT_NO_FATAL_FAILURE(write_gzip(path, "action,addr,size,stream,time_us\n", '0', 512));  // 512 MiB
  EXPECT_TRUE(holds_under_memory_cap(path, [&](const absl::StatusOr<trace>& t) {
    return !t.ok() && absl::IsResourceExhausted(t.status()) &&
           message_of(t.status()).find(path + ": the trace does not fit in memory") == 0;
  }));
  std::remove(path.c_str());
}

// Regression (red team, low): `fragctl info /dev/zero`, a model checkpoint
// or a gzip bomb of zeros passed by mistake was read whole before its first
// line was looked at: bounded only by memory. The start of a file is judged
// as it is read, and a first line that runs past 64 KiB with no line end is
// no trace's header.
TEST(TraceReader, AFileThatIsNoTraceFailsOnItsStart) {
  if (under_sanitizer) GTEST_SKIP() << "a sanitizer's shadow memory does not fit under an address-space cap";
  const auto refused_at_start = [](const std::string& path) {
    return [path](const absl::StatusOr<trace>& t) {
      return !t.ok() && absl::IsInvalidArgument(t.status()) &&
             message_of(t.status()).find(path + ":1: unknown trace format: its first line runs past 64 KiB") == 0;
    };
  };
  EXPECT_TRUE(holds_under_memory_cap("/dev/zero", refused_at_start("/dev/zero")));
  const std::string zeros_gz = temp_path("zeros.bin.gz");
  ASSERT_NO_FATAL_FAILURE(write_gzip(zeros_gz, "", '\0', 512));
  EXPECT_TRUE(holds_under_memory_cap(zeros_gz, refused_at_start(zeros_gz)));
  std::remove(zeros_gz.c_str());
  // Nothing but line ends: no header in the first megabyte.
  const std::string blank_gz = temp_path("blank.csv.gz");
  ASSERT_NO_FATAL_FAILURE(write_gzip(blank_gz, "", '\n', 512));
  EXPECT_TRUE(holds_under_memory_cap(blank_gz, [&](const absl::StatusOr<trace>& t) {
    return !t.ok() && absl::IsInvalidArgument(t.status()) &&
           message_of(t.status()).find(blank_gz + ":1048577: unknown trace format: no header in its first 1 MiB") == 0;
  }));
  std::remove(blank_gz.c_str());
  // A comment line that runs on past the first megabyte is preamble too:
  // the header it comes before would start too late (not "its first line").
  const std::string long_comment = temp_path("long_comment.csv");
  {
    std::ofstream out(long_comment);
    out << std::string(900u << 10, '\n') << "# " << std::string(300u << 10, '.') << "\n"
        << "action,addr,size,stream,time_us\nalloc,512,1024,0,0\n";
  }
  const auto refused = read_trace(long_comment);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(message_of(refused.status()),
              ::testing::StartsWith(long_comment + ":921601: unknown trace format: no header in its first 1 MiB"));
  std::remove(long_comment.c_str());
  // A first line that is another format's is refused with the whole-file
  // message, on the line where it stands, after blank and comment lines.
  const std::string other = temp_path("other.csv");
  {
    std::ofstream out(other);
    out << "\n# a comment\ntime,what\n" << std::string(3u << 20, 'x') << "\n";
  }
  const auto t = read_trace(other);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(message_of(t.status()), ::testing::StartsWith(other + ":3: unknown trace format: first line is 'time,what'"));
  std::remove(other.c_str());
}

// The positive controls of the rules above: a JSON snapshot on one line
// longer than 64 KiB, a CSV trace after 512 KiB of blank and comment lines,
// and one behind a UTF-8 byte order mark, still read.
TEST(TraceReader, LongFirstLinesOfTracesStillRead) {
  const std::string json = temp_path("long_line.json");
  {
    std::ofstream out(json);
    out << "{\"device_traces\": [[{\"action\": \"alloc\", \"addr\": 512, \"size\": 1024, \"stream\": 0}"
        << std::string(200u << 10, ' ') << "]]}";
  }
  auto t = read_trace(json);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->events.size(), 1u);
  std::remove(json.c_str());
  const std::string csv = temp_path("late_header.csv");
  {
    std::ofstream out(csv);
    const std::string comment = "# " + std::string(125, '.') + "\n";  // 128 bytes
    for (int i = 0; i < 4096; ++i) out << comment << (i % 2 == 0 ? "\n" : "");
    out << "action,addr,size,stream,time_us\nalloc,512,1024,0,0\n";
  }
  t = read_trace(csv);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->events.size(), 1u);
  std::remove(csv.c_str());
  const std::string marked = temp_path("marked.csv");
  {
    std::ofstream out(marked);
    out << "\xEF\xBB\xBF" << "action,addr,size,stream,time_us\nalloc,512,1024,0,0\nfree_requested,512,1024,0,1\n";
  }
  t = read_trace(marked);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->events.size(), 2u);
  std::remove(marked.c_str());
}

TEST(TraceReader, Names) {
  EXPECT_EQ(trace_name_from_path("/a/b/gpt2m.trace.csv.gz"), "gpt2m");
  EXPECT_EQ(trace_name_from_path("snap.json"), "snap");
  EXPECT_EQ(trace_name_from_path("run.v2.csv"), "run.v2");
}

TEST(TraceSummary, TinyTrace) {
  auto t = read_trace(test_data("tiny_fragctl.csv"));
  ASSERT_TRUE(t.ok()) << t.status();
  const trace_summary s = summarize(*t);
  EXPECT_EQ(s.allocs, 3u);
  EXPECT_EQ(s.frees, 3u);
  EXPECT_EQ(s.peak_live_bytes, 3000000u + 4096u);
  EXPECT_EQ(s.live_at_end, 0u);
  EXPECT_EQ(s.unmatched_frees, 0u);
  EXPECT_EQ(s.streams, 2u);
  EXPECT_EQ(s.largest_request, 3000000u);
  EXPECT_EQ(s.duration_us, 6);
  EXPECT_EQ(s.overlapping_allocs, 0u);
  EXPECT_EQ(s.first_overlap_event, SIZE_MAX);
}

TEST(TraceSummary, CountsAllocationsThatMeetALiveBlock) {
  trace t;
  t.events = {
      {action::alloc, 0x10000, 4096, 0, 1},  // [0x10000, 0x11000)
      {action::alloc, 0x11000, 4096, 0, 2},  // just above it: no overlap
      {action::alloc, 0x0f000, 4096, 0, 3},  // just below it: no overlap
      {action::free, 0x11000, 4096, 0, 4},
      {action::alloc, 0x10800, 8192, 0, 5},  // over the first block's top half: event 4
      {action::alloc, 0x0e000, 8192, 0, 6},  // over the block below and the first: event 5
      {action::free, 0x10000, 4096, 0, 7},
      {action::free, 0x10800, 8192, 0, 8},
      {action::free, 0x0e000, 8192, 0, 9},
      {action::free, 0x0f000, 4096, 0, 10},
      {action::alloc, 0x10000, 4096, 0, 11},  // all freed: no overlap
      {action::alloc, 0x10000, 512, 0, 12},   // same address again: a lost free, not an overlap
  };
  const trace_summary s = summarize(t);
  EXPECT_EQ(s.overlapping_allocs, 2u);
  EXPECT_EQ(s.first_overlap_event, 4u);
  EXPECT_EQ(s.live_at_end, 1u);
}

TEST(TraceSummary, CountsOverlapsOfBlocksThatEndAtTheTopOfTheAddressSpace) {
  // A trace's addresses and sizes are whatever its file holds: a block may
  // end at 2^64 (or past it), where address + size wraps to a low value.
  constexpr std::uint64_t top = UINT64_MAX - 0xfff;  // [top, 2^64)
  trace t;
  t.events = {
      {action::alloc, top, 0x1000, 0, 1},
      {action::alloc, top + 0x800, 16, 0, 2},       // inside the block below it: event 1
      {action::free, top + 0x800, 16, 0, 3},
      {action::alloc, top - 0x1000, 0x2000, 0, 4},  // over the block above it: event 3
      {action::free, top - 0x1000, 0x2000, 0, 5},
      {action::alloc, top - 0x1000, 0x1000, 0, 6},  // just below it: no overlap
  };
  const trace_summary s = summarize(t);
  EXPECT_EQ(s.overlapping_allocs, 2u);
  EXPECT_EQ(s.first_overlap_event, 1u);
}

}  // namespace
}  // namespace fragctl
