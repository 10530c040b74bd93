// Probe (k4.sh): do the CUDA virtual-memory calls of a growing arena run in parallel when made
// from several host threads? Each thread creates, maps and grants access to its share of
// `total` bytes as handles of `chunk` bytes in its own part of one reserved range; phases are
// timed apart (all threads start each phase together), then everything is unmapped and
// released. Prints wall ms per phase for 1, 2, 4 and 8 threads.
#include <cuda.h>
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>

#define LOAD(name) auto p_##name = reinterpret_cast<decltype(&name)>(dlsym(lib, #name))
#define CHECK(x)                                                       \
  do {                                                                 \
    CUresult r_ = (x);                                                 \
    if (r_ != CUDA_SUCCESS) {                                          \
      std::fprintf(stderr, "%s failed: %d (line %d)\n", #x, r_, __LINE__); \
      std::exit(1);                                                    \
    }                                                                  \
  } while (0)

int main(int argc, char** argv) {
  const std::size_t chunk = (argc > 1 ? std::atoll(argv[1]) : 16) << 20;
  const std::size_t total = (argc > 2 ? std::atoll(argv[2]) : 8192) << 20;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) { std::fprintf(stderr, "no libcuda\n"); return 1; }
  LOAD(cuInit); LOAD(cuDeviceGet); LOAD(cuDevicePrimaryCtxRetain); LOAD(cuCtxSetCurrent);
  LOAD(cuMemAddressReserve); LOAD(cuMemAddressFree); LOAD(cuMemRelease); LOAD(cuMemUnmap);
  LOAD(cuMemSetAccess); LOAD(cuMemGetAllocationGranularity);
  auto p_cuMemCreate = reinterpret_cast<decltype(&cuMemCreate)>(dlsym(lib, "cuMemCreate"));
  auto p_cuMemMap = reinterpret_cast<decltype(&cuMemMap)>(dlsym(lib, "cuMemMap"));
  CHECK(p_cuInit(0));
  CUdevice dev; CHECK(p_cuDeviceGet(&dev, 0));
  CUcontext ctx; CHECK(p_cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(p_cuCtxSetCurrent(ctx));
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  CUmemAccessDesc desc{};
  desc.location = prop.location;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const std::size_t n = total / chunk;
  CUdeviceptr base; CHECK(p_cuMemAddressReserve(&base, total, 0, 0, 0));
  std::printf("chunk %zu MiB, %zu handles, %zu MiB\n", chunk >> 20, n, total >> 20);
  for (int threads : {1, 2, 4, 8, 1}) {
    std::vector<CUmemGenericAllocationHandle> h(n);
    double ms[5] = {};
    const char* names[5] = {"create", "map", "set_access", "unmap", "release"};
    for (int phase = 0; phase < 5; ++phase) {
      auto t0 = std::chrono::steady_clock::now();
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
          CHECK(p_cuCtxSetCurrent(ctx));
          for (std::size_t i = t; i < n; i += threads) {
            const CUdeviceptr at = base + i * chunk;
            switch (phase) {
              case 0: CHECK(p_cuMemCreate(&h[i], chunk, &prop, 0)); break;
              case 1: CHECK(p_cuMemMap(at, chunk, 0, h[i], 0)); break;
              case 2: CHECK(p_cuMemSetAccess(at, chunk, &desc, 1)); break;
              case 3: CHECK(p_cuMemUnmap(at, chunk)); break;
              case 4: CHECK(p_cuMemRelease(h[i])); break;
            }
          }
        });
      }
      for (auto& th : pool) th.join();
      ms[phase] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
    std::printf("threads %d:", threads);
    for (int p = 0; p < 5; ++p) std::printf("  %s %.1f ms (%.1f us/handle)", names[p], ms[p], ms[p] * 1e3 / n);
    std::printf("  create+map+access %.1f ms\n", ms[0] + ms[1] + ms[2]);
  }
  CHECK(p_cuMemAddressFree(base, total));
}
