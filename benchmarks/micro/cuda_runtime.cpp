#include "cuda_runtime.hpp"

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <new>
#include <stdexcept>

#include "fmt/format.h"

#if __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#define FRAGCTL_BENCH_HAVE_CUDART_HEADERS 1
#endif

namespace fragctl::bench {

const std::vector<std::string>& cuda_runtime_subjects() {
  static const std::vector<std::string> names = {"cudaMalloc", "cudaMallocAsync"};
  return names;
}

bool is_cuda_runtime_subject(std::string_view name) {
  for (const std::string& n : cuda_runtime_subjects())
    if (n == name) return true;
  return false;
}

#ifdef FRAGCTL_BENCH_HAVE_CUDART_HEADERS

namespace {

// The runtime functions the benchmarks call, resolved once.
struct cudart {
  decltype(&::cudaSetDevice) set_device = nullptr;
  decltype(&::cudaGetDeviceCount) get_device_count = nullptr;
  decltype(&::cudaMalloc) malloc = nullptr;
  decltype(&::cudaFree) free = nullptr;
  decltype(&::cudaMallocAsync) malloc_async = nullptr;
  decltype(&::cudaFreeAsync) free_async = nullptr;
  decltype(&::cudaStreamCreateWithFlags) stream_create = nullptr;
  decltype(&::cudaStreamDestroy) stream_destroy = nullptr;
  decltype(&::cudaStreamSynchronize) stream_synchronize = nullptr;
  decltype(&::cudaDeviceGetDefaultMemPool) default_pool = nullptr;
  decltype(&::cudaMemPoolSetAttribute) pool_set_attribute = nullptr;
  decltype(&::cudaMemPoolTrimTo) pool_trim = nullptr;
  decltype(&::cudaGetErrorString) error_string = nullptr;
  std::string failure;  // why the runtime cannot be used; empty when it can
};

void* open_cudart() {
  std::vector<std::string> candidates;
  if (const char* path = std::getenv("FRAGCTL_CUDART"); path != nullptr && *path != '\0') candidates.emplace_back(path);
  for (const char* n : {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                        "/usr/local/cuda/lib64/libcudart.so", "/usr/local/cuda/lib64/libcudart.so.13",
                        "/usr/local/cuda/lib64/libcudart.so.12"})
    candidates.emplace_back(n);
  for (const std::string& c : candidates) {
    if (void* h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  }
  return nullptr;
}

template <class F>
bool resolve(void* lib, F& fn, const char* symbol, std::string& failure) {
  fn = reinterpret_cast<F>(dlsym(lib, symbol));
  if (fn == nullptr && failure.empty()) failure = fmt::format("libcudart has no {}", symbol);
  return fn != nullptr;
}

const cudart& runtime() {
  static const cudart api = [] {
    cudart a;
    void* lib = open_cudart();  // kept loaded for the life of the process
    if (lib == nullptr) {
      a.failure = "libcudart not found (set FRAGCTL_CUDART to its path)";
      return a;
    }
    std::string& f = a.failure;
    resolve(lib, a.set_device, "cudaSetDevice", f);
    resolve(lib, a.get_device_count, "cudaGetDeviceCount", f);
    resolve(lib, a.malloc, "cudaMalloc", f);
    resolve(lib, a.free, "cudaFree", f);
    resolve(lib, a.malloc_async, "cudaMallocAsync", f);
    resolve(lib, a.free_async, "cudaFreeAsync", f);
    resolve(lib, a.stream_create, "cudaStreamCreateWithFlags", f);
    resolve(lib, a.stream_destroy, "cudaStreamDestroy", f);
    resolve(lib, a.stream_synchronize, "cudaStreamSynchronize", f);
    resolve(lib, a.default_pool, "cudaDeviceGetDefaultMemPool", f);
    resolve(lib, a.pool_set_attribute, "cudaMemPoolSetAttribute", f);
    resolve(lib, a.pool_trim, "cudaMemPoolTrimTo", f);
    resolve(lib, a.error_string, "cudaGetErrorString", f);
    if (!f.empty()) return a;
    int count = 0;
    if (a.get_device_count(&count) != cudaSuccess || count == 0) f = "the CUDA runtime sees no device";
    return a;
  }();
  return api;
}

void check(cudaError_t rc, const char* what) {
  if (rc == cudaSuccess) return;
  if (rc == cudaErrorMemoryAllocation) throw std::bad_alloc();
  throw std::runtime_error(fmt::format("{}: {}", what, runtime().error_string(rc)));
}

// cudaMalloc/cudaFree, or cudaMallocAsync/cudaFreeAsync from the warm
// default pool: the two share streams and setup.
class runtime_subject final : public subject {
 public:
  runtime_subject(bool async, int device) : api_(runtime()), async_(async) {
    if (!api_.failure.empty()) throw std::runtime_error(api_.failure);
    check(api_.set_device(device), "cudaSetDevice");
    for (unsigned i = 0; i < subject_streams; ++i) {
      cudaStream_t s = nullptr;
      check(api_.stream_create(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      streams_.push_back(s);
    }
    check(api_.default_pool(&pool_, device), "cudaDeviceGetDefaultMemPool");
    std::uint64_t keep_everything = UINT64_MAX;
    check(api_.pool_set_attribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep_everything),
          "cudaMemPoolSetAttribute(ReleaseThreshold)");
  }
  ~runtime_subject() override {
    for (cudaStream_t s : streams_) {
      (void)api_.stream_synchronize(s);
      (void)api_.stream_destroy(s);
    }
    (void)api_.pool_trim(pool_, 0);  // give the pool back before the next subject runs
  }
  runtime_subject(const runtime_subject&) = delete;
  runtime_subject& operator=(const runtime_subject&) = delete;

  void* allocate(std::size_t bytes, unsigned stream) override {
    void* p = nullptr;
    if (async_) {
      check(api_.malloc_async(&p, bytes, streams_[stream]), "cudaMallocAsync");
    } else {
      check(api_.malloc(&p, bytes), "cudaMalloc");
    }
    return p;
  }
  void deallocate(void* p, std::size_t /*bytes*/, unsigned stream) noexcept override {
    if (async_) {
      (void)api_.free_async(p, streams_[stream]);
    } else {
      (void)api_.free(p);
    }
  }
  void quiesce() override {
    for (cudaStream_t s : streams_) check(api_.stream_synchronize(s), "cudaStreamSynchronize");
  }

 private:
  const cudart& api_;
  bool async_;
  std::vector<cudaStream_t> streams_;
  cudaMemPool_t pool_ = nullptr;
};

}  // namespace

std::string cuda_runtime_unavailable_reason() { return runtime().failure; }

std::unique_ptr<subject> make_cuda_runtime_subject(std::string_view name, int device) {
  if (!is_cuda_runtime_subject(name)) throw std::runtime_error(fmt::format("not a runtime subject: {}", name));
  return std::make_unique<runtime_subject>(name == "cudaMallocAsync", device);
}

#else  // no CUDA headers at build time

std::string cuda_runtime_unavailable_reason() { return "built without CUDA headers"; }

std::unique_ptr<subject> make_cuda_runtime_subject(std::string_view /*name*/, int /*device*/) {
  throw std::runtime_error(cuda_runtime_unavailable_reason());
}

#endif

}  // namespace fragctl::bench
