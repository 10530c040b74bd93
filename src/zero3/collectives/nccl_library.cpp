// dlopen of NCCL / RCCL and the table of its entry points.
#include "zero3/collectives/nccl_library.hpp"

#include <dlfcn.h>

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "fmt/format.h"
#include "fragctl/config.hpp"
#include "fragctl/error.hpp"

namespace fragctl::zero3::nccl {

int type_of(data_type t) noexcept {
  switch (t) {
    case data_type::uint8: return type_uint8;
    case data_type::float16: return type_float16;
    case data_type::bfloat16: return type_bfloat16;
    case data_type::float32: return type_float32;
  }
  return type_uint8;
}

std::string library::describe(result_t r, comm_t comm) const {
  const char* what = get_error_string != nullptr ? get_error_string(r) : nullptr;
  const char* last = get_last_error != nullptr ? get_last_error(comm) : nullptr;
  std::string out = fmt::format("{} error {} ({})", name, r, what != nullptr ? what : "unknown");
  if (last != nullptr && last[0] != '\0') out += fmt::format(": {}", last);
  return out;
}

namespace {

template <class F>
void bind(const library& lib, F& fn, const char* symbol, bool required) {
  fn = reinterpret_cast<F>(dlsym(lib.handle, symbol));
  if (fn == nullptr && required) {
    throw backend_error(fmt::format("{}: symbol {} not found in {}", lib.name, symbol, lib.path), 0,
                        "symbol_not_found");
  }
}

std::vector<std::string> candidates(const nccl_options& options) {
  if (!options.library_path.empty()) return {options.library_path};
  if (const auto env = environment_value("FRAGCTL_NCCL_LIBRARY"); env && !env->empty()) return {std::string(*env)};
  if (options.library == collective_library::rccl) return {"librccl.so.1", "librccl.so"};
  return {"libnccl.so.2", "libnccl.so"};
}

}  // namespace

const library& load(const nccl_options& options) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<library>> loaded;
  std::lock_guard lock(mutex);
  const std::vector<std::string> paths = candidates(options);
  for (const std::string& path : paths) {
    if (auto it = loaded.find(path); it != loaded.end()) return *it->second;
  }
  auto lib = std::make_unique<library>();
  lib->name = options.library == collective_library::rccl ? "rccl" : "nccl";
  std::string errors;
  for (const std::string& path : paths) {
    lib->handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib->handle != nullptr) {
      lib->path = path;
      break;
    }
    const char* e = dlerror();
    errors += fmt::format("{}{}", errors.empty() ? "" : "; ", e != nullptr ? e : path);
  }
  if (lib->handle == nullptr) {
    throw backend_error(
        fmt::format("{} not found ({}); set FRAGCTL_NCCL_LIBRARY to its path", lib->name, errors), 0,
        "library_not_found");
  }
  bind(*lib, lib->get_version, "ncclGetVersion", true);
  bind(*lib, lib->get_unique_id, "ncclGetUniqueId", true);
  bind(*lib, lib->comm_init_rank_config, "ncclCommInitRankConfig", true);
  bind(*lib, lib->all_gather, "ncclAllGather", true);
  bind(*lib, lib->reduce_scatter, "ncclReduceScatter", true);
  bind(*lib, lib->comm_abort, "ncclCommAbort", true);
  bind(*lib, lib->comm_destroy, "ncclCommDestroy", true);
  bind(*lib, lib->comm_finalize, "ncclCommFinalize", false);
  bind(*lib, lib->comm_get_async_error, "ncclCommGetAsyncError", true);
  bind(*lib, lib->group_start, "ncclGroupStart", true);
  bind(*lib, lib->group_end, "ncclGroupEnd", true);
  bind(*lib, lib->get_error_string, "ncclGetErrorString", true);
  bind(*lib, lib->get_last_error, "ncclGetLastError", false);
  (void)lib->get_version(&lib->version);
  const std::string key = lib->path;
  return *loaded.emplace(key, std::move(lib)).first->second;
}

}  // namespace fragctl::zero3::nccl
