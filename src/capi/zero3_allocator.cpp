// fragctl_zero3_use_allocator (fragctl/zero3/zero3.h): a ZeRO-3 manager on a
// C API allocator handle, counted in the handle's dependents so that
// fragctl_destroy refuses the handle while the manager lives.
#include "capi/handle.hpp"
#include "fragctl/zero3/zero3.h"
#include "zero3/shared_allocator.hpp"

namespace {

void release_handle(void* context) noexcept { --static_cast<fragctl_allocator*>(context)->dependents; }

}  // namespace

extern "C" {

fragctl_zero3_status fragctl_zero3_use_allocator(fragctl_zero3* z, fragctl_allocator* allocator) {
  if (allocator == nullptr) return fragctl::zero3::use_allocator(z, nullptr, nullptr, nullptr);  // reports it
  ++allocator->dependents;  // before the manager can use it
  const fragctl_zero3_status s =
      fragctl::zero3::use_allocator(z, &allocator->stack->allocator(), &release_handle, allocator);
  if (s != FRAGCTL_ZERO3_OK) --allocator->dependents;
  return s;
}

}  // extern "C"
