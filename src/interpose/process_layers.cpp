// The process's interposers (interpose/process_layers.hpp).
#include "interpose/process_layers.hpp"

#include "capi/defaults.hpp"

namespace fragctl::interpose {

allocator_source process_default_allocators() {
  return [](int device, bool create) -> device_allocator* {
    if (create) return &capi::default_allocator(device).stack->allocator();
    fragctl_allocator* a = capi::find_default_allocator(device);
    return a == nullptr ? nullptr : &a->stack->allocator();
  };
}

stack_source process_default_stacks() {
  return [](int device) -> allocator_stack* {
    fragctl_allocator* a = capi::find_default_allocator(device);
    return a == nullptr ? nullptr : a->stack.get();
  };
}

interposer& cuda_interposer(symbol_resolver resolve) noexcept {
  // Leaked on purpose (see the header); a static's construction is thread-safe.
  static interposer* const layer = new interposer(cuda_runtime, resolve, true, process_default_allocators(),
                                                     process_default_stacks());
  return *layer;
}

interposer& hip_interposer(symbol_resolver resolve) noexcept {
  static interposer* const layer =
      new interposer(hip_runtime, resolve, true, process_default_allocators(), process_default_stacks());
  return *layer;
}

}  // namespace fragctl::interpose
