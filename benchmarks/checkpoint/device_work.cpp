#include "device_work.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "fragctl/log.hpp"

namespace fragctl::bench {
namespace {

// fill, check and spin for any GPU from sm_80 on (the driver compiles the PTX
// for the device at load). Grid-stride loops over 32-bit words.
constexpr const char* kernels_ptx = R"(
.version 7.0
.target sm_80
.address_size 64

.visible .entry fragctl_spin(.param .u64 ns)
{
  .reg .u64 %rd<5>;
  .reg .pred %p;
  ld.param.u64 %rd1, [ns];
  mov.u64 %rd2, %globaltimer;
SPIN:
  mov.u64 %rd3, %globaltimer;
  sub.u64 %rd4, %rd3, %rd2;
  setp.lt.u64 %p, %rd4, %rd1;
  @%p bra SPIN;
  ret;
}

.visible .entry fragctl_fill(.param .u64 ptr, .param .u64 n, .param .u32 seed)
{
  .reg .u64 %rd<8>;
  .reg .u32 %r<8>;
  .reg .pred %p;
  ld.param.u64 %rd1, [ptr];
  ld.param.u64 %rd2, [n];
  ld.param.u32 %r1, [seed];
  mov.u32 %r2, %ctaid.x;
  mov.u32 %r3, %ntid.x;
  mov.u32 %r4, %tid.x;
  mov.u32 %r5, %nctaid.x;
  mul.wide.u32 %rd3, %r2, %r3;
  cvt.u64.u32 %rd4, %r4;
  add.u64 %rd3, %rd3, %rd4;
  mul.wide.u32 %rd5, %r5, %r3;
FILL:
  setp.ge.u64 %p, %rd3, %rd2;
  @%p bra FILL_DONE;
  cvt.u32.u64 %r6, %rd3;
  mul.lo.u32 %r7, %r6, 0x9E3779B1;
  xor.b32 %r7, %r7, %r1;
  shl.b64 %rd6, %rd3, 2;
  add.u64 %rd7, %rd1, %rd6;
  st.global.u32 [%rd7], %r7;
  add.u64 %rd3, %rd3, %rd5;
  bra FILL;
FILL_DONE:
  ret;
}

.visible .entry fragctl_check(.param .u64 ptr, .param .u64 n, .param .u32 seed, .param .u64 errors)
{
  .reg .u64 %rd<9>;
  .reg .u32 %r<10>;
  .reg .pred %p<2>;
  ld.param.u64 %rd1, [ptr];
  ld.param.u64 %rd2, [n];
  ld.param.u32 %r1, [seed];
  ld.param.u64 %rd8, [errors];
  mov.u32 %r2, %ctaid.x;
  mov.u32 %r3, %ntid.x;
  mov.u32 %r4, %tid.x;
  mov.u32 %r5, %nctaid.x;
  mul.wide.u32 %rd3, %r2, %r3;
  cvt.u64.u32 %rd4, %r4;
  add.u64 %rd3, %rd3, %rd4;
  mul.wide.u32 %rd5, %r5, %r3;
CHECK:
  setp.ge.u64 %p0, %rd3, %rd2;
  @%p0 bra CHECK_DONE;
  cvt.u32.u64 %r6, %rd3;
  mul.lo.u32 %r7, %r6, 0x9E3779B1;
  xor.b32 %r7, %r7, %r1;
  shl.b64 %rd6, %rd3, 2;
  add.u64 %rd7, %rd1, %rd6;
  ld.global.u32 %r8, [%rd7];
  setp.ne.u32 %p1, %r8, %r7;
  @%p1 atom.global.add.u32 %r9, [%rd8], 1;
  add.u64 %rd3, %rd3, %rd5;
  bra CHECK;
CHECK_DONE:
  ret;
}
)";

/// The driver calls the kernels need (CUresult is an int, handles are pointers,
/// CUdevice is an int).
struct driver_calls {
  int (*device_get)(int* device, int ordinal) = nullptr;
  int (*primary_ctx_retain)(void** context, int device) = nullptr;
  int (*ctx_set_current)(void* context) = nullptr;
  int (*module_load_data)(void** module, const void* image) = nullptr;
  int (*module_get_function)(void** function, void* module, const char* name) = nullptr;
  int (*launch_kernel)(void* function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                       unsigned bz, unsigned shared, void* stream, void** params, void** extra) = nullptr;
};

template <class F>
bool resolve(void* lib, const char* name, F& out) {
  out = reinterpret_cast<F>(dlsym(lib, name));
  return out != nullptr;
}

class kernel_work final : public device_work {
 public:
  kernel_work(device_backend& backend, device_allocator& allocator, const driver_calls& cu, void* fill,
              void* check, void* spin)
      : backend_(backend), allocator_(allocator), cu_(cu), fill_(fill), check_(check), spin_(spin) {
    counter_ = allocator_.allocate(min_alignment, nullptr);
    host_ = static_cast<std::uint32_t*>(backend_.allocate_host(4096));
    host_[0] = 0;
    backend_.memcpy_async(counter_, host_, sizeof(std::uint32_t), nullptr);
    backend_.synchronize_stream(nullptr);
  }
  ~kernel_work() override {
    allocator_.deallocate(counter_, min_alignment, nullptr);
    backend_.free_host(host_, 4096);
  }

