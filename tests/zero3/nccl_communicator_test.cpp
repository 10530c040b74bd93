// The NCCL/RCCL communicator's parts that run without a GPU: unique id text,
// argument checks, a clear error when the library is missing, and the
// progress files that name the ranks missing from a collective at its
// deadline (two ranks' records beside one id file). The collectives
// themselves run on two GPUs in tools/gpu/zero3.sh.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "fragctl/sim_backend.hpp"
#include "fragctl/zero3/communicator.hpp"
#include "gtest/gtest.h"
#include "zero3/collectives/progress_files.hpp"

namespace fragctl::zero3 {
namespace {

TEST(nccl_communicator, unique_id_hex_round_trips) {
  unique_id id{};
  for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<unsigned char>(i * 37 + 5);
  const std::string hex = to_hex(id);
  EXPECT_EQ(hex.size(), 256U);
  EXPECT_EQ(hex.substr(0, 4), "052a");
  auto back = unique_id_from_hex(hex + "\n");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, id);
  EXPECT_FALSE(unique_id_from_hex("abc").ok());
  std::string bad = hex;
  bad[10] = 'g';
  auto error = unique_id_from_hex(bad);
  ASSERT_FALSE(error.ok());
  EXPECT_NE(std::string(error.status().message()).find("byte 5"), std::string::npos);
}

TEST(nccl_communicator, checks_arguments_before_loading_anything) {
  sim_backend backend;
  nccl_options o;
  o.size = 2;
  o.rank = 2;
  EXPECT_THROW((void)make_nccl_communicator(backend, o), invalid_argument);
  o.rank = 0;
  try {
    (void)make_nccl_communicator(backend, o);
    ADD_FAILURE() << "an NCCL communicator on sim";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("nccl runs on the cuda backend, not sim"), std::string::npos) << e.what();
  }
}

