// dlopen of NCCL / RCCL and the table of its entry points.
#include "zero3/collectives/nccl_library.hpp"

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <vector>

#include "fmt/format.h"
#include "fragctl/config.hpp"
#include "fragctl/error.hpp"
#include "util/shared_library.hpp"

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
  std::vector<util::shared_library::attempt> failed;
  const std::optional<util::shared_library> so = util::shared_library::open(paths, failed);
  if (!so) {
    std::string errors;
    for (const util::shared_library::attempt& a : failed) {
      errors += fmt::format("{}{}", errors.empty() ? "" : "; ", a.error.empty() ? a.name : a.error);
    }
    throw backend_error(
        fmt::format("{} not found ({}); set FRAGCTL_NCCL_LIBRARY to its path", lib->name, errors), 0,
        "library_not_found");
  }
  lib->path = so->name();
  const auto required = [&](auto& fn, const char* symbol) {
    fn = so->required_function<std::remove_reference_t<decltype(fn)>>(symbol, lib->name);
  };
  const auto optional = [&](auto& fn, const char* symbol) {
    fn = so->function<std::remove_reference_t<decltype(fn)>>(symbol);
  };
  required(lib->get_version, "ncclGetVersion");
  required(lib->get_unique_id, "ncclGetUniqueId");
  required(lib->comm_init_rank_config, "ncclCommInitRankConfig");
  required(lib->all_gather, "ncclAllGather");
  required(lib->reduce_scatter, "ncclReduceScatter");
  required(lib->comm_abort, "ncclCommAbort");
  required(lib->comm_destroy, "ncclCommDestroy");
  optional(lib->comm_finalize, "ncclCommFinalize");
  required(lib->comm_get_async_error, "ncclCommGetAsyncError");
  required(lib->group_start, "ncclGroupStart");
  required(lib->group_end, "ncclGroupEnd");
  required(lib->get_error_string, "ncclGetErrorString");
  optional(lib->get_last_error, "ncclGetLastError");
  (void)lib->get_version(&lib->version);
  const std::string key = lib->path;
  return *loaded.emplace(key, std::move(lib)).first->second;
}

}  // namespace fragctl::zero3::nccl
