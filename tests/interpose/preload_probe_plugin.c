/* The checks of the preload tests: a program's use of the CUDA runtime
 * (here the fake libcudart.so), run with or without libfragctl_preload.so.
 * Linked into preload_probe_linked, and dlopen'ed with RTLD_LOCAL by
 * preload_probe_dlopen (as Python loads torch and its libcudart), where
 * RTLD_NEXT cannot see the runtime and the preload library must find it
 * among the loaded objects. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cudaMalloc(void** p, size_t n);
int cudaFree(void* p);
int cudaMallocAsync(void** p, size_t n, void* stream);
int cudaFreeAsync(void* p, void* stream);
int cudaMallocAsync_ptsz(void** p, size_t n, void* stream);
int cudaFreeAsync_ptsz(void* p, void* stream);
int cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
int cudaDeviceGetDefaultMemPool(void** pool, int device);
int cudaMemPoolGetAttribute(void* pool, int attribute, void* value);
int cudaMemPoolSetAttribute(void* pool, int attribute, void* value);
int cudaMemPoolTrimTo(void* pool, size_t min_bytes_to_keep);
int fake_cudart_count(const char* name);
void* fake_cudart_block(size_t bytes);

static int failures = 0;

#define CHECK(condition)                                                  \
  do {                                                                    \
    if (!(condition)) {                                                   \
      fprintf(stderr, "probe: check failed: %s (line %d)\n", #condition, __LINE__); \
      ++failures;                                                         \
    }                                                                     \
  } while (0)

enum { reserved_current = 5, reserved_high = 6, used_current = 7, used_high = 8 };
static const uint64_t fake_pool_value = 777; /* what the fake runtime's pools answer */

static uint64_t pool_attribute(void* pool, int attribute) {
  uint64_t value = 0;
  CHECK(cudaMemPoolGetAttribute(pool, attribute, &value) == 0);
  return value;
}

/* The default pool's statistics, as PyTorch's cudaMallocAsync backend reads
 * and resets them: fragctl's figures under fragctl, the runtime's otherwise. */
static void check_default_pool(int fragctl, void* stream) {
  void* pool = NULL;
  CHECK(cudaDeviceGetDefaultMemPool(&pool, 0) == 0 && pool != NULL);
  CHECK(fake_cudart_count("cudaDeviceGetDefaultMemPool") == 1);
  const uint64_t block = 3 << 20;
  void* p = NULL;
  CHECK(cudaMallocAsync(&p, block, stream) == 0 && p != NULL);
  if (fragctl) {
    CHECK(pool_attribute(pool, used_current) >= block);
    CHECK(pool_attribute(pool, reserved_current) >= pool_attribute(pool, used_current));
  } else {
    CHECK(pool_attribute(pool, used_current) == fake_pool_value);
  }
  CHECK(cudaFreeAsync(p, stream) == 0);
  const uint64_t zero = 0;
  if (fragctl) {
    CHECK(pool_attribute(pool, used_current) == 0);
    CHECK(pool_attribute(pool, used_high) >= block);
    CHECK(pool_attribute(pool, reserved_high) >= block);
    /* Resetting a high starts a new window, at the current figures. */
    CHECK(cudaMemPoolSetAttribute(pool, used_high, (void*)&zero) == 0);
    CHECK(cudaMemPoolSetAttribute(pool, reserved_high, (void*)&zero) == 0);
    CHECK(pool_attribute(pool, used_high) == 0);
    CHECK(pool_attribute(pool, reserved_high) == pool_attribute(pool, reserved_current));
    CHECK(pool_attribute(pool, reserved_current) >= block); /* the cache */
    CHECK(fake_cudart_count("cudaMemPoolGetAttribute") == 0);
    CHECK(fake_cudart_count("cudaMemPoolSetAttribute") == 0);
  }
  CHECK(cudaMemPoolTrimTo(pool, 0) == 0);
  CHECK(fake_cudart_count("cudaMemPoolTrimTo") == 1); /* the real trim runs too */
  CHECK(pool_attribute(pool, reserved_current) == (fragctl ? 0 : fake_pool_value));
  if (fragctl) CHECK(pool_attribute(pool, reserved_high) >= block); /* the window's peak stays */

  /* Any other pool, and the release threshold, are the runtime's. */
  const int gets = fake_cudart_count("cudaMemPoolGetAttribute");
  void* other = (void*)((uintptr_t)pool + 1);
  CHECK(pool_attribute(other, used_current) == fake_pool_value);
  CHECK(pool_attribute(pool, 4) == fake_pool_value);
  CHECK(fake_cudart_count("cudaMemPoolGetAttribute") == gets + 2);
  const int sets = fake_cudart_count("cudaMemPoolSetAttribute");
  const uint64_t threshold = UINT64_MAX;
  CHECK(cudaMemPoolSetAttribute(pool, 4, (void*)&threshold) == 0);
  CHECK(cudaMemPoolSetAttribute(other, used_high, (void*)&zero) == 0);
  CHECK(fake_cudart_count("cudaMemPoolSetAttribute") == sets + 2);
}

