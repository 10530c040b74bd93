// The C API (fragctl/fragctl.h): thin wrappers over allocator_stack that turn
// exceptions into status codes and a thread-local message.
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "capi/defaults.hpp"
#include "capi/handle.hpp"
#include "fmt/format.h"
#include "fragctl/config.hpp"
#include "fragctl/error.hpp"
#include "fragctl/log.hpp"
#include "fragctl/report.hpp"
#include "fragctl/stats.hpp"
#include "fragctl/version.hpp"
#include "util/strings.hpp"


namespace fragctl::capi {

namespace {

thread_local std::string last_error;

std::string message_of(const absl::Status& status) { return std::string(util::to_std(status.message())); }

fragctl_status status_of(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return FRAGCTL_OK;
    case absl::StatusCode::kFailedPrecondition:
      return FRAGCTL_ERROR_STATE;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
      return FRAGCTL_ERROR_INVALID_ARGUMENT;
    default:
      return FRAGCTL_ERROR_IO;
  }
}

fragctl_status from_status(const absl::Status& status) {
  return status.ok() ? FRAGCTL_OK : fail(status_of(status), message_of(status));
}

// Copies `text` into a malloc'ed string for fragctl_string_free.
char* copy_out(const std::string& text) {
  char* out = static_cast<char*>(std::malloc(text.size() + 1));
  if (out == nullptr) throw std::bad_alloc();
  std::memcpy(out, text.c_str(), text.size() + 1);
  return out;
}

}  // namespace

void set_last_error(std::string_view message) { last_error.assign(message); }

fragctl_status fail(fragctl_status status, std::string_view message) noexcept {
  try {
    set_last_error(message);
  } catch (...) {
    last_error.clear();
  }
  return status;
}

fragctl_status status_of_current_exception() noexcept {
  try {
    throw;
  } catch (const out_of_memory& e) {
    return fail(FRAGCTL_ERROR_OUT_OF_MEMORY, e.what());
  } catch (const invalid_argument& e) {
    return fail(FRAGCTL_ERROR_INVALID_ARGUMENT, e.what());
  } catch (const backend_error& e) {
    return fail(FRAGCTL_ERROR_BACKEND, e.what());
  } catch (const error& e) {
    return fail(FRAGCTL_ERROR_IO, e.what());
  } catch (const std::bad_alloc& e) {
    return fail(FRAGCTL_ERROR_OUT_OF_MEMORY, e.what());
  } catch (const std::exception& e) {
    return fail(FRAGCTL_ERROR_INTERNAL, e.what());
  } catch (...) {
    return fail(FRAGCTL_ERROR_INTERNAL, "unknown exception");
  }
}

}  // namespace fragctl::capi

using fragctl::capi::fail;
using fragctl::capi::guarded;

// Returns INVALID_ARGUMENT with `message` unless `condition` holds.
#define FRAGCTL_REQUIRE(condition, message) \
  if (!(condition)) return fail(FRAGCTL_ERROR_INVALID_ARGUMENT, message)

