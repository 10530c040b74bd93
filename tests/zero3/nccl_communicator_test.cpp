// The NCCL/RCCL communicator's parts that run without a GPU: unique id text,
// argument checks, and a clear error when the library is missing. The
// collectives themselves run on two GPUs in tools/gpu/zero3.sh.
#include "fragctl/sim_backend.hpp"
#include "fragctl/zero3/communicator.hpp"
#include "gtest/gtest.h"

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
