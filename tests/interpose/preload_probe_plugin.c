/* The checks of the preload tests: a program's use of the CUDA runtime
 * (here the fake libcudart.so), run with or without libfragctl_preload.so.
 * Linked into preload_probe_linked, and dlopen'ed with RTLD_LOCAL by
 * preload_probe_dlopen (as Python loads torch and its libcudart), where
 * RTLD_NEXT cannot see the runtime and the preload library must find it
 * among the loaded objects. */
#include <dlfcn.h>
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
  printf("probe: %s, %d failures\n", fragctl ? "fragctl" : "native", failures);
  return failures == 0 ? 0 : 1;
}