TEST(nccl_communicator, a_missing_library_is_named) {
  nccl_options o;
  o.library_path = "/nonexistent/libnccl.so.2";
  try {
    (void)make_unique_id(o);
    ADD_FAILURE() << "loaded a library that does not exist";
  } catch (const backend_error& e) {
    EXPECT_NE(std::string(e.what()).find("nccl not found"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("FRAGCTL_NCCL_LIBRARY"), std::string::npos) << e.what();
  }
}

// A fresh directory for one test's id file.
std::string fresh_directory(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / (name + "." + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

TEST(progress_files, a_rank_that_has_not_entered_is_named_with_where_it_last_was) {
  // Issue 31: an NCCL collective past its deadline named only the rank that waited.
  using namespace std::chrono_literals;
  const std::string id_file = fresh_directory("fragctl-progress") + "/nccl.id";
  progress_files rank0(id_file, "job1", 0, 3, 10s);
  progress_files rank1(id_file, "job1", 1, 3, 10s);
  progress_files rank2(id_file, "job1", 2, 3, 10s);
  for (progress_files* p : {&rank0, &rank1, &rank2}) {
    const std::uint64_t n = p->enter("all_gather", "block 0 'a'", 64);
    EXPECT_EQ(n, 1U);
    p->complete(n, "all_gather", "block 0 'a'", 64);
  }
  const collective_entry stuck{rank0.enter("reduce_scatter", "block 1 'b'", 128), "reduce_scatter", "block 1 'b'", 128,
                               0};
  EXPECT_EQ(stuck.number, 2U);
  (void)rank2.enter("reduce_scatter", "block 1 'b'", 128);  // rank 2 is in #2 too; rank 1 is not
  EXPECT_EQ(rank0.path_of(1), id_file + ".rank1.progress");
  for (progress_files* p : {&rank0, &rank1, &rank2}) ASSERT_TRUE(p->write(p->record()));

  const peer_verdict v = rank0.read_peers(stuck);
  EXPECT_EQ(v.missing, std::vector<int>{1});
  ASSERT_EQ(v.lines.size(), 2U);
  EXPECT_EQ(v.lines[0].rfind("rank 1 has not entered reduce_scatter #2 of block 1 'b'; it completed #1 (all_gather "
                             "of block 0 'a') at ",
                             0),
            0U)
      << v.lines[0];
  EXPECT_NE(v.lines[0].find(" s and has been silent "), std::string::npos) << v.lines[0];
  EXPECT_NE(v.lines[0].find("its record was written "), std::string::npos) << v.lines[0];
  EXPECT_EQ(v.lines[1].rfind("rank 2 is in reduce_scatter #2 too", 0), 0U) << v.lines[1];

  // The control: once rank 1 enters #2 and publishes, no rank is missing.
  (void)rank1.enter("reduce_scatter", "block 1 'b'", 128);
  ASSERT_TRUE(rank1.write(rank1.record()));
  EXPECT_TRUE(rank0.read_peers(stuck).missing.empty());
}

TEST(progress_files, records_of_another_job_or_behind_a_link_are_not_read) {
  using namespace std::chrono_literals;
  const std::string dir = fresh_directory("fragctl-progress-foreign");
  const std::string id_file = dir + "/nccl.id";
  progress_files mine(id_file, "job2", 0, 2, 10s);
  progress_files earlier(id_file, "job1", 1, 2, 10s);  // a file an earlier job left
  ASSERT_TRUE(earlier.write(earlier.record()));
  const collective_entry stuck{mine.enter("all_gather", "block 0 'a'", 8), "all_gather", "block 0 'a'", 8, 0};
  peer_verdict v = mine.read_peers(stuck);
  EXPECT_EQ(v.missing, std::vector<int>{1});
  ASSERT_EQ(v.lines.size(), 1U);
  EXPECT_NE(v.lines[0].find("no record of this job"), std::string::npos) << v.lines[0];

  // A link planted at rank 1's path is neither followed when read nor written through.
  progress_files current(id_file, "job2", 1, 2, 10s);
  (void)current.enter("all_gather", "block 0 'a'", 8);
  const std::string target = dir + "/elsewhere";
  { std::ofstream(target) << current.record(); }
  std::filesystem::remove(mine.path_of(1));
  std::filesystem::create_symlink(target, mine.path_of(1));
  v = mine.read_peers(stuck);
  EXPECT_EQ(v.missing, std::vector<int>{1});
  EXPECT_FALSE(current.write(current.record()));
  EXPECT_TRUE(std::filesystem::is_symlink(mine.path_of(1)));
  // The positive control: the same record as a plain file is read.
  std::filesystem::remove(mine.path_of(1));
  ASSERT_TRUE(current.write(current.record()));
  EXPECT_TRUE(mine.read_peers(stuck).missing.empty());
}

TEST(progress_files, the_record_is_written_when_it_changed_at_most_every_gap) {
  using namespace std::chrono_literals;
  progress_files p(fresh_directory("fragctl-progress-due") + "/nccl.id", "job", 0, 2, 10s);
  EXPECT_EQ(p.publish_gap(), std::chrono::milliseconds(200));
  EXPECT_EQ(p.publish_beat(), std::chrono::milliseconds(1000));
  const auto t0 = progress_files::clock::now();
  EXPECT_FALSE(p.due(t0).empty());  // the first record at once
  (void)p.enter("all_gather", "x", 8);
  EXPECT_TRUE(p.due(t0 + 100ms).empty());    // changed, within the gap
  EXPECT_FALSE(p.due(t0 + 200ms).empty());   // changed, the gap passed
  EXPECT_TRUE(p.due(t0 + 900ms).empty());    // unchanged, before the beat
  EXPECT_FALSE(p.due(t0 + 1200ms).empty());  // the heartbeat
  // Without an id file nothing is written and the verdict says why.
  progress_files alone("", "job", 0, 2, 10s);
  EXPECT_TRUE(alone.due(t0).empty());
  const peer_verdict v = alone.read_peers({1, "all_gather", "x", 8, 0});
  EXPECT_EQ(v.missing, std::vector<int>{1});
  EXPECT_NE(v.lines[0].find("no id file"), std::string::npos);
}

TEST(data_type, names_and_sizes) {
  EXPECT_EQ(size_of(data_type::bfloat16), 2U);
  EXPECT_EQ(size_of(data_type::float32), 4U);
  EXPECT_EQ(*parse_data_type("BF16"), data_type::bfloat16);
  EXPECT_EQ(*parse_data_type("fp32"), data_type::float32);
  EXPECT_FALSE(parse_data_type("int4").ok());
  EXPECT_EQ(to_string(data_type::float16), "float16");
}

}  // namespace
}  // namespace fragctl::zero3