/* Runs every check; `fragctl` says whether libfragctl_preload.so is expected
 * to serve the allocations, `report` is where to write fragctl's report. */
__attribute__((visibility("default"))) int probe_run(int fragctl, const char* report) {
  void* stream = (void*)0x77;
  void* p = NULL;
  CHECK(cudaMalloc(&p, 1 << 20) == 0 && p != NULL);
  if (p != NULL) memset(p, 0xab, 1 << 20); /* usable memory either way */
  CHECK(fake_cudart_count("cudaMalloc") == (fragctl ? 0 : 1));
  CHECK(cudaFree(p) == 0);
  CHECK(fake_cudart_count("cudaFree") == (fragctl ? 0 : 1));
  /* fragctl's cudaFree synchronizes the device, as the real one does. */
  CHECK(fake_cudart_count("cudaDeviceSynchronize") == (fragctl ? 1 : 0));

  CHECK(cudaFree(NULL) == 0); /* always the real function */
  CHECK(fake_cudart_count("cudaFree") == (fragctl ? 1 : 2));

  void* q = NULL;
  CHECK(cudaMallocAsync(&q, 4096, stream) == 0 && q != NULL);
  if (q != NULL) memset(q, 0xcd, 4096);
  CHECK(cudaFreeAsync(q, stream) == 0);
  CHECK(cudaMallocAsync_ptsz(&q, 4096, NULL) == 0 && q != NULL);
  CHECK(cudaFreeAsync_ptsz(q, NULL) == 0);
  CHECK(fake_cudart_count("cudaMallocAsync") + fake_cudart_count("cudaMallocAsync_ptsz") == (fragctl ? 0 : 2));

  /* A pointer the runtime handed out some other way goes back to it. */
  void* foreign = fake_cudart_block(64);
  CHECK(cudaFree(foreign) == 0);
  CHECK(fake_cudart_count("unknown_free") == 0);

  size_t free_bytes = 0, total_bytes = 0;
  CHECK(cudaMemGetInfo(&free_bytes, &total_bytes) == 0);
  CHECK(total_bytes == ((size_t)8 << 30));
  if (fragctl) {
    CHECK(free_bytes > ((size_t)4 << 30)); /* fragctl's cache counts as free */
  } else {
    CHECK(free_bytes == ((size_t)4 << 30));
  }

  if (fragctl) {
    typedef int (*write_fn)(const char*);
    write_fn write_report = (write_fn)dlsym(RTLD_DEFAULT, "fragctl_write_default_report");
    CHECK(write_report != NULL);
    if (write_report != NULL) {
      CHECK(write_report(report) == 0);
      FILE* f = fopen(report, "r");
      char text[1 << 16];
      size_t n = f != NULL ? fread(text, 1, sizeof text - 1, f) : 0;
      if (f != NULL) fclose(f);
      text[n] = '\0';
      CHECK(strstr(text, "\"allocator\": \"caching\"") != NULL);
      CHECK(strstr(text, "\"allocations\": 3") != NULL);
      CHECK(strstr(text, "\"frees\": 3") != NULL);
    }
  }
  check_default_pool(fragctl, stream);
  printf("probe: %s, %d failures\n", fragctl ? "fragctl" : "native", failures);
  return failures == 0 ? 0 : 1;
}
