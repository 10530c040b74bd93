#include "backend/cuda/cuda_driver.hpp"

#include <algorithm>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "fmt/format.h"
#include "fragctl/error.hpp"
#include "util/shared_library.hpp"

namespace fragctl::cuda {

namespace {

constexpr const char* library_name = "libcuda.so.1";
/// Code carried by errors that happen before the driver could answer.
constexpr int load_error_code = -1;

struct load_result {
  driver_api api;
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

std::string version_text(int version) {
  return fmt::format("{}.{}", version / 1000, (version % 1000) / 10);
}

/// Resolves entries for one ABI version each: through cuGetProcAddress_v2
/// where the driver has it, else by the exported, versioned symbol name;
/// remembers the first one missing.
class resolver {
 public:
  resolver(const util::shared_library& library, PFN_cuGetProcAddress_v12000 get_proc_address)
      : binder_(library), get_proc_address_(get_proc_address) {}

  template <class F>
  void operator()(F& slot, const char* name, int abi_version, const char* exported) {
    void* fn = nullptr;
    if (get_proc_address_ != nullptr) {
      CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
      const CUresult rc =
          get_proc_address_(name, &fn, abi_version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status);
      if (rc != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS) fn = nullptr;
    } else {
      fn = binder_.library().symbol(exported);
    }
    binder_.set(slot, fn, name);
  }

  /// Name of the first entry not found since the last call, or nullptr.
  const char* take_missing() noexcept { return binder_.take_missing(); }