extern "C" {

const char* fragctl_version(void) { return FRAGCTL_VERSION; }

const char* fragctl_status_string(fragctl_status status) {
  switch (status) {
    case FRAGCTL_OK: return "FRAGCTL_OK";
    case FRAGCTL_ERROR_INVALID_ARGUMENT: return "FRAGCTL_ERROR_INVALID_ARGUMENT";
    case FRAGCTL_ERROR_OUT_OF_MEMORY: return "FRAGCTL_ERROR_OUT_OF_MEMORY";
    case FRAGCTL_ERROR_BACKEND: return "FRAGCTL_ERROR_BACKEND";
    case FRAGCTL_ERROR_NOT_OWNED: return "FRAGCTL_ERROR_NOT_OWNED";
    case FRAGCTL_ERROR_SIZE_MISMATCH: return "FRAGCTL_ERROR_SIZE_MISMATCH";
    case FRAGCTL_ERROR_IO: return "FRAGCTL_ERROR_IO";
    case FRAGCTL_ERROR_STATE: return "FRAGCTL_ERROR_STATE";
    case FRAGCTL_ERROR_INTERNAL: return "FRAGCTL_ERROR_INTERNAL";
  }
  return "FRAGCTL_ERROR_UNKNOWN";
}

const char* fragctl_last_error(void) { return fragctl::capi::last_error.c_str(); }

const char* fragctl_policy_names(void) {
  static const std::string names = [] {
    std::string out;
    for (const fragctl::policy_info& p : fragctl::policies()) {
      if (!out.empty()) out += ',';
      out += p.name;
    }
    return out;
  }();
  return names.c_str();
}

fragctl_status fragctl_create(const char* policy, const char* options, const char* backend, int device,
                              fragctl_allocator** out) {
  FRAGCTL_REQUIRE(out != nullptr, "fragctl_create: out is NULL");
  *out = nullptr;
  return guarded([&] {
    auto cfg = fragctl::parse_config(options == nullptr ? "" : options);
    if (!cfg.ok()) return fail(FRAGCTL_ERROR_INVALID_ARGUMENT, fragctl::capi::message_of(cfg.status()));
    cfg->policy = policy == nullptr ? "" : std::string(fragctl::util::trim(policy));
    auto kind = fragctl::parse_backend_kind(backend == nullptr ? "auto" : backend);
    if (!kind.ok()) {
      return fail(FRAGCTL_ERROR_INVALID_ARGUMENT,
                  fmt::format("backend: {}", fragctl::capi::message_of(kind.status())));
    }
    cfg->backend = *kind;
    if (device >= 0) cfg->device = device;
    *out = new fragctl_allocator{fragctl::make_allocator(*cfg), false};
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_create_from_environment(int device, fragctl_allocator** out) {
  FRAGCTL_REQUIRE(out != nullptr, "fragctl_create_from_environment: out is NULL");
  *out = nullptr;
  return guarded([&] {
    auto cfg = fragctl::config_from_environment();
    if (!cfg.ok()) return fragctl::capi::from_status(cfg.status());
    if (device >= 0) cfg->device = device;
    *out = new fragctl_allocator{fragctl::make_allocator(*cfg), false};
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_destroy(fragctl_allocator* allocator) {
  if (allocator == nullptr) return FRAGCTL_OK;
  FRAGCTL_REQUIRE(!allocator->process_default,
                  "fragctl_destroy: a process-default allocator lives until the process exits");
  return guarded([&] {
    delete allocator;
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_malloc(fragctl_allocator* allocator, void** ptr, size_t bytes, void* stream) {
  FRAGCTL_REQUIRE(allocator != nullptr && ptr != nullptr, "fragctl_malloc: allocator or ptr is NULL");
  *ptr = nullptr;
  return guarded([&] {
    *ptr = allocator->stack->allocator().allocate(bytes, stream);
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_free(fragctl_allocator* allocator, void* ptr, size_t bytes, void* stream) {
  FRAGCTL_REQUIRE(allocator != nullptr, "fragctl_free: allocator is NULL");
  return guarded([&] {
    fragctl::device_allocator& a = allocator->stack->allocator();
    const fragctl::free_status status = a.try_deallocate(ptr, bytes, stream).status;
    if (status == fragctl::free_status::ok) return FRAGCTL_OK;
    // Counted as misuse by the statistics adaptor; reported here, once.
    const bool not_owned = status == fragctl::free_status::not_owned;
    const std::string message =
        not_owned ? fmt::format("{}: free({}, {} bytes): not a live block of this allocator (double free or "
                                "foreign pointer); ignored",
                                a.name(), ptr, bytes)
                  : fmt::format("{}: free({}, {} bytes): size differs from the allocated size; freed with the "
                                "allocated size",
                                a.name(), ptr, bytes);
    fragctl::logger().warn("{}", message);
#ifdef FRAGCTL_CHECKED
    std::abort();
#endif
    return fail(not_owned ? FRAGCTL_ERROR_NOT_OWNED : FRAGCTL_ERROR_SIZE_MISMATCH, message);
  });
}

fragctl_status fragctl_release_cached(fragctl_allocator* allocator) {
  FRAGCTL_REQUIRE(allocator != nullptr, "fragctl_release_cached: allocator is NULL");
  return guarded([&] {
    allocator->stack->allocator().release_cached();
    return FRAGCTL_OK;
  });
}

const char* fragctl_policy(const fragctl_allocator* allocator) {
  if (allocator == nullptr) return "";
  return allocator->stack->configuration().policy.c_str();
}

fragctl_status fragctl_stats_json(fragctl_allocator* allocator, char** json) {
  FRAGCTL_REQUIRE(allocator != nullptr && json != nullptr, "fragctl_stats_json: allocator or json is NULL");
  *json = nullptr;
  return guarded([&] {
    *json = fragctl::capi::copy_out(fragctl::to_json(allocator->stack->stats()));
    return FRAGCTL_OK;
  });
}

void fragctl_string_free(char* text) { std::free(text); }

fragctl_status fragctl_write_report(fragctl_allocator* allocator, const char* path) {
  FRAGCTL_REQUIRE(allocator != nullptr && path != nullptr, "fragctl_write_report: allocator or path is NULL");
  return guarded([&] {
    const std::vector<fragctl::allocator_report> one{allocator->stack->report()};
    return fragctl::capi::from_status(fragctl::write_report_file(path, one, "request"));
  });
}

fragctl_status fragctl_configure_defaults(const char* policy, const char* options, const char* backend) {
  return guarded([&] {
    fragctl::capi::default_overrides overrides;
    if (policy != nullptr) overrides.policy = policy;
    if (options != nullptr) overrides.options = options;
    if (backend != nullptr) overrides.backend = backend;
    return fragctl::capi::from_status(fragctl::capi::configure_defaults(overrides));
  });
}

fragctl_status fragctl_default_allocator(int device, int create, fragctl_allocator** out) {
  FRAGCTL_REQUIRE(out != nullptr, "fragctl_default_allocator: out is NULL");
  *out = nullptr;
  if (create == 0) {
    FRAGCTL_REQUIRE(device >= 0 && device < fragctl::capi::max_devices,
                    fmt::format("fragctl_default_allocator: device {} out of range 0..{}", device,
                                fragctl::capi::max_devices - 1));
    *out = fragctl::capi::find_default_allocator(device);
    return FRAGCTL_OK;
  }
  return guarded([&] {
    *out = &fragctl::capi::default_allocator(device);
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_write_default_report(const char* path) {
  FRAGCTL_REQUIRE(path != nullptr, "fragctl_write_default_report: path is NULL");
  return guarded([&] {
    std::vector<fragctl::allocator_report> all;
    for (fragctl_allocator* a : fragctl::capi::default_allocators()) all.push_back(a->stack->report());
    return fragctl::capi::from_status(fragctl::write_report_file(path, all, "request"));
  });
}

}  // extern "C"
