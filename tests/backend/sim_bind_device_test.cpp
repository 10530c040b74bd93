// device_backend::bind_device on the simulator: a binding makes the device
// the thread's current one until it dies, nests, and a release out of order
// (a later binding still alive, or another thread) is counted.
#include <gtest/gtest.h>

#include <optional>
#include <thread>

#include "fragctl/sim_backend.hpp"

namespace fragctl {
namespace {

sim_options on_device(int device) {
  sim_options o;
  o.device = device;
  return o;
}

TEST(sim_bind_device, a_binding_makes_the_device_current_until_it_dies) {
  sim_backend zero(on_device(0));
  sim_backend one(on_device(1));
  EXPECT_EQ(sim_backend::bound_device(), -1);
  {
    const device_binding outer = zero.bind_device();
    EXPECT_EQ(sim_backend::bound_device(), 0);
    {
      const device_binding inner = one.bind_device();
      EXPECT_EQ(sim_backend::bound_device(), 1);
    }
    EXPECT_EQ(sim_backend::bound_device(), 0);  // the previous binding is back
  }
  EXPECT_EQ(sim_backend::bound_device(), -1);
  EXPECT_EQ(zero.bindings().bindings, 1U);
  EXPECT_EQ(one.bindings().bindings, 1U);
  EXPECT_EQ(zero.bindings().out_of_order + one.bindings().out_of_order, 0U);
}

TEST(sim_bind_device, a_moved_binding_is_released_once) {
  sim_backend sim(on_device(2));
  std::optional<device_binding> held;
  {
    device_binding b = sim.bind_device();
    held.emplace(std::move(b));
  }
  EXPECT_EQ(sim_backend::bound_device(), 2);  // the moved-from one released nothing
  held.reset();
  EXPECT_EQ(sim_backend::bound_device(), -1);
  EXPECT_EQ(sim.bindings().out_of_order, 0U);
}

TEST(sim_bind_device, a_release_out_of_order_is_counted) {
  sim_backend zero(on_device(0));
  sim_backend one(on_device(1));
  std::optional<device_binding> first;
  first.emplace(zero.bind_device());
  {
    const device_binding second = one.bind_device();
    first.reset();  // while a later binding lives: a real runtime would now be on the wrong device
    EXPECT_EQ(zero.bindings().out_of_order, 1U);
    EXPECT_EQ(sim_backend::bound_device(), 1);
  }
  EXPECT_EQ(sim_backend::bound_device(), -1);
  EXPECT_EQ(one.bindings().out_of_order, 0U);
}

TEST(sim_bind_device, a_release_on_another_thread_is_counted) {
  sim_backend sim;
  std::optional<device_binding> b;
  b.emplace(sim.bind_device());
  std::thread([&] {
    EXPECT_EQ(sim_backend::bound_device(), -1);  // a binding is the thread's
    b.reset();
  }).join();
  EXPECT_EQ(sim.bindings().out_of_order, 1U);
}

}  // namespace
}  // namespace fragctl
