// libfragctl_preload.so: LD_PRELOAD it and the CUDA runtime's and HIP's
// allocation (and default memory pool, IPC and peer access) entry points below come from fragctl
// (docs/integration.md).
// Nothing but one-line forwarders into the tested layer
// (interpose/interposer.hpp). Prototypes use plain C types (int error codes,
// void* streams) so no runtime header or library is needed to build this;
// the symbols are exported unversioned.
//
// next_symbol must live here: dlsym(RTLD_NEXT, ...) searches the objects
// after the one that calls it, and this library is the one that shadows the
// runtime.
#include <dlfcn.h>

#include <cstddef>

#include "interpose/process_layers.hpp"

namespace {

void* next_symbol(const char* name) { return dlsym(RTLD_NEXT, name); }

using fragctl::interpose::mem_access_desc;
using fragctl::interpose::stream_mode;
fragctl::interpose::interposer& cuda() { return fragctl::interpose::cuda_interposer(&next_symbol); }
fragctl::interpose::interposer& hip() { return fragctl::interpose::hip_interposer(&next_symbol); }

}  // namespace

#define FRAGCTL_PRELOAD_EXPORT extern "C" __attribute__((visibility("default")))

// CUDA runtime.
FRAGCTL_PRELOAD_EXPORT int cudaMalloc(void** ptr, std::size_t size) { return cuda().malloc(ptr, size); }
FRAGCTL_PRELOAD_EXPORT int cudaFree(void* ptr) { return cuda().free(ptr); }
FRAGCTL_PRELOAD_EXPORT int cudaMallocAsync(void** ptr, std::size_t size, void* stream) {
  return cuda().malloc_async(ptr, size, stream, stream_mode::legacy);
}
FRAGCTL_PRELOAD_EXPORT int cudaFreeAsync(void* ptr, void* stream) {
  return cuda().free_async(ptr, stream, stream_mode::legacy);
}
FRAGCTL_PRELOAD_EXPORT int cudaMallocAsync_ptsz(void** ptr, std::size_t size, void* stream) {
  return cuda().malloc_async(ptr, size, stream, stream_mode::per_thread);
}
FRAGCTL_PRELOAD_EXPORT int cudaFreeAsync_ptsz(void* ptr, void* stream) {
  return cuda().free_async(ptr, stream, stream_mode::per_thread);
}
FRAGCTL_PRELOAD_EXPORT int cudaStreamDestroy(void* stream) { return cuda().stream_destroy(stream); }
FRAGCTL_PRELOAD_EXPORT int cudaMemGetInfo(std::size_t* free, std::size_t* total) {
  return cuda().mem_get_info(free, total);
}
FRAGCTL_PRELOAD_EXPORT int cudaDeviceGetDefaultMemPool(void** pool, int device) {
  return cuda().device_get_default_mem_pool(pool, device);
}
FRAGCTL_PRELOAD_EXPORT int cudaMemPoolGetAttribute(void* pool, int attribute, void* value) {
  return cuda().mem_pool_get_attribute(pool, attribute, value);
}
FRAGCTL_PRELOAD_EXPORT int cudaMemPoolSetAttribute(void* pool, int attribute, void* value) {
  return cuda().mem_pool_set_attribute(pool, attribute, value);
}
FRAGCTL_PRELOAD_EXPORT int cudaMemPoolTrimTo(void* pool, std::size_t min_bytes_to_keep) {
  return cuda().mem_pool_trim_to(pool, min_bytes_to_keep);
}
FRAGCTL_PRELOAD_EXPORT int cudaIpcGetMemHandle(void* handle, void* ptr) { return cuda().ipc_get_mem_handle(handle, ptr); }
FRAGCTL_PRELOAD_EXPORT int cudaDeviceEnablePeerAccess(int peer, unsigned flags) {
  return cuda().device_enable_peer_access(peer, flags);
}
FRAGCTL_PRELOAD_EXPORT int cudaMemPoolSetAccess(void* pool, const void* descs, std::size_t count) {
  return cuda().mem_pool_set_access(pool, static_cast<const mem_access_desc*>(descs), count);
}

// HIP.
FRAGCTL_PRELOAD_EXPORT int hipMalloc(void** ptr, std::size_t size) { return hip().malloc(ptr, size); }
FRAGCTL_PRELOAD_EXPORT int hipFree(void* ptr) { return hip().free(ptr); }
FRAGCTL_PRELOAD_EXPORT int hipMallocAsync(void** ptr, std::size_t size, void* stream) {
  return hip().malloc_async(ptr, size, stream, stream_mode::legacy);
}
FRAGCTL_PRELOAD_EXPORT int hipFreeAsync(void* ptr, void* stream) {
  return hip().free_async(ptr, stream, stream_mode::legacy);
}
FRAGCTL_PRELOAD_EXPORT int hipStreamDestroy(void* stream) { return hip().stream_destroy(stream); }
FRAGCTL_PRELOAD_EXPORT int hipMemGetInfo(std::size_t* free, std::size_t* total) {
  return hip().mem_get_info(free, total);
}
FRAGCTL_PRELOAD_EXPORT int hipDeviceGetDefaultMemPool(void** pool, int device) {
  return hip().device_get_default_mem_pool(pool, device);
}
FRAGCTL_PRELOAD_EXPORT int hipMemPoolGetAttribute(void* pool, int attribute, void* value) {
  return hip().mem_pool_get_attribute(pool, attribute, value);
}
FRAGCTL_PRELOAD_EXPORT int hipMemPoolSetAttribute(void* pool, int attribute, void* value) {
  return hip().mem_pool_set_attribute(pool, attribute, value);
}
FRAGCTL_PRELOAD_EXPORT int hipMemPoolTrimTo(void* pool, std::size_t min_bytes_to_keep) {
  return hip().mem_pool_trim_to(pool, min_bytes_to_keep);
}
FRAGCTL_PRELOAD_EXPORT int hipIpcGetMemHandle(void* handle, void* ptr) { return hip().ipc_get_mem_handle(handle, ptr); }
FRAGCTL_PRELOAD_EXPORT int hipDeviceEnablePeerAccess(int peer, unsigned flags) {
  return hip().device_enable_peer_access(peer, flags);
}
FRAGCTL_PRELOAD_EXPORT int hipMemPoolSetAccess(void* pool, const void* descs, std::size_t count) {
  return hip().mem_pool_set_access(pool, static_cast<const mem_access_desc*>(descs), count);
}
