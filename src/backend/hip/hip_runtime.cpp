#include "backend/hip/hip_runtime.hpp"

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fmt/format.h"
#include "fragctl/error.hpp"
#include "util/shared_library.hpp"

namespace fragctl::hip {

namespace {

/// Tried in order: the development link (whatever ROCm is installed), then
/// the sonames of the majors fragctl knows.
constexpr std::array<const char*, 4> library_names = {"libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6",
                                                      "libamdhip64.so.5"};
/// Code carried by errors that happen before the runtime could answer.
constexpr int load_error_code = -1;

struct load_result {
  runtime_api api;
  std::string error;  ///< empty when the table is usable
  int code = 0;
  std::string code_name;
};

load_result failure(std::string message, int code, std::string code_name) {
  load_result r;
  std::replace(message.begin(), message.end(), '\n', ' ');
  r.error = std::move(message);
  r.code = code;
  r.code_name = std::move(code_name);
  return r;
}

const char* describe(const runtime_api& api, hipError_t result) {
  const char* description = api.get_error_string != nullptr ? api.get_error_string(result) : nullptr;
  return description != nullptr ? description : "no description";
}

std::string version_text(int version) {
  return fmt::format("{}.{}.{}", version / 10000000, (version / 100000) % 100, version % 100000);
}

load_result load() {
  std::vector<util::shared_library::attempt> failed;
  const std::optional<util::shared_library> library =
      util::shared_library::open(std::vector<std::string>(library_names.begin(), library_names.end()), failed);
  if (!library) {
    std::string first_error;  // the first present but not loadable: worth saying
    for (const util::shared_library::attempt& a : failed) {
      if (!a.not_found()) {
        first_error = a.error;
        break;
      }
    }
    if (first_error.empty()) {
      return failure("hip backend: libamdhip64.so not found (no ROCm HIP runtime on this machine)", load_error_code,
                     "not_found");
    }
    return failure(fmt::format("hip backend: cannot load libamdhip64: {}", first_error), load_error_code,
                   "not_found");
  }

  load_result r;
  runtime_api& api = r.api;
  api.library = library->name();
  const std::string& loaded_name = api.library;
  util::symbol_binder get(*library);
  get(api.init, "hipInit");
  get(api.runtime_get_version, "hipRuntimeGetVersion");
  get(api.get_error_name, "hipGetErrorName");
  get(api.get_error_string, "hipGetErrorString");
  if (const char* missing = get.take_missing(); missing != nullptr) {
    return failure(fmt::format("hip backend: {} lacks {} (not a HIP runtime?)", loaded_name, missing),
                   load_error_code, "missing_symbol");
  }
  if (api.runtime_get_version(&api.version) != hipSuccess) api.version = 0;

  if (const hipError_t rc = api.init(0); rc != hipSuccess) {
    // Without a GPU, ROCm's hipInit answers hipErrorNoDevice or hipErrorInvalidDevice.
    if (rc == hipErrorNoDevice || rc == hipErrorInvalidDevice) {
      return failure(fmt::format("hip backend: no HIP device (hipInit: {}; {} {})", error_name(api, rc), loaded_name,
                                 version_text(api.version)),
                     rc, error_name(api, rc));
    }
    return failure(fmt::format("hip backend: hipInit failed: {} ({}); {} {}", error_name(api, rc),
                               describe(api, rc), loaded_name, version_text(api.version)),
                   rc, error_name(api, rc));
  }

  get(api.get_device_count, "hipGetDeviceCount");
  get(api.get_device, "hipGetDevice");
  get(api.set_device, "hipSetDevice");
  get(api.device_get_attribute, "hipDeviceGetAttribute");
  get(api.device_can_access_peer, "hipDeviceCanAccessPeer");
  get(api.mem_alloc, "hipMalloc");
  get(api.mem_free, "hipFree");
  get(api.mem_get_info, "hipMemGetInfo");
  get(api.host_free, "hipHostFree");
  get(api.memcpy_async, "hipMemcpyAsync");
  get(api.event_create_with_flags, "hipEventCreateWithFlags");
  get(api.event_destroy, "hipEventDestroy");
  get(api.event_record, "hipEventRecord");
  get(api.event_query, "hipEventQuery");
  get(api.event_synchronize, "hipEventSynchronize");
  get(api.stream_create_with_flags, "hipStreamCreateWithFlags");
  get(api.stream_synchronize, "hipStreamSynchronize");
  get(api.stream_wait_event, "hipStreamWaitEvent");
  get(api.stream_destroy, "hipStreamDestroy");
  get(api.host_malloc, "hipHostMalloc");
  if (api.host_malloc == nullptr) {
    (void)get.take_missing();
    get(api.host_malloc, "hipHostAlloc");  // same signature; the name newer runtimes prefer
  }
  if (const char* missing = get.take_missing(); missing != nullptr) {
    return failure(fmt::format("hip backend: {} {} lacks {}", loaded_name, version_text(api.version), missing),
                   load_error_code, "missing_symbol");
  }

  get(api.ipc_get_mem_handle, "hipIpcGetMemHandle");
  get(api.ipc_open_mem_handle, "hipIpcOpenMemHandle");
  get(api.ipc_close_mem_handle, "hipIpcCloseMemHandle");
  (void)get.take_missing();  // optional: export_allocation checks
#ifdef FRAGCTL_HIP_VIRTUAL_MEMORY
  get(api.mem_address_reserve, "hipMemAddressReserve");
  get(api.mem_address_free, "hipMemAddressFree");
  get(api.mem_create, "hipMemCreate");
  get(api.mem_release, "hipMemRelease");
  get(api.mem_map, "hipMemMap");
  get(api.mem_unmap, "hipMemUnmap");
  get(api.mem_set_access, "hipMemSetAccess");
  get(api.mem_get_allocation_granularity, "hipMemGetAllocationGranularity");
  (void)get.take_missing();  // optional: has_virtual_memory() says whether all are there
#endif
  return r;
}

}  // namespace

bool runtime_api::has_virtual_memory() const noexcept {
#ifdef FRAGCTL_HIP_VIRTUAL_MEMORY
  return version / 10000000 == HIP_VERSION_MAJOR && mem_address_reserve != nullptr &&
         mem_address_free != nullptr && mem_create != nullptr && mem_release != nullptr && mem_map != nullptr &&
         mem_unmap != nullptr && mem_set_access != nullptr && mem_get_allocation_granularity != nullptr;
#else
  return false;
#endif
}

const runtime_api& runtime() {
  // Never destroyed: backends released during static destruction still use it.
  static const load_result* const loaded = new load_result(load());
  if (!loaded->error.empty()) throw backend_error(loaded->error, loaded->code, loaded->code_name);
  return loaded->api;
}

std::string error_name(const runtime_api& api, hipError_t result) {
  const char* name = api.get_error_name != nullptr ? api.get_error_name(result) : nullptr;
  if (name != nullptr) return name;
  return fmt::format("hipError_t {}", static_cast<int>(result));
}

void throw_error(const runtime_api& api, hipError_t result, const char* call) {
  const std::string name = error_name(api, result);
  throw backend_error(fmt::format("hip backend: {} failed: {} ({})", call, name, describe(api, result)),
                      static_cast<int>(result), name);
}

}  // namespace fragctl::hip
