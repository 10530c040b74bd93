// Lookup of the real runtime functions (interpose/runtime.hpp).
#include "interpose/runtime.hpp"

#include <dlfcn.h>
#include <link.h>

#include <string>
#include <vector>

namespace fragctl::interpose {

namespace {

std::string_view base_name(std::string_view path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

}  // namespace

void* find_in_loaded_library(std::string_view prefix, const char* symbol) noexcept {
  try {
    // Names first: dlopen may not be called while dl_iterate_phdr holds its lock.
    struct search {
      std::string_view prefix;
      std::vector<std::string> paths;
    } found{prefix, {}};
    dl_iterate_phdr(
        [](dl_phdr_info* info, std::size_t, void* data) -> int {
          auto& s = *static_cast<search*>(data);
          if (info->dlpi_name != nullptr && base_name(info->dlpi_name).starts_with(s.prefix)) {
            s.paths.emplace_back(info->dlpi_name);
          }
          return 0;
        },
        &found);
    for (const std::string& path : found.paths) {
      void* handle = dlopen(path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
      if (handle == nullptr) continue;
      void* fn = dlsym(handle, symbol);
      dlclose(handle);  // drops the reference RTLD_NOLOAD took; the object stays loaded
      if (fn != nullptr) return fn;
    }
  } catch (...) {
  }
  return nullptr;
}

real_functions::real_functions(const runtime_api& api, symbol_resolver resolve, bool scan_loaded_libraries) noexcept
    : api_(api), resolve_(resolve), scan_(scan_loaded_libraries) {}

void* real_functions::lookup(const char* symbol) const noexcept {
  void* fn = resolve_ != nullptr ? resolve_(symbol) : nullptr;
  if (fn == nullptr && scan_) fn = find_in_loaded_library(api_.library_prefix, symbol);
  return fn;
}

void* real_functions::get(real_function f) noexcept {
  std::atomic<void*>& slot = cache_[static_cast<std::size_t>(f)];
  void* fn = slot.load(std::memory_order_acquire);
  if (fn != nullptr) return fn;
  // Failures are not cached: the runtime may be loaded later (by dlopen).
  fn = lookup(api_.symbols[static_cast<std::size_t>(f)]);
  if (fn != nullptr) slot.store(fn, std::memory_order_release);
  return fn;
}

}  // namespace fragctl::interpose
