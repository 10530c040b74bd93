// device_runtime for CUDA (driver API) and HIP, loaded with dlopen.
#include "zero3/collectives/device_runtime.hpp"

#include <initializer_list>
#include <utility>
#include <vector>

#include "fmt/format.h"
#include "fragctl/error.hpp"
#include "util/shared_library.hpp"

namespace fragctl::zero3 {

namespace {

util::shared_library open_library(std::initializer_list<const char*> names, const char* what) {
  std::vector<util::shared_library::attempt> failed;
  if (auto library = util::shared_library::open(names, failed)) return *std::move(library);
  throw backend_error(fmt::format("{} not found (needed by the {} communicator)", *names.begin(), what), 0,
                      "library_not_found");
}

template <class F>
F symbol(const util::shared_library& library, const char* first, const char* second = nullptr) {
  void* fn = library.symbol(first);
  if (fn == nullptr && second != nullptr) fn = library.symbol(second);
  if (fn == nullptr) throw backend_error(fmt::format("symbol {} not found", first), 0, "symbol_not_found");
  return reinterpret_cast<F>(fn);
}

// --- CUDA driver -------------------------------------------------------------

class cuda_runtime final : public device_runtime {
 public:
  explicit cuda_runtime(int device) : device_(device) {
    const util::shared_library lib = open_library({"libcuda.so.1", "libcuda.so"}, "nccl");
    device_get_ = symbol<int (*)(int*, int)>(lib, "cuDeviceGet");
    retain_ = symbol<int (*)(void**, int)>(lib, "cuDevicePrimaryCtxRetain");
    release_ = symbol<int (*)(int)>(lib, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease");
    get_current_ = symbol<int (*)(void**)>(lib, "cuCtxGetCurrent");
    set_current_ = symbol<int (*)(void*)>(lib, "cuCtxSetCurrent");
    check(device_get_(&handle_, device), "cuDeviceGet");
    check(retain_(&context_, handle_), "cuDevicePrimaryCtxRetain");
  }
  ~cuda_runtime() override { (void)release_(handle_); }

  std::unique_ptr<binding> bind() override { return std::make_unique<scope>(*this); }

 private:
  struct scope final : binding {
    explicit scope(cuda_runtime& r) : rt(r) {
      rt.check(rt.get_current_(&previous), "cuCtxGetCurrent");
      if (previous != rt.context_) rt.check(rt.set_current_(rt.context_), "cuCtxSetCurrent");
    }
    ~scope() override {
      if (previous != rt.context_) (void)rt.set_current_(previous);
    }
    cuda_runtime& rt;
    void* previous = nullptr;
  };

  void check(int rc, const char* call) const {
    if (rc != 0) {
      throw backend_error(fmt::format("{} failed with CUresult {} (device {})", call, rc, device_), rc, "CUresult");
    }
  }

  int device_;
  int handle_ = 0;
  void* context_ = nullptr;
  int (*device_get_)(int*, int) = nullptr;
  int (*retain_)(void**, int) = nullptr;
  int (*release_)(int) = nullptr;
  int (*get_current_)(void**) = nullptr;
  int (*set_current_)(void*) = nullptr;
};

// --- HIP ---------------------------------------------------------------------

class hip_runtime final : public device_runtime {
 public:
  explicit hip_runtime(int device) : device_(device) {
    const util::shared_library lib = open_library({"libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"}, "rccl");
    get_device_ = symbol<int (*)(int*)>(lib, "hipGetDevice");
    set_device_ = symbol<int (*)(int)>(lib, "hipSetDevice");
  }

  std::unique_ptr<binding> bind() override { return std::make_unique<scope>(*this); }

 private:
  struct scope final : binding {
    explicit scope(hip_runtime& r) : rt(r) {
      rt.check(rt.get_device_(&previous), "hipGetDevice");
      if (previous != rt.device_) rt.check(rt.set_device_(rt.device_), "hipSetDevice");
    }
    ~scope() override {
      if (previous != rt.device_) (void)rt.set_device_(previous);
    }
    hip_runtime& rt;
    int previous = 0;
  };

  void check(int rc, const char* call) const {
    if (rc != 0) {
      throw backend_error(fmt::format("{} failed with hipError_t {} (device {})", call, rc, device_), rc,
                          "hipError_t");
    }
  }

  int device_;
  int (*get_device_)(int*) = nullptr;
  int (*set_device_)(int) = nullptr;
};

}  // namespace

std::unique_ptr<device_runtime> make_device_runtime(collective_library library, int device) {
  if (library == collective_library::rccl) return std::make_unique<hip_runtime>(device);
  return std::make_unique<cuda_runtime>(device);
}

}  // namespace fragctl::zero3
