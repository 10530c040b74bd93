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
  if (size < 0) [[unlikely]] {
    // No size PyTorch passes. Freeing with some other size would not keep
    // the statistics exact where the free is put off (a block with recorded
    // stream uses: stream_use_adaptor takes the size it is given), so the
    // call is refused and the block stays the caller's, to free with its size.
    fragctl::logger().error("fragctl_torch_free({}, {} bytes, device {}): a negative size; not freed (free it with "
                            "the size it was allocated with)",
                            ptr, size, device);
    return;
  }
  a->stack->allocator().deallocate(ptr, static_cast<std::size_t>(size), stream);
}

}  // extern "C"
