// The pickle reader: the snapshots PyTorch's _dump_snapshot() writes, at
// protocols 2 to 5, read as the same JSON and the same trace as their JSON
// form; and every hostile or broken pickle answered with an error that names
// the file (and the opcode and byte where one is at fault), never executed.
#include "trace/pickle_reader.hpp"

#include <string>
#include <vector>

#include "fragctl/trace.hpp"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "support/test_support.hpp"

namespace fragctl::trace_detail {
namespace {

using fragctl::testing::read_file;
using fragctl::testing::test_data;
using json = nlohmann::json;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// The files tests/data/make_snapshot_pickles.py writes.
const std::vector<std::string> pickled_snapshots = {
    "tiny_snapshot_pickled.p2.pickle", "tiny_snapshot_pickled.p3.pickle", "tiny_snapshot_pickled.p4.pickle",
    "tiny_snapshot_pickled.p5.pickle"};

// The bytes of a literal, NULs included.
template <std::size_t N>
std::string bytes(const char (&literal)[N]) {
  return std::string(literal, N - 1);
}

std::string error_of(std::string_view pickle) {
  auto j = read_pickle(pickle, "evil.pickle");
  if (j.ok()) return "accepted: " + j->dump();
  return std::string(j.status().message());
}

TEST(PickleReader, EachProtocolReadsAsTheSameJsonAsJsonDump) {
  const json expected = json::parse(read_file(test_data("tiny_snapshot_pickled.json")));
  for (const std::string& file : pickled_snapshots) {
    const std::string content = read_file(test_data(file));
    ASSERT_TRUE(looks_like_pickle(content)) << file;
    auto j = read_pickle(content, file);
    ASSERT_TRUE(j.ok()) << j.status();
    EXPECT_EQ(*j, expected) << file;
  }
  // The frames list is memoized while empty, filled, then shared: every
  // reference sees it filled.
  auto j = read_pickle(read_file(test_data(pickled_snapshots[0])), "p2");
  ASSERT_TRUE(j.ok());
  EXPECT_EQ((*j)["device_traces"][0][1]["frames"].size(), 2u);
  EXPECT_EQ((*j)["segments"][0]["blocks"][0]["frames"][1]["name"], "linear");
  EXPECT_EQ((*j)["device_traces"][0][5]["addr"].get<std::uint64_t>(),
            18446744073709547520u);  // 2^64 - 4096
}

TEST(PickleReader, ReadTraceGivesTheSameTraceAsTheJsonForm) {
  auto from_json = read_trace(test_data("tiny_snapshot_pickled.json"));
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  ASSERT_EQ(from_json->events.size(),
            4u);  // 3 alloc, 1 free_requested on device 0
  std::vector<std::string> files = pickled_snapshots;
  files.push_back("tiny_snapshot_pickled.p4.pickle.gz");
  for (const std::string& file : files) {
    auto t = read_trace(test_data(file));
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->format, "pytorch-snapshot");
    EXPECT_EQ(t->events, from_json->events) << file;
    EXPECT_EQ(t->ignored_rows, from_json->ignored_rows) << file;
    EXPECT_THAT(t->name, StartsWith("tiny_snapshot_pickled.p"));
    EXPECT_THAT(t->name,
                ::testing::Not(HasSubstr("pickle.")));  // .pickle is stripped
  }
  auto device1 = read_trace(test_data(pickled_snapshots[2]), trace_options{.device = 1});
  ASSERT_TRUE(device1.ok()) << device1.status();
  ASSERT_EQ(device1->events.size(), 1u);
  EXPECT_EQ(device1->events[0].addr, 140000000000000u);
}

TEST(PickleReader, KeyFilterDropsEntriesAtTheirDepth) {
  pickle_options options;
  options.keep = [](std::size_t depth, std::string_view key) {
    return depth == 1 ? key == "device_traces" : key != "frames";
  };
  auto j = read_pickle(read_file(test_data(pickled_snapshots[2])), "p4", options);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(j->size(), 1u);
  EXPECT_FALSE((*j)["device_traces"][0][0].contains("frames"));
  EXPECT_EQ((*j)["device_traces"][0][0]["action"], "segment_alloc");
}

TEST(PickleReader, PlainValuesAsJsonDumpWritesThem) {
  auto text = read_pickle(bytes("\x80\x03"
                                "C\x03"
                                "abc."),
                          "b");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "abc");
  // {1: True, None: -1, True: 2**63 - 1, "x": -2**63}: keys become strings.
  const std::string keys = bytes(
      "\x80\x02}("
      "K\x01\x88N\x8a\x01\xff\x88\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f"
      "X\x01\x00\x00\x00x\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80u.");
  auto j = read_pickle(keys, "keys");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(*j, json::parse(R"({"1": true, "null": -1, "true": 9223372036854775807, "x": -9223372036854775808})"));
}

