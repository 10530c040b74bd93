// The C API binding of the native PyTorch backend (c_api.hpp).
#include "c_api.hpp"

#include <dlfcn.h>

#include <type_traits>

#include <c10/util/Exception.h>

namespace fragctl_torch {

c_api api;

void c_api::load(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
  if (handle == nullptr) handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  TORCH_CHECK(handle != nullptr, "fragctl: cannot load ", path, ": ", dlerror());
  auto resolve = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
    TORCH_CHECK(fn != nullptr, "fragctl: ", path, " has no ", name, " (a libfragctl.so older than this package?)");
  };
#define FRAGCTL_TORCH_RESOLVE(name) resolve(name, #name);
  FRAGCTL_TORCH_C_API(FRAGCTL_TORCH_RESOLVE)
#undef FRAGCTL_TORCH_RESOLVE
}

void check(fragctl_status status, const char* what) {
  TORCH_CHECK(status == FRAGCTL_OK, "fragctl: ", what, ": ", api.fragctl_last_error());
}

fragctl_counters counters_of(fragctl_allocator* allocator) {
  fragctl_counters c{};
  c.struct_size = sizeof c;
  check(api.fragctl_get_counters(allocator, &c), "statistics");
  return c;
}

device_memory memory_of(fragctl_allocator* allocator) {
  device_memory m;
  check(api.fragctl_device_memory(allocator, &m.free, &m.total), "device memory");
  return m;
}

}  // namespace fragctl_torch