 private:
  util::symbol_binder binder_;
  PFN_cuGetProcAddress_v12000 get_proc_address_;
};

load_result load() {
  std::vector<util::shared_library::attempt> failed;
  const std::optional<util::shared_library> library = util::shared_library::open({library_name}, failed);
  if (!library) {
    const std::string_view text = failed.front().error;
    if (failed.front().not_found()) {
      return failure(fmt::format("cuda backend: {} not found (no NVIDIA driver on this machine)", library_name),
                     load_error_code, "not_found");
    }
    return failure(fmt::format("cuda backend: cannot load {}: {}", library_name, text), load_error_code,
                   "not_found");
  }

  load_result r;
  driver_api& api = r.api;
  // Stable, unversioned exports: needed before cuInit and to report errors.
  api.init = library->function<PFN_cuInit_v2000>("cuInit");
  api.driver_get_version = library->function<PFN_cuDriverGetVersion_v2020>("cuDriverGetVersion");
  api.get_error_name = library->function<PFN_cuGetErrorName_v6000>("cuGetErrorName");
  api.get_error_string = library->function<PFN_cuGetErrorString_v6000>("cuGetErrorString");
  if (api.init == nullptr || api.driver_get_version == nullptr || api.get_error_name == nullptr ||
      api.get_error_string == nullptr) {
    return failure(fmt::format("cuda backend: {} has no cuInit/cuGetErrorName (not a CUDA driver?)", library_name),
                   load_error_code, "missing_symbol");
  }
  if (api.driver_get_version(&api.version) != CUDA_SUCCESS) api.version = 0;

  if (const CUresult rc = api.init(0); rc != CUDA_SUCCESS) {
    if (rc == CUDA_ERROR_NO_DEVICE) {
      return failure(fmt::format("cuda backend: no CUDA device (cuInit: {})", error_name(api, rc)), rc,
                     error_name(api, rc));
    }
    const char* description = nullptr;
    if (api.get_error_string(rc, &description) != CUDA_SUCCESS || description == nullptr) description = "?";
    return failure(fmt::format("cuda backend: cuInit failed: {} ({}); driver {}", error_name(api, rc),
                               description, version_text(api.version)),
                   rc, error_name(api, rc));
  }

  PFN_cuGetProcAddress_v12000 get_proc_address = nullptr;
  if (api.version >= 12000) {
    get_proc_address = library->function<PFN_cuGetProcAddress_v12000>("cuGetProcAddress_v2");
  }
  resolver get(*library, get_proc_address);
  get(api.device_get_count, "cuDeviceGetCount", 2000, "cuDeviceGetCount");
  get(api.device_get, "cuDeviceGet", 2000, "cuDeviceGet");
  get(api.device_get_attribute, "cuDeviceGetAttribute", 2000, "cuDeviceGetAttribute");
  get(api.device_can_access_peer, "cuDeviceCanAccessPeer", 4000, "cuDeviceCanAccessPeer");
  get(api.primary_ctx_retain, "cuDevicePrimaryCtxRetain", 7000, "cuDevicePrimaryCtxRetain");
  get(api.primary_ctx_release, "cuDevicePrimaryCtxRelease", 11000, "cuDevicePrimaryCtxRelease_v2");
  get(api.ctx_get_current, "cuCtxGetCurrent", 4000, "cuCtxGetCurrent");
  get(api.ctx_set_current, "cuCtxSetCurrent", 4000, "cuCtxSetCurrent");
  get(api.mem_alloc, "cuMemAlloc", 3020, "cuMemAlloc_v2");
  get(api.mem_free, "cuMemFree", 3020, "cuMemFree_v2");
  get(api.mem_get_info, "cuMemGetInfo", 3020, "cuMemGetInfo_v2");
  get(api.mem_host_alloc, "cuMemHostAlloc", 2020, "cuMemHostAlloc");
  get(api.mem_free_host, "cuMemFreeHost", 2000, "cuMemFreeHost");
  get(api.memcpy_async, "cuMemcpyAsync", 4000, "cuMemcpyAsync");
  get(api.event_create, "cuEventCreate", 2000, "cuEventCreate");
  get(api.event_destroy, "cuEventDestroy", 4000, "cuEventDestroy_v2");
  get(api.event_record, "cuEventRecord", 2000, "cuEventRecord");
  get(api.event_query, "cuEventQuery", 2000, "cuEventQuery");
  get(api.event_synchronize, "cuEventSynchronize", 2000, "cuEventSynchronize");
  get(api.stream_create, "cuStreamCreate", 2000, "cuStreamCreate");
  get(api.stream_synchronize, "cuStreamSynchronize", 2000, "cuStreamSynchronize");
  get(api.stream_wait_event, "cuStreamWaitEvent", 3020, "cuStreamWaitEvent");
  get(api.stream_destroy, "cuStreamDestroy", 4000, "cuStreamDestroy_v2");
  if (const char* missing = get.take_missing(); missing != nullptr) {
    return failure(fmt::format("cuda backend: driver {} lacks {}", version_text(api.version), missing),
                   load_error_code, "missing_symbol");
  }

  get(api.mem_address_reserve, "cuMemAddressReserve", 10020, "cuMemAddressReserve");
  get(api.mem_address_free, "cuMemAddressFree", 10020, "cuMemAddressFree");
  get(api.mem_create, "cuMemCreate", 10020, "cuMemCreate");
  get(api.mem_release, "cuMemRelease", 10020, "cuMemRelease");
  get(api.mem_map, "cuMemMap", 10020, "cuMemMap");
  get(api.mem_unmap, "cuMemUnmap", 10020, "cuMemUnmap");
  get(api.mem_set_access, "cuMemSetAccess", 10020, "cuMemSetAccess");
  get(api.mem_get_allocation_granularity, "cuMemGetAllocationGranularity", 10020,
      "cuMemGetAllocationGranularity");
  get(api.mem_export_to_shareable_handle, "cuMemExportToShareableHandle", 10020, "cuMemExportToShareableHandle");
  get(api.mem_import_from_shareable_handle, "cuMemImportFromShareableHandle", 10020,
      "cuMemImportFromShareableHandle");
  get(api.ipc_get_mem_handle, "cuIpcGetMemHandle", 4010, "cuIpcGetMemHandle");
  get(api.ipc_open_mem_handle, "cuIpcOpenMemHandle", 11000, "cuIpcOpenMemHandle_v2");
  get(api.ipc_close_mem_handle, "cuIpcCloseMemHandle", 4010, "cuIpcCloseMemHandle");
  (void)get.take_missing();  // optional: has_virtual_memory() and the sharing calls check theirs
  get(api.device_get_pci_bus_id, "cuDeviceGetPCIBusId", 4010, "cuDeviceGetPCIBusId");
  (void)get.take_missing();  // optional: without it there are no per-process figures
  return r;
}

}  // namespace

bool driver_api::has_virtual_memory() const noexcept {
  return mem_address_reserve != nullptr && mem_address_free != nullptr && mem_create != nullptr &&
         mem_release != nullptr && mem_map != nullptr && mem_unmap != nullptr && mem_set_access != nullptr &&
         mem_get_allocation_granularity != nullptr;
}

const driver_api& driver() {
  // Never destroyed: backends released during static destruction still use it.
  static const load_result* const loaded = new load_result(load());
  if (!loaded->error.empty()) throw backend_error(loaded->error, loaded->code, loaded->code_name);
  return loaded->api;
}

std::string error_name(const driver_api& api, CUresult result) {
  const char* name = nullptr;
  if (api.get_error_name != nullptr && api.get_error_name(result, &name) == CUDA_SUCCESS && name != nullptr) {
    return name;
  }
  return fmt::format("CUresult {}", static_cast<int>(result));
}

void throw_error(const driver_api& api, CUresult result, const char* call) {
  const char* description = nullptr;
  if (api.get_error_string == nullptr || api.get_error_string(result, &description) != CUDA_SUCCESS ||
      description == nullptr) {
    description = "no description";
  }
  const std::string name = error_name(api, result);
  throw backend_error(fmt::format("cuda backend: {} failed: {} ({})", call, name, description),
                      static_cast<int>(result), name);
}

}  // namespace fragctl::cuda
