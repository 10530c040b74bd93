// The PyTorch entry points (fragctl.h, "PyTorch"): what
// torch.cuda.memory.CUDAPluggableAllocator calls for every tensor. PyTorch
// passes the device and the allocation stream at both ends and remembers the
// size, so these map straight onto the device's process-default allocator.
#include "capi/defaults.hpp"
#include "capi/handle.hpp"
#include "fragctl/log.hpp"

extern "C" {

void* fragctl_torch_alloc(ssize_t size, int device, void* stream) {
  if (size <= 0) return nullptr;
  // Exceptions propagate on purpose: PyTorch does not check for nullptr
  // (fragctl.h explains), and reports a C++ exception in Python.
  return fragctl::capi::default_allocator(device).stack->allocator().allocate(static_cast<std::size_t>(size),
                                                                               stream);
}

void fragctl_torch_free(void* ptr, ssize_t size, int device, void* stream) {
  if (ptr == nullptr) return;
  fragctl_allocator* a = fragctl::capi::find_default_allocator(device);
  if (a == nullptr) {
    fragctl::logger().warn("fragctl_torch_free({}, {} bytes, device {}): no allocator was built for this device; ignored",
                           ptr, size, device);
    return;
  }
  a->stack->allocator().deallocate(ptr, static_cast<std::size_t>(size), stream);
}

}  // extern "C"
