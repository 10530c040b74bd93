// The LD_PRELOAD layer's answers for the devices' default memory pools
// (interpose/interposer.hpp, "The default memory pool").
#include <cstdint>
#include <exception>

#include "fragctl/allocator_stack.hpp"
#include "fragctl/log.hpp"
#include "interpose/interposer.hpp"

namespace fragctl::interpose {

namespace {

bool is_high(int attribute) noexcept {
  return attribute == pool_attr_reserved_mem_high || attribute == pool_attr_used_mem_high;
}

bool is_statistic(int attribute) noexcept {
  return attribute >= pool_attr_reserved_mem_current && attribute <= pool_attr_used_mem_high;
}

}  // namespace

std::optional<int> interposer::default_pool_device(const void* pool) const {
  if (!stacks_ || pool == nullptr) return std::nullopt;
  const std::lock_guard lock(mutex_);
  const auto it = default_pools_.find(pool);
  if (it == default_pools_.end()) return std::nullopt;
  return it->second;
}

int interposer::device_get_default_mem_pool(void** pool, int device) noexcept {
  const auto fn = real_.get_as<device_get_default_mem_pool_fn>(real_function::device_get_default_mem_pool);
  if (fn == nullptr) return error_not_initialized;
  const int rc = fn(pool, device);
  if (rc != success || pool == nullptr || *pool == nullptr || !stacks_) return rc;
  try {
    const std::lock_guard lock(mutex_);
    default_pools_.insert_or_assign(*pool, device);
  } catch (...) {
    return error_out_of_memory;
  }
  return rc;
}

int interposer::mem_pool_get_attribute(void* pool, int attribute, void* value) noexcept {
  std::optional<int> device;
  try {
    if (is_statistic(attribute)) device = default_pool_device(pool);
  } catch (...) {
    return error_unknown;
  }
  if (!device) {
    const auto fn = real_.get_as<mem_pool_attribute_fn>(real_function::mem_pool_get_attribute);
    return fn != nullptr ? fn(pool, attribute, value) : error_not_initialized;
  }
  if (value == nullptr) return error_invalid_value;
  std::uint64_t answer = 0;
  try {
    if (const allocator_stack* stack = stacks_(*device); stack != nullptr) {
      const allocator_stats stats = stack->stats();
      switch (attribute) {
        case pool_attr_reserved_mem_current: answer = stats.reserved.current; break;
        case pool_attr_reserved_mem_high: answer = stats.window_peak.reserved; break;
        case pool_attr_used_mem_current: answer = stats.allocated.current; break;
        default: answer = stats.window_peak.allocated; break;
      }
    }
  } catch (const std::exception& e) {
    logger().error("{}: statistics of device {}'s default pool: {}", real_.api().name, *device, e.what());
    return error_unknown;
  } catch (...) {
    return error_unknown;
  }
  *static_cast<std::uint64_t*>(value) = answer;
  return success;
}

int interposer::mem_pool_set_attribute(void* pool, int attribute, void* value) noexcept {
  std::optional<int> device;
  try {
    if (is_high(attribute)) device = default_pool_device(pool);
  } catch (...) {
    return error_unknown;
  }
  if (!device) {
    const auto fn = real_.get_as<mem_pool_attribute_fn>(real_function::mem_pool_set_attribute);
    return fn != nullptr ? fn(pool, attribute, value) : error_not_initialized;
  }
  // As the runtime: a high attribute may only be reset, to 0.
  if (value == nullptr || *static_cast<const std::uint64_t*>(value) != 0) return error_invalid_value;
  if (allocator_stack* stack = stacks_(*device); stack != nullptr) stack->reset_peaks();
  return success;
}

int interposer::mem_pool_trim_to(void* pool, std::size_t min_bytes_to_keep) noexcept {
  std::optional<int> device;
  try {
    device = default_pool_device(pool);
    if (device) {
      if (allocator_stack* stack = stacks_(*device); stack != nullptr) stack->allocator().release_cached();
    }
  } catch (const std::exception& e) {
    logger().error("{}: trimming device {}'s default pool: {}", real_.api().name, device.value_or(-1), e.what());
    return error_unknown;
  } catch (...) {
    return error_unknown;
  }
  const auto fn = real_.get_as<mem_pool_trim_to_fn>(real_function::mem_pool_trim_to);
  if (fn != nullptr) return fn(pool, min_bytes_to_keep);
  return device ? success : error_not_initialized;
}

}  // namespace fragctl::interpose