TEST(PickleReader, RefusesEveryOpcodeThatWouldConstructAnObject) {
  const std::vector<std::pair<char, std::string>> refused = {{'c', "GLOBAL"},
                                                             {'\x93', "STACK_GLOBAL"},
                                                             {'R', "REDUCE"},
                                                             {'b', "BUILD"},
                                                             {'\x81', "NEWOBJ"},
                                                             {'\x92', "NEWOBJ_EX"},
                                                             {'i', "INST"},
                                                             {'o', "OBJ"},
                                                             {'P', "PERSID"},
                                                             {'Q', "BINPERSID"},
                                                             {'\x82', "EXT1"},
                                                             {'\x83', "EXT2"},
                                                             {'\x84', "EXT4"},
                                                             {'\x97', "NEXT_BUFFER"},
                                                             {'\x98', "READONLY_BUFFER"},
                                                             {'\x8f', "EMPTY_SET"},
                                                             {'\x90', "ADDITEMS"},
                                                             {'\x91', "FROZENSET"}};
  for (const auto& [code, name] : refused) {
    const std::string pickle = bytes("\x80\x04N") + code + ".";
    EXPECT_THAT(error_of(pickle), StartsWith("evil.pickle: pickle byte 3: opcode " + name + " ")) << name;
  }
  // What pickle.dumps writes for an object whose __reduce__ is os.system.
  EXPECT_THAT(error_of(bytes("\x80\x02"
                             "cposix\nsystem\nq\x00X\x04\x00\x00\x00trueq\x01\x85q\x02Rq\x03.")),
              StartsWith("evil.pickle: pickle byte 2: opcode GLOBAL (0x63) refused"));
  EXPECT_THAT(error_of(bytes("\x80\x04\x95\x1f\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix"
                             "\x94\x8c\x06system\x94"
                             "\x93\x94\x8c\x04true\x94\x85\x94R\x94.")),
              StartsWith("evil.pickle: pickle byte 28: opcode STACK_GLOBAL (0x93) refused"));
  // Text opcodes of protocols 0 and 1, and unknown ones.
  EXPECT_THAT(error_of("\x80\x02I1\n."), HasSubstr("byte 2: opcode INT (0x49) refused"));
  EXPECT_THAT(error_of("\x80\x02\xff."), HasSubstr("byte 2: unknown opcode 0xff"));
}

TEST(PickleReader, EveryTruncationIsAnErrorNamingTheFile) {
  for (const std::string& file : {pickled_snapshots[0], pickled_snapshots[3]}) {
    const std::string content = read_file(test_data(file));
    for (std::size_t n = 0; n + 1 < content.size(); ++n) {
      auto j = read_pickle(std::string_view(content).substr(0, n), "cut.pickle");
      ASSERT_FALSE(j.ok()) << file << " cut at " << n;
      EXPECT_THAT(std::string(j.status().message()), StartsWith("cut.pickle: pickle byte ")) << n;
    }
  }
  EXPECT_THAT(error_of("\x80\x02N"), HasSubstr("byte 3: the pickle ends before its STOP opcode"));
  EXPECT_THAT(error_of(bytes("\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\x7f.")),
              HasSubstr("byte 2: opcode 0x8d announces 9223372036854775807 "
                        "bytes, only 1 remain"));
  EXPECT_THAT(error_of(bytes("\x80\x04\x95\xff\x00\x00\x00\x00\x00\x00\x00N.")),
              HasSubstr("byte 2: FRAME of 255 bytes, only 2 remain"));
}

