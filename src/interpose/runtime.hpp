// The GPU runtime functions the LD_PRELOAD layer replaces or calls, declared
// with plain C types so nothing here needs a runtime header or library at
// build time, and how the real ones are found.
//
// Finding the real function. The preload library hands the layer a resolver
// that calls dlsym(RTLD_NEXT, name) from inside the preload library (RTLD_NEXT
// is relative to the object that calls dlsym). RTLD_NEXT searches only the
// program's global scope, which lacks a runtime that was loaded by dlopen
// with RTLD_LOCAL (Python imports torch that way, and torch's libcudart comes
// with it). So when the resolver finds nothing, the layer looks through the
// loaded objects for one whose file name starts with the runtime's library
// name (libcudart.so, libamdhip64.so) and asks that object directly.
// Lookups happen on first use and are cached.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace fragctl::interpose {

/// Error codes the layer returns; CUDA's runtime and HIP use the same values.
inline constexpr int success = 0;
inline constexpr int error_invalid_value = 1;      ///< cudaErrorInvalidValue, hipErrorInvalidValue
inline constexpr int error_out_of_memory = 2;      ///< cudaErrorMemoryAllocation, hipErrorOutOfMemory
inline constexpr int error_not_initialized = 3;    ///< cudaErrorInitializationError, hipErrorNotInitialized
inline constexpr int error_invalid_device = 101;   ///< cudaErrorInvalidDevice, hipErrorInvalidDevice
/// cudaErrorPeerAccessAlreadyEnabled, hipErrorPeerAccessAlreadyEnabled
inline constexpr int error_peer_access_already_enabled = 704;
inline constexpr int error_unknown = 999;          ///< cudaErrorUnknown, hipErrorUnknown

/// Runtime stream handles with special meaning (cudaStreamLegacy and
/// cudaStreamPerThread; hipStreamPerThread has the same value).
inline void* const legacy_stream = reinterpret_cast<void*>(std::uintptr_t{1});
inline void* const per_thread_stream = reinterpret_cast<void*>(std::uintptr_t{2});

/// The real functions the layer may call.
enum class real_function : std::uint8_t {
  free,                ///< int (void* ptr): cudaFree / hipFree
  free_async,          ///< int (void* ptr, void* stream): cudaFreeAsync / hipFreeAsync
  free_async_ptsz,     ///< cudaFreeAsync_ptsz (no HIP form: falls back to free_async)
  mem_get_info,        ///< int (size_t* free, size_t* total)
  get_device,          ///< int (int* device)
  set_device,          ///< int (int device)
  device_synchronize,  ///< int (void)
  device_get_default_mem_pool,  ///< int (void** pool, int device)
  mem_pool_get_attribute,       ///< int (void* pool, int attribute, void* value)
  mem_pool_set_attribute,       ///< int (void* pool, int attribute, void* value)
  mem_pool_trim_to,             ///< int (void* pool, size_t min_bytes_to_keep)
  malloc_async,                 ///< int (void** ptr, size_t bytes, void* stream): for allocations under capture
  malloc_async_ptsz,            ///< cudaMallocAsync_ptsz (no HIP form: falls back to malloc_async)
  stream_is_capturing,          ///< int (void* stream, int* status): cudaStreamIsCapturing
  ipc_get_mem_handle,           ///< int (void* handle, void* ptr): cudaIpcGetMemHandle
  device_enable_peer_access,    ///< int (int peer, unsigned flags): cudaDeviceEnablePeerAccess
  mem_pool_set_access,          ///< int (void* pool, const mem_access_desc* descs, size_t count)
  get_device_count,             ///< int (int* count): cudaGetDeviceCount
  stream_destroy,               ///< int (void* stream): cudaStreamDestroy
  count_
};

using free_fn = int (*)(void*);
using free_async_fn = int (*)(void*, void*);
using mem_get_info_fn = int (*)(std::size_t*, std::size_t*);
using get_device_fn = int (*)(int*);
using set_device_fn = int (*)(int);
using device_synchronize_fn = int (*)();
using device_get_default_mem_pool_fn = int (*)(void**, int);
using mem_pool_attribute_fn = int (*)(void*, int, void*);
using mem_pool_trim_to_fn = int (*)(void*, std::size_t);
using malloc_async_fn = int (*)(void**, std::size_t, void*);
using stream_is_capturing_fn = int (*)(void*, int*);
using ipc_get_mem_handle_fn = int (*)(void*, void*);
using device_enable_peer_access_fn = int (*)(int, unsigned);

