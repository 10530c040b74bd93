// The GPU runtime call the NCCL communicator needs beyond the backend
// contract: binding the device to the calling thread, since NCCL works on the
// current device (CUDA: the device's primary context; HIP: hipSetDevice).
// Loaded with dlopen from libcuda.so.1 / libamdhip64.so; declared with plain
// types (no vendor header above src/backend).
#pragma once

#include <memory>

#include "fragctl/zero3/communicator.hpp"

namespace fragctl::zero3 {

class device_runtime {
 public:
  virtual ~device_runtime() = default;
  /// Makes the device current on this thread until the returned guard dies
  /// (the previous binding is put back).
  class binding {
   public:
    virtual ~binding() = default;
  };
  [[nodiscard]] virtual std::unique_ptr<binding> bind() = 0;
};

/// The runtime of `library`'s GPUs (CUDA driver for NCCL, HIP for RCCL) for
/// device ordinal `device`. Throws backend_error when it cannot be loaded.
[[nodiscard]] std::unique_ptr<device_runtime> make_device_runtime(collective_library library, int device);

}  // namespace fragctl::zero3
