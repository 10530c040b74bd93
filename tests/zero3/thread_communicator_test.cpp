// The thread communicator: all-gather and reduce-scatter against references
// for 1 to 4 ranks, in place and not; mismatched calls and a missing rank are
// errors naming rank, operation and tag, and a missing rank is named with the
// last collective it completed. Also the host bf16/fp16 arithmetic.
#include <atomic>
#include <cstring>
#include <latch>

#include "fragctl/stats_export.hpp"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "zero3/collectives/host_math.hpp"
#include "zero3/zero3_harness.hpp"

namespace fragctl::zero3 {
namespace {

using namespace std::chrono_literals;
using testing::rank_env;
using testing::run_ranks;

class thread_ranks : public ::testing::TestWithParam<int> {};

TEST_P(thread_ranks, all_gather_concatenates_every_ranks_part) {
  const int n = GetParam();
  run_ranks(n, 5s, [n](rank_env& env) {
    const int r = env.comm->rank();
    std::vector<unsigned char> a(100), b(37);
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<unsigned char>(r * 100 + static_cast<int>(i));
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<unsigned char>(200 - r - static_cast<int>(i));
    std::vector<unsigned char> ga(100 * static_cast<std::size_t>(n)), gb(37 * static_cast<std::size_t>(n));
    const gather_part parts[] = {{a.data(), ga.data(), a.size()}, {b.data(), gb.data(), b.size()}};
    env.comm->all_gather(parts, nullptr, "test");
    for (int p = 0; p < n; ++p) {
      for (std::size_t i = 0; i < a.size(); ++i) {
        ASSERT_EQ(ga[static_cast<std::size_t>(p) * 100 + i], static_cast<unsigned char>(p * 100 + static_cast<int>(i)));
      }
      for (std::size_t i = 0; i < b.size(); ++i) {
        ASSERT_EQ(gb[static_cast<std::size_t>(p) * 37 + i], static_cast<unsigned char>(200 - p - static_cast<int>(i)));
      }
    }
    // In place: each rank's part already sits at its offset.
    std::vector<unsigned char> place(16 * static_cast<std::size_t>(n), 0);
    std::memset(place.data() + 16 * static_cast<std::size_t>(r), r + 1, 16);
    const gather_part in_place{place.data() + 16 * static_cast<std::size_t>(r), place.data(), 16};
    env.comm->all_gather(std::span(&in_place, 1), nullptr, "in place");
    for (int p = 0; p < n; ++p) EXPECT_EQ(place[16 * static_cast<std::size_t>(p) + 5], p + 1);
  });
}

TEST_P(thread_ranks, reduce_scatter_sums_each_ranks_segment) {
  const int n = GetParam();
  run_ranks(n, 5s, [n](rank_env& env) {
    const int r = env.comm->rank();
    constexpr std::size_t per = 50;
    std::vector<float> send(per * static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < send.size(); ++i) send[i] = static_cast<float>(r + 1) * 0.25F + static_cast<float>(i);
    std::vector<float> recv(per);
    const scatter_part part{send.data(), recv.data(), per};
    env.comm->reduce_scatter(std::span(&part, 1), data_type::float32, nullptr, "fp32");
    for (std::size_t i = 0; i < per; ++i) {
      const std::size_t global = static_cast<std::size_t>(r) * per + i;
      float expected = 0;
      for (int p = 0; p < n; ++p) expected += static_cast<float>(p + 1) * 0.25F + static_cast<float>(global);
      ASSERT_EQ(recv[i], expected) << i;
    }
    // bf16 small integers sum exactly; in place.
    std::vector<std::uint16_t> bf(per * static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < bf.size(); ++i) bf[i] = host_math::float_to_bf16(static_cast<float>((i % 5) + r));
    std::uint16_t* mine = bf.data() + static_cast<std::size_t>(r) * per;
    const scatter_part in_place{bf.data(), mine, per};
    env.comm->reduce_scatter(std::span(&in_place, 1), data_type::bfloat16, nullptr, "bf16");
    for (std::size_t i = 0; i < per; ++i) {
      const std::size_t global = static_cast<std::size_t>(r) * per + i;
      float expected = 0;
      for (int p = 0; p < n; ++p) expected += static_cast<float>((global % 5) + static_cast<std::size_t>(p));
      ASSERT_EQ(host_math::bf16_to_float(mine[i]), expected) << i;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(ranks, thread_ranks, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& p) { return std::to_string(p.param) + "_ranks"; });

TEST(thread_communicator, a_rank_that_never_joins_is_named_with_where_it_last_was) {
  // Issue 31: the message named the missing rank but not where it was.
  constexpr auto timeout = 150ms;
  std::atomic<int> timed_out{0};
  std::string message;
  std::mutex message_mutex;
  std::latch failed(1);
  run_ranks(3, timeout, [&](rank_env& env) {
    std::vector<unsigned char> a(8), g(24);
    const gather_part part{a.data(), g.data(), 8};
    env.comm->all_gather(std::span(&part, 1), nullptr, "block 6 'layer.5'");  // #1, every rank
    if (env.comm->rank() == 2) {
      failed.wait();  // never joins #2; checks that the group is aborted afterwards
      EXPECT_THROW(env.comm->check(), collective_error);
      return;
    }
    try {
      env.comm->all_gather(std::span(&part, 1), nullptr, "block 7 'layer.6'");
      ADD_FAILURE() << "the all-gather completed without rank 2";
    } catch (const collective_error& e) {
      if (e.timed_out()) {
        ++timed_out;
        std::lock_guard lock(message_mutex);
        message = e.what();
        EXPECT_EQ(e.operation(), "all_gather");
        EXPECT_EQ(e.tag(), "block 7 'layer.6'");
      } else {
        EXPECT_NE(std::string(e.what()).find("aborted"), std::string::npos);
      }
    }
    if (env.comm->rank() == 0) failed.count_down();
  });
  EXPECT_GE(timed_out.load(), 1);
  const std::string what = "all_gather #2 of block 7 'layer.6'";
  EXPECT_NE(message.find(what + " did not complete within " + std::to_string(timeout.count()) +
                         " ms: rank 2 has not entered it"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("rank 2 has not entered " + what + "; it completed #1 (all_gather of block 6 'layer.5') at "),
            std::string::npos)
      << message;
  EXPECT_NE(message.find(" s and has been silent "), std::string::npos) << message;
  // The rank that waited too is not named.
  EXPECT_EQ(message.find("rank 0 has not"), std::string::npos) << message;
  EXPECT_EQ(message.find("rank 1 has not"), std::string::npos) << message;
  // The same hang is in the process's reports (issue 31): the rank that
  // timed out recorded it, with the missing rank and where it last was.
  const std::vector<std::string> hangs = stats_export_hangs();
  ASSERT_FALSE(hangs.empty());
  const nlohmann::json hang = nlohmann::json::parse(hangs.back());
  EXPECT_EQ(hang["communicator"], "threads");
  EXPECT_EQ(hang["collective"], "all_gather");
  EXPECT_EQ(hang["sequence"], 2);
  EXPECT_EQ(hang["block"], "block 7 'layer.6'");
  EXPECT_EQ(hang["missing"], nlohmann::json::array({2}));
  EXPECT_EQ(hang["message"], message);
  EXPECT_DOUBLE_EQ(hang["deadline_s"].get<double>(), 0.15);
  EXPECT_GE(hang["elapsed_s"].get<double>(), 0.15);
  ASSERT_EQ(hang["peers"].size(), 1U);
  EXPECT_EQ(hang["peers"][0].get<std::string>().rfind("rank 2 has not entered " + what + "; it completed #1", 0), 0U);
  const std::string document = stats_export_to_json({}, "request");
  EXPECT_NE(document.find("\"hangs\""), std::string::npos);
}

TEST(thread_communicator, mismatched_collectives_are_an_error) {
  std::atomic<int> errors{0};
  run_ranks(2, 5s, [&](rank_env& env) {
    std::vector<unsigned char> a(8), g(16);
    try {
      if (env.comm->rank() == 0) {
        const gather_part part{a.data(), g.data(), 8};
        env.comm->all_gather(std::span(&part, 1), nullptr, "x");
      } else {
        const scatter_part part{g.data(), a.data(), 2};
        env.comm->reduce_scatter(std::span(&part, 1), data_type::float32, nullptr, "y");
      }
    } catch (const collective_error& e) {
      EXPECT_NE(std::string(e.what()).find("collective mismatch"), std::string::npos) << e.what();
      ++errors;
    }
  });
  EXPECT_EQ(errors.load(), 2);
}

TEST(thread_communicator, misuse) {
  sim_backend backend;
  auto group = make_thread_group(2, 1s);
  auto first = make_thread_communicator(group, 0, backend);
  EXPECT_THROW((void)make_thread_communicator(group, 0, backend), invalid_argument);
  EXPECT_THROW((void)make_thread_communicator(group, 2, backend), invalid_argument);
  EXPECT_THROW((void)make_thread_group(0, 1s), invalid_argument);
  EXPECT_EQ(first->size(), 2);
  EXPECT_EQ(first->name(), "threads");
}

// The collectives bind the manager's device through its backend, as NCCL's
// do (the backend contract's bind_device): sim records each binding and its
// release in order.
TEST(thread_communicator, collectives_bind_the_device_through_the_backend) {
  sim_options o;
  o.backed = true;
  o.device = 3;
  sim_backend backend(o);
  auto comm = make_thread_communicator(make_thread_group(1, 1s), 0, backend);
  std::vector<unsigned char> send(16, 7), recv(16, 0);
  const gather_part gather{send.data(), recv.data(), send.size()};
  comm->all_gather(std::span(&gather, 1), nullptr, "bind");
  std::vector<float> grads(4, 1.0f), sum(4, 0.0f);
  const scatter_part scatter{grads.data(), sum.data(), 4};
  comm->reduce_scatter(std::span(&scatter, 1), data_type::float32, nullptr, "bind");
  EXPECT_EQ(backend.bindings().bindings, 2U);
  EXPECT_EQ(backend.bindings().out_of_order, 0U);
  EXPECT_EQ(sim_backend::bound_device(), -1);  // released after each collective
  EXPECT_EQ(recv[15], 7);
}

TEST(host_math, bf16_and_fp16_round_to_nearest_even) {
  using namespace host_math;
  EXPECT_EQ(float_to_bf16(1.0F), 0x3f80);
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0F);
  EXPECT_EQ(float_to_bf16(-2.5F), 0xc020);
  // 1 + 2^-8 is halfway between two bf16 values: ties to even (1.0).
  EXPECT_EQ(float_to_bf16(1.0F + 0x1p-8F), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0F + 0x1p-8F + 0x1p-12F), 0x3f81);
  EXPECT_EQ(float_to_fp16(1.0F), 0x3c00);
  EXPECT_EQ(fp16_to_float(0x3c00), 1.0F);
  EXPECT_EQ(float_to_fp16(65504.0F), 0x7bff);
  EXPECT_EQ(float_to_fp16(1e6F), 0x7c00);
  EXPECT_EQ(float_to_fp16(0x1p-24F), 0x0001);  // smallest subnormal
  EXPECT_EQ(fp16_to_float(0x0001), 0x1p-24F);
  EXPECT_EQ(float_to_fp16(1.0F + 0x1p-11F), 0x3c00);  // tie to even
  for (int i = -300; i <= 300; ++i) {
    const float f = static_cast<float>(i) * 0.125F;
    EXPECT_EQ(fp16_to_float(float_to_fp16(f)), f);
    if (i >= -256 && i <= 256) {  // integers beyond 256 need more than bf16's 8 significant bits
      EXPECT_EQ(bf16_to_float(float_to_bf16(static_cast<float>(i))), static_cast<float>(i));
    }
  }
}

}  // namespace
}  // namespace fragctl::zero3