/// cudaMemAccessDesc / hipMemAccessDesc (the same layout): a location (its
/// type, then its id) and the access flags.
struct mem_access_desc {
  int location_type;
  int location_id;
  int flags;
};
using mem_pool_set_access_fn = int (*)(void*, const mem_access_desc*, std::size_t);
using get_device_count_fn = int (*)(int*);
using stream_destroy_fn = int (*)(void*);
/// cudaMemLocationTypeDevice / hipMemLocationTypeDevice.
inline constexpr int mem_location_type_device = 1;

/// cudaStreamCaptureStatus / hipStreamCaptureStatus: 1 is "active" in both.
inline constexpr int capture_status_active = 1;
/// cudaErrorStreamCaptureUnsupported / hipErrorStreamCaptureUnsupported (900 in both).
inline constexpr int error_stream_capture_unsupported = 900;

/// Memory pool attributes (cudaMemPoolAttr, hipMemPoolAttr: same values).
/// The four statistics take a uint64_t value.
inline constexpr int pool_attr_release_threshold = 4;
inline constexpr int pool_attr_reserved_mem_current = 5;
inline constexpr int pool_attr_reserved_mem_high = 6;
inline constexpr int pool_attr_used_mem_current = 7;
inline constexpr int pool_attr_used_mem_high = 8;

/// One runtime's names.
struct runtime_api {
  std::string_view name;            ///< "cuda" or "hip", for log lines
  std::string_view library_prefix;  ///< file name prefix of the runtime library
  std::array<const char*, static_cast<std::size_t>(real_function::count_)> symbols;
};

inline constexpr runtime_api cuda_runtime{
    "cuda", "libcudart.so",
    {"cudaFree", "cudaFreeAsync", "cudaFreeAsync_ptsz", "cudaMemGetInfo", "cudaGetDevice", "cudaSetDevice",
     "cudaDeviceSynchronize", "cudaDeviceGetDefaultMemPool", "cudaMemPoolGetAttribute", "cudaMemPoolSetAttribute",
     "cudaMemPoolTrimTo", "cudaMallocAsync", "cudaMallocAsync_ptsz", "cudaStreamIsCapturing",
     "cudaIpcGetMemHandle", "cudaDeviceEnablePeerAccess", "cudaMemPoolSetAccess",
     "cudaGetDeviceCount", "cudaStreamDestroy"}};

inline constexpr runtime_api hip_runtime{
    "hip", "libamdhip64.so",
    {"hipFree", "hipFreeAsync", "hipFreeAsync", "hipMemGetInfo", "hipGetDevice", "hipSetDevice",
     "hipDeviceSynchronize", "hipDeviceGetDefaultMemPool", "hipMemPoolGetAttribute", "hipMemPoolSetAttribute",
     "hipMemPoolTrimTo", "hipMallocAsync", "hipMallocAsync", "hipStreamIsCapturing",
     "hipIpcGetMemHandle", "hipDeviceEnablePeerAccess", "hipMemPoolSetAccess",
     "hipGetDeviceCount", "hipStreamDestroy"}};

/// Looks a symbol up for the layer; returns nullptr when not found.
using symbol_resolver = void* (*)(const char* name);

/// The real functions of one runtime, looked up on first use and cached.
/// Thread-safe: concurrent first lookups may both resolve; they agree. A
/// function not found is looked up again on the next call.
class real_functions {
 public:
  /// `resolve` is asked first; with `scan_loaded_libraries`, loaded objects
  /// named after api.library_prefix are asked next.
  real_functions(const runtime_api& api, symbol_resolver resolve, bool scan_loaded_libraries) noexcept;

  /// The function, or nullptr when the runtime does not have it (or is absent).
  [[nodiscard]] void* get(real_function f) noexcept;

  template <class Fn>
  [[nodiscard]] Fn get_as(real_function f) noexcept {
    return reinterpret_cast<Fn>(get(f));
  }

  [[nodiscard]] const runtime_api& api() const noexcept { return api_; }

 private:
  void* lookup(const char* symbol) const noexcept;

  runtime_api api_;
  symbol_resolver resolve_;
  bool scan_;
  std::array<std::atomic<void*>, static_cast<std::size_t>(real_function::count_)> cache_{};
};

/// dlsym in the first loaded object whose file name starts with `prefix`
/// and that has `symbol` (RTLD_NOLOAD: never loads anything). nullptr if none.
[[nodiscard]] void* find_in_loaded_library(std::string_view prefix, const char* symbol) noexcept;

}  // namespace fragctl::interpose