  void fill(void* p, std::size_t bytes, std::uint32_t seed, stream_t stream) override {
    std::uint64_t n = bytes / 4;
    void* args[] = {&p, &n, &seed};
    launch(fill_, 1024, 256, stream, args);
  }
  void check(const void* p, std::size_t bytes, std::uint32_t seed, stream_t stream) override {
    std::uint64_t n = bytes / 4;
    void* args[] = {const_cast<void**>(&p), &n, &seed, &counter_};
    launch(check_, 1024, 256, stream, args);
    last_ = stream;
  }
  void spin(double ms, stream_t stream) override {
    auto ns = static_cast<std::uint64_t>(ms * 1e6);
    void* args[] = {&ns};
    launch(spin_, 1, 1, stream, args);
  }
  std::uint64_t errors() override {
    backend_.memcpy_async(host_, counter_, sizeof(std::uint32_t), last_);
    backend_.synchronize_stream(last_);
    return host_[0];
  }
  [[nodiscard]] std::string_view kind() const noexcept override { return "cuda kernels"; }
  [[nodiscard]] bool computes() const noexcept override { return true; }

 private:
  void launch(void* f, unsigned grid, unsigned block, stream_t stream, void** args) {
    if (const int rc = cu_.launch_kernel(f, grid, 1, 1, block, 1, 1, 0, stream, args, nullptr); rc != 0) {
      throw std::runtime_error("cuLaunchKernel failed: CUresult " + std::to_string(rc));
    }
  }

  device_backend& backend_;
  device_allocator& allocator_;
  driver_calls cu_;
  void* fill_;
  void* check_;
  void* spin_;
  void* counter_ = nullptr;
  std::uint32_t* host_ = nullptr;
  stream_t last_ = nullptr;
};

/// Pattern through pinned host staging: slow, synchronous, for sim and as a fallback.
class host_work final : public device_work {
 public:
  explicit host_work(device_backend& backend) : backend_(backend) {}
  ~host_work() override {
    if (staging_ != nullptr) backend_.free_host(staging_, capacity_);
  }
  void fill(void* p, std::size_t bytes, std::uint32_t seed, stream_t stream) override {
    auto* w = staging(bytes);
    for (std::size_t i = 0; i < bytes / 4; ++i) w[i] = pattern_word(i, seed);
    backend_.memcpy_async(p, w, bytes, stream);
    backend_.synchronize_stream(stream);
  }
  void check(const void* p, std::size_t bytes, std::uint32_t seed, stream_t stream) override {
    auto* w = staging(bytes);
    backend_.memcpy_async(w, p, bytes, stream);
    backend_.synchronize_stream(stream);
    for (std::size_t i = 0; i < bytes / 4; ++i) errors_ += w[i] != pattern_word(i, seed) ? 1 : 0;
  }
  void spin(double, stream_t) override {}
  std::uint64_t errors() override { return errors_; }
  [[nodiscard]] std::string_view kind() const noexcept override { return "host copies"; }
  [[nodiscard]] bool computes() const noexcept override { return false; }

 private:
  std::uint32_t* staging(std::size_t bytes) {
    if (bytes > capacity_) {
      if (staging_ != nullptr) backend_.free_host(staging_, capacity_);
      capacity_ = bytes;
      staging_ = backend_.allocate_host(capacity_);
      if (staging_ == nullptr) throw std::bad_alloc();
    }
    return static_cast<std::uint32_t*>(staging_);
  }
  device_backend& backend_;
  void* staging_ = nullptr;
  std::size_t capacity_ = 0;
  std::uint64_t errors_ = 0;
};

std::unique_ptr<device_work> load_kernels(device_backend& backend, device_allocator& allocator) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  driver_calls cu;
  if (lib == nullptr || !resolve(lib, "cuDeviceGet", cu.device_get) ||
      !resolve(lib, "cuDevicePrimaryCtxRetain", cu.primary_ctx_retain) ||
      !resolve(lib, "cuCtxSetCurrent", cu.ctx_set_current) ||
      !resolve(lib, "cuModuleLoadData", cu.module_load_data) ||
      !resolve(lib, "cuModuleGetFunction", cu.module_get_function) ||
      !resolve(lib, "cuLaunchKernel", cu.launch_kernel)) {
    logger().warn("checkpoint bench: driver entry points for kernels not found");
    return nullptr;
  }
  int device = 0;
  void* context = nullptr;
  void* module = nullptr;
  void *fill = nullptr, *check = nullptr, *spin = nullptr;
  int rc = cu.device_get(&device, backend.device());
  if (rc == 0) rc = cu.primary_ctx_retain(&context, device);
  if (rc == 0) rc = cu.ctx_set_current(context);
  if (rc == 0) rc = cu.module_load_data(&module, kernels_ptx);
  if (rc == 0) rc = cu.module_get_function(&fill, module, "fragctl_fill");
  if (rc == 0) rc = cu.module_get_function(&check, module, "fragctl_check");
  if (rc == 0) rc = cu.module_get_function(&spin, module, "fragctl_spin");
  if (rc != 0) {
    logger().warn("checkpoint bench: loading the kernels failed (CUresult {})", rc);
    return nullptr;
  }
  return std::make_unique<kernel_work>(backend, allocator, cu, fill, check, spin);
}

}  // namespace

std::unique_ptr<device_work> make_device_work(device_backend& backend, device_allocator& allocator) {
  if (backend.name() == "cuda") {
    if (auto k = load_kernels(backend, allocator)) return k;
  }
  return std::make_unique<host_work>(backend);
}

}  // namespace fragctl::bench
