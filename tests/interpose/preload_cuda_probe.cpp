// A CUDA runtime program run under LD_PRELOAD=libfragctl_preload.so on a GPU
// (FRAGCTL_BACKEND=cuda): memory from cudaMalloc and cudaMallocAsync works
// for kernels and copies, comes from fragctl, and memory fragctl did not hand
// out (managed memory) is freed by the real runtime, and the default memory
// pool's statistics are fragctl's. Exits 77 (skipped)
// where there is no CUDA device.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

std::atomic<int> failures{0};

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "preload_cuda_probe: check failed: %s\n", what);
    ++failures;
  }
}

#define CHECK(condition) check((condition), #condition)

std::uint64_t pool_attribute(cudaMemPool_t pool, cudaMemPoolAttr attribute) {
  std::uint64_t value = 0;
  CHECK(cudaMemPoolGetAttribute(pool, attribute, &value) == cudaSuccess);
  return value;
}

// What PyTorch's cudaMallocAsync backend reads and resets.
void check_default_pool(std::size_t bytes, cudaStream_t stream) {
  int device = 0;
  CHECK(cudaGetDevice(&device) == cudaSuccess);
  cudaMemPool_t pool = nullptr;
  CHECK(cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess);
  void* p = nullptr;
  CHECK(cudaMallocAsync(&p, bytes, stream) == cudaSuccess);
  CHECK(pool_attribute(pool, cudaMemPoolAttrUsedMemCurrent) >= bytes);
  CHECK(pool_attribute(pool, cudaMemPoolAttrReservedMemCurrent) >= bytes);
  CHECK(cudaFreeAsync(p, stream) == cudaSuccess);
  CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
  CHECK(pool_attribute(pool, cudaMemPoolAttrUsedMemCurrent) == 0);
  CHECK(pool_attribute(pool, cudaMemPoolAttrUsedMemHigh) >= bytes);
  std::uint64_t zero = 0;
  CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero) == cudaSuccess);
  CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero) == cudaSuccess);
  CHECK(pool_attribute(pool, cudaMemPoolAttrUsedMemHigh) == 0);
  const std::uint64_t reserved = pool_attribute(pool, cudaMemPoolAttrReservedMemCurrent);
  CHECK(pool_attribute(pool, cudaMemPoolAttrReservedMemHigh) == reserved);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(cudaMemPoolTrimTo(pool, 0) == cudaSuccess);
  CHECK(pool_attribute(pool, cudaMemPoolAttrReservedMemCurrent) <= reserved);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 77;
  }
  using write_fn = int (*)(const char*);
  const auto write_report = reinterpret_cast<write_fn>(dlsym(RTLD_DEFAULT, "fragctl_write_default_report"));
  if (write_report == nullptr) {
    std::fprintf(stderr, "preload_cuda_probe: libfragctl_preload.so is not loaded (LD_PRELOAD)\n");
    return 1;
  }

  constexpr std::size_t bytes = std::size_t{64} << 20;
  void* p = nullptr;
  CHECK(cudaMalloc(&p, bytes) == cudaSuccess && p != nullptr);
  CHECK(cudaMemset(p, 0x5a, bytes) == cudaSuccess);
  std::vector<unsigned char> host(1 << 20);
  CHECK(cudaMemcpy(host.data(), static_cast<char*>(p) + bytes - host.size(), host.size(), cudaMemcpyDeviceToHost) ==
        cudaSuccess);
  CHECK(host.front() == 0x5a && host.back() == 0x5a);
  cudaPointerAttributes attributes{};
  CHECK(cudaPointerGetAttributes(&attributes, p) == cudaSuccess && attributes.type == cudaMemoryTypeDevice);

  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  void* q = nullptr;
  CHECK(cudaMallocAsync(&q, bytes / 2, stream) == cudaSuccess && q != nullptr);
  CHECK(cudaMemsetAsync(q, 0x11, bytes / 2, stream) == cudaSuccess);
  CHECK(cudaMemcpyAsync(host.data(), q, host.size(), cudaMemcpyDeviceToHost, stream) == cudaSuccess);
  CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
  CHECK(host.front() == 0x11 && host.back() == 0x11);
  CHECK(cudaFreeAsync(q, stream) == cudaSuccess);
  CHECK(cudaStreamSynchronize(stream) == cudaSuccess);

  CHECK(cudaFree(p) == cudaSuccess);
  // A second free never reaches the real runtime, which would free the
  // memory under fragctl (caching's segment starts at p): refused, and the
  // block handed out there next is whole device memory.
  CHECK(cudaFree(p) == cudaErrorInvalidValue);
  void* again = nullptr;
  CHECK(cudaMalloc(&again, bytes) == cudaSuccess && again != nullptr);
  CHECK(cudaMemset(again, 0x3c, bytes) == cudaSuccess);
  CHECK(cudaMemcpy(host.data(), static_cast<char*>(again) + bytes - host.size(), host.size(),
                   cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(host.front() == 0x3c && host.back() == 0x3c);
  CHECK(cudaFree(again) == cudaSuccess);
  CHECK(cudaFree(nullptr) == cudaSuccess);
  void* managed = nullptr;  // not intercepted: cudaFree must reach the real runtime
  CHECK(cudaMallocManaged(&managed, 1 << 20) == cudaSuccess);
  CHECK(cudaFree(managed) == cudaSuccess);

  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  CHECK(cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess && free_bytes <= total_bytes && total_bytes > 0);
  // A stream freed on, destroyed before the trim below: the shim's
  // cudaStreamDestroy tells fragctl first (before, the trim recorded the
  // frees' event on the destroyed handle, and the process ended by SIGSEGV).
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
  CHECK(cudaGetLastError() == cudaSuccess);

  CHECK(write_report(argv[1]) == 0);
  std::ifstream in(argv[1]);
  std::stringstream text;
  text << in.rdbuf();
  const std::string report = text.str();
  CHECK(report.find("\"backend\": \"cuda\"") != std::string::npos);
  CHECK(report.find("\"allocations\": 3") != std::string::npos);
  CHECK(report.find("\"frees\": 3") != std::string::npos);
  check_default_pool(bytes, nullptr);  // after the report: allocates once more

  // Streams that come and go, as libraries create them per call: each is
  // allocated on, freed on (its own block, and one of the default stream's)
  // and destroyed with a block of it still live, which is freed after; the
  // default pool is trimmed every few streams. Every stream fragctl met is
  // gone before its frees are looked at again.
  void* whole = nullptr;
  std::uint64_t used_now = 1;
  int device = 0;
  CHECK(cudaGetDevice(&device) == cudaSuccess);
  cudaMemPool_t pool = nullptr;
  CHECK(cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess);
  std::vector<void*> outliving;
  for (int round = 0; round < 256; ++round) {
    cudaStream_t s = nullptr;
    CHECK(cudaStreamCreateWithFlags(&s, round % 2 == 0 ? cudaStreamNonBlocking : cudaStreamDefault) == cudaSuccess);
    void* own = nullptr;
    void* kept = nullptr;
    void* of_default = nullptr;
    const std::size_t n = std::size_t{1} << (20 + round % 4);
    CHECK(cudaMallocAsync(&own, n, s) == cudaSuccess);
    CHECK(cudaMallocAsync(&kept, 4096 + round, s) == cudaSuccess);
    CHECK(cudaMalloc(&of_default, n) == cudaSuccess);
    CHECK(cudaMemsetAsync(own, round & 0xff, n, s) == cudaSuccess);
    CHECK(cudaMemsetAsync(of_default, round & 0xff, n, s) == cudaSuccess);
    CHECK(cudaFreeAsync(own, s) == cudaSuccess);
    CHECK(cudaFreeAsync(of_default, s) == cudaSuccess);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
    outliving.push_back(kept);
    if (round % 16 == 15) CHECK(cudaMemPoolTrimTo(pool, 0) == cudaSuccess);
  }
  for (void* k : outliving) CHECK(cudaFree(k) == cudaSuccess);
  CHECK(cudaMemPoolTrimTo(pool, 0) == cudaSuccess);
  // A cudaFree of a block while another thread destroys the block's stream:
  // the shim holds the stream's end off until the free is done.
  for (int round = 0; round < 64; ++round) {
    cudaStream_t s = nullptr;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    void* b = nullptr;
    CHECK(cudaMallocAsync(&b, std::size_t{1} << 20, s) == cudaSuccess);
    CHECK(cudaMemsetAsync(b, 0x42, std::size_t{1} << 20, s) == cudaSuccess);
    std::thread destroyer([s] { CHECK(cudaStreamDestroy(s) == cudaSuccess); });
    CHECK(cudaFree(b) == cudaSuccess);
    destroyer.join();
  }
  CHECK(cudaMemPoolTrimTo(pool, 0) == cudaSuccess);
  CHECK(cudaMalloc(&whole, bytes) == cudaSuccess);
  CHECK(cudaMemset(whole, 0x77, bytes) == cudaSuccess);
  CHECK(cudaMemcpy(host.data(), whole, host.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(host.front() == 0x77 && host.back() == 0x77);
  CHECK(cudaFree(whole) == cudaSuccess);
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used_now) == cudaSuccess);
  CHECK(used_now == 0);
  CHECK(cudaGetLastError() == cudaSuccess);
  std::printf("preload_cuda_probe: %d failures\n", failures.load());
  return failures == 0 ? 0 : 1;
}
