/* A stand-in for libcudart.so in tests without a GPU: the allocation entry
 * points fragctl's preload library replaces, backed by host memory, with call
 * counters so a test sees which calls reached the "real" runtime. Its memory
 * pools (the default pool of device d is FAKE_POOL + d) answer every
 * attribute with FAKE_POOL_VALUE. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_BLOCKS 64
#define FAKE_EXPORT __attribute__((visibility("default")))

static void* blocks[FAKE_BLOCKS];
static int counts[32];
static const char* const names[] = {"cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync",
                                    "cudaMallocAsync_ptsz", "cudaFreeAsync_ptsz", "cudaMemGetInfo",
                                    "cudaGetDevice", "cudaSetDevice", "cudaDeviceSynchronize",
                                    "unknown_free", "cudaDeviceGetDefaultMemPool", "cudaMemPoolGetAttribute",
                                    "cudaMemPoolSetAttribute", "cudaMemPoolTrimTo"};
enum { MALLOC, FREE, MALLOC_ASYNC, FREE_ASYNC, MALLOC_ASYNC_PTSZ, FREE_ASYNC_PTSZ, MEM_GET_INFO, GET_DEVICE,
       SET_DEVICE, SYNCHRONIZE, UNKNOWN_FREE, DEFAULT_POOL, POOL_GET, POOL_SET, POOL_TRIM, COUNT };

#define FAKE_POOL ((uintptr_t)0xd000)
#define FAKE_POOL_VALUE 777

/* Calls of `name` so far (a cudaXxx name, or "unknown_free": frees of a pointer
 * this runtime did not hand out). */
FAKE_EXPORT int fake_cudart_count(const char* name) {
  for (int i = 0; i < COUNT; ++i) {
    if (strcmp(names[i], name) == 0) return counts[i];
  }
  return -1;
}

/* Host memory this runtime owns, as its own allocator would hand out. */
FAKE_EXPORT void* fake_cudart_block(size_t bytes) {
  for (int i = 0; i < FAKE_BLOCKS; ++i) {
    if (blocks[i] == NULL) return blocks[i] = malloc(bytes ? bytes : 1);
  }
  return NULL;
}

static int release(void* p) {
  if (p == NULL) return 0;
  for (int i = 0; i < FAKE_BLOCKS; ++i) {
    if (blocks[i] == p) {
      free(p);
      blocks[i] = NULL;
      return 0;
    }
  }
  ++counts[UNKNOWN_FREE];
  return 1; /* cudaErrorInvalidValue */
}

FAKE_EXPORT int cudaMalloc(void** p, size_t n) { ++counts[MALLOC]; *p = fake_cudart_block(n); return 0; }
FAKE_EXPORT int cudaFree(void* p) { ++counts[FREE]; return release(p); }
FAKE_EXPORT int cudaMallocAsync(void** p, size_t n, void* s) { (void)s; ++counts[MALLOC_ASYNC]; *p = fake_cudart_block(n); return 0; }
FAKE_EXPORT int cudaFreeAsync(void* p, void* s) { (void)s; ++counts[FREE_ASYNC]; return release(p); }
FAKE_EXPORT int cudaMallocAsync_ptsz(void** p, size_t n, void* s) { (void)s; ++counts[MALLOC_ASYNC_PTSZ]; *p = fake_cudart_block(n); return 0; }
FAKE_EXPORT int cudaFreeAsync_ptsz(void* p, void* s) { (void)s; ++counts[FREE_ASYNC_PTSZ]; return release(p); }
FAKE_EXPORT int cudaMemGetInfo(size_t* f, size_t* t) {
  ++counts[MEM_GET_INFO];
  *f = (size_t)4 << 30;
  *t = (size_t)8 << 30;
  return 0;
}
FAKE_EXPORT int cudaGetDevice(int* d) { ++counts[GET_DEVICE]; *d = 0; return 0; }
FAKE_EXPORT int cudaSetDevice(int d) { (void)d; ++counts[SET_DEVICE]; return 0; }
FAKE_EXPORT int cudaDeviceSynchronize(void) { ++counts[SYNCHRONIZE]; return 0; }
FAKE_EXPORT int cudaDeviceGetDefaultMemPool(void** pool, int d) {
  ++counts[DEFAULT_POOL];
  *pool = (void*)(FAKE_POOL + (uintptr_t)d);
  return 0;
}
FAKE_EXPORT int cudaMemPoolGetAttribute(void* pool, int attr, void* value) {
  (void)pool;
  (void)attr;
  ++counts[POOL_GET];
  *(uint64_t*)value = FAKE_POOL_VALUE;
  return 0;
}
FAKE_EXPORT int cudaMemPoolSetAttribute(void* pool, int attr, void* value) {
  (void)pool;
  (void)attr;
  (void)value;
  ++counts[POOL_SET];
  return 0;
}
FAKE_EXPORT int cudaMemPoolTrimTo(void* pool, size_t keep) {
  (void)pool;
  (void)keep;
  ++counts[POOL_TRIM];
  return 0;
}