TEST(PickleReader, BadMemoStackAndValueErrorsNameTheOpcode) {
  EXPECT_THAT(error_of("\x80\x02h\x05."), HasSubstr("byte 2: memo index 5 was never stored"));
  EXPECT_THAT(error_of(bytes("\x80\x02j\x00\x00\x01\x00.")), HasSubstr("memo index 65536 was never stored"));
  EXPECT_THAT(error_of(bytes("\x80\x02q\x00.")), HasSubstr("byte 2: BINPUT with nothing on the stack"));
  EXPECT_THAT(error_of("\x80\x02]a."), HasSubstr("byte 3: APPEND with nothing on the stack"));
  EXPECT_THAT(error_of("\x80\x02]N(a."),
              HasSubstr("byte 5: APPEND with nothing on the stack"));  // below the MARK
  EXPECT_THAT(error_of("\x80\x02]e."), HasSubstr("byte 3: APPENDS without a MARK"));
  EXPECT_THAT(error_of("\x80\x02NNa."), HasSubstr("byte 4: APPEND on a None, not a list"));
  EXPECT_THAT(error_of("\x80\x02](NNNu."), HasSubstr("SETITEMS with a key without a value"));
  EXPECT_THAT(error_of("\x80\x02."), HasSubstr("byte 2: STOP with nothing on the stack"));
  EXPECT_THAT(error_of("\x80\x02}]Ns."), HasSubstr("evil.pickle: pickle: a dict key is a list"));
  EXPECT_THAT(error_of("\x80\x06N."), HasSubstr("byte 0: pickle protocol 6: protocols 2 to 5 are read"));
  // 2^64 (9 bytes) and -2^63 - 1 are outside int64 and uint64.
  EXPECT_THAT(error_of(bytes("\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01.")),
              HasSubstr("byte 2: an integer outside the 64-bit range"));
  EXPECT_THAT(error_of(bytes("\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\x7f\xff.")),
              HasSubstr("byte 2: an integer outside the 64-bit range"));
  // The positive controls: 2^64 - 1 and -2^63 are read.
  EXPECT_EQ(error_of(bytes("\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00.")), "accepted: 18446744073709551615");
  EXPECT_EQ(error_of(bytes("\x80\x02\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80.")), "accepted: -9223372036854775808");
}

TEST(PickleReader, DeepNestingCyclesAndExponentialSharingAreRefused) {
  std::string deep = "\x80\x02";
  for (int i = 0; i < 300; ++i) deep += "]";
  for (int i = 0; i < 299; ++i) deep += "a";
  deep += ".";
  EXPECT_THAT(error_of(deep), HasSubstr("evil.pickle: pickle: containers nest deeper than 256"));
  pickle_options deeper;
  deeper.max_depth = 300;
  EXPECT_TRUE(read_pickle(deep, "deep", deeper).ok());  // the positive control: the limit is what refused it

  // A list that holds itself.
  EXPECT_THAT(error_of(bytes("\x80\x02]q\x00h\x00"
                             "a.")),
              HasSubstr("nest deeper than 256 (or refer to themselves)"));

  // L[i+1] = [L[i], L[i]]: 60 steps of memo references expand to 2^60 values.
  std::string laughs = bytes("\x80\x02]q\x00");
  for (int i = 0; i < 60; ++i) {
    laughs += "(h";
    laughs += static_cast<char>(i);
    laughs += "h";
    laughs += static_cast<char>(i);
    laughs += "lq";
    laughs += static_cast<char>(i + 1);
  }
  laughs += ".";
  EXPECT_THAT(error_of(laughs), HasSubstr("evil.pickle: pickle: the data expands beyond"));
}

TEST(PickleReader, HostilePicklesThroughReadTraceNameTheFile) {
  auto t = parse_trace(bytes("\x80\x02"
                             "cposix\nsystem\nq\x00X\x04\x00\x00\x00trueq\x01\x85q\x02Rq\x03."),
                       "snapshot.pickle");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()), StartsWith("snapshot.pickle: pickle byte 2: opcode GLOBAL"));
  // A pickle of plain data that is not a snapshot.
  t = parse_trace("\x80\x02N.", "none.pickle");
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("must be a PyTorch memory snapshot"));
}

}  // namespace
}  // namespace fragctl::trace_detail
