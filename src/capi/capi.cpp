// The C API (fragctl/fragctl.h): thin wrappers over allocator_stack that turn
// exceptions into status codes and a thread-local message.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <string_view>
#include <utility>

#include "capi/defaults.hpp"
#include "capi/handle.hpp"
#include "fmt/format.h"
#include "fragctl/allocator_stack.hpp"
#include "fragctl/config.hpp"
#include "fragctl/error.hpp"
#include "fragctl/log.hpp"
#include "fragctl/process_hooks.hpp"
#include "fragctl/stats.hpp"
#include "fragctl/stats_export.hpp"
#include "fragctl/version.hpp"
#include "util/error_class.hpp"
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

}  // namespace

char* copy_out(const std::string& text) {
  char* out = static_cast<char*>(std::malloc(text.size() + 1));
  if (out == nullptr) throw std::bad_alloc();
  std::memcpy(out, text.c_str(), text.size() + 1);
  return out;
}

void set_last_error(std::string_view message) { last_error.assign(message); }

fragctl_status fail(fragctl_status status, std::string_view message) noexcept {
  try {
    set_last_error(message);
  } catch (...) {
    last_error.clear();
  }
  return status;
}

namespace {
// The allocators whose span callbacks this thread runs now, outermost first:
// a callback may allocate from another allocator, whose callback then runs
// inside it (and may call the first). Deeper than this many, the inner ones
// are not told apart.
constexpr std::size_t max_nested_callbacks = 8;
thread_local std::array<const fragctl_allocator*, max_nested_callbacks> calling_back{};
thread_local std::size_t callback_depth = 0;
}  // namespace

bool inside_span_callback(const fragctl_allocator* allocator) noexcept {
  const std::size_t n = std::min(callback_depth, max_nested_callbacks);
  return std::find(calling_back.begin(), calling_back.begin() + static_cast<std::ptrdiff_t>(n), allocator) !=
         calling_back.begin() + static_cast<std::ptrdiff_t>(n);
}

void run_span_callback(const span_watcher& w, int event, std::uint64_t address, std::uint64_t size) noexcept {
  const std::size_t depth = callback_depth++;
  if (depth < max_nested_callbacks) calling_back[depth] = w.owner;
  w.callback(event, address, size, w.context);
  callback_depth = depth;
}

fragctl_status status_of_current_exception() noexcept {
  const util::caught_error e = util::classify_current_exception();
  switch (e.kind) {
    case util::error_class::out_of_memory: return fail(FRAGCTL_ERROR_OUT_OF_MEMORY, e.message);
    case util::error_class::invalid_argument: return fail(FRAGCTL_ERROR_INVALID_ARGUMENT, e.message);
    case util::error_class::state: return fail(FRAGCTL_ERROR_STATE, e.message);
    case util::error_class::backend: return fail(FRAGCTL_ERROR_BACKEND, e.message);
    case util::error_class::other_fragctl: return fail(FRAGCTL_ERROR_IO, e.message);
    case util::error_class::internal:
    case util::error_class::unknown: break;
  }
  return fail(FRAGCTL_ERROR_INTERNAL, e.message);
}

}  // namespace fragctl::capi

using fragctl::capi::fail;
using fragctl::capi::guarded;

// fragctl_map_block.use of a block.
namespace {

int use_of(fragctl::block_use use) {
  switch (use) {
    case fragctl::block_use::live: return FRAGCTL_BLOCK_LIVE;
    case fragctl::block_use::free: return FRAGCTL_BLOCK_FREE;
    case fragctl::block_use::pending: return FRAGCTL_BLOCK_PENDING;
  }
  return FRAGCTL_BLOCK_FREE;
}

}  // namespace

extern "C" {

const char* fragctl_version(void) { return FRAGCTL_VERSION; }

const char* fragctl_status_string(fragctl_status status) {
  // Read as an int: a C caller may pass any int, and a value outside the
  // enum's range is undefined behaviour in C++ once read as the enum.
  int code = 0;
  static_assert(sizeof code == sizeof status);
  std::memcpy(&code, &status, sizeof code);
  switch (code) {
    case FRAGCTL_OK: return "FRAGCTL_OK";
    case FRAGCTL_ERROR_INVALID_ARGUMENT: return "FRAGCTL_ERROR_INVALID_ARGUMENT";
    case FRAGCTL_ERROR_OUT_OF_MEMORY: return "FRAGCTL_ERROR_OUT_OF_MEMORY";
    case FRAGCTL_ERROR_BACKEND: return "FRAGCTL_ERROR_BACKEND";
    case FRAGCTL_ERROR_NOT_OWNED: return "FRAGCTL_ERROR_NOT_OWNED";
    case FRAGCTL_ERROR_SIZE_MISMATCH: return "FRAGCTL_ERROR_SIZE_MISMATCH";
    case FRAGCTL_ERROR_IO: return "FRAGCTL_ERROR_IO";
    case FRAGCTL_ERROR_STATE: return "FRAGCTL_ERROR_STATE";
    case FRAGCTL_ERROR_INTERNAL: return "FRAGCTL_ERROR_INTERNAL";
    case FRAGCTL_ERROR_BUDGET: return "FRAGCTL_ERROR_BUDGET";
    case FRAGCTL_ERROR_COLLECTIVE: return "FRAGCTL_ERROR_COLLECTIVE";
    case FRAGCTL_ERROR_TIMEOUT: return "FRAGCTL_ERROR_TIMEOUT";
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

fragctl_status fragctl_parse_size(const char* text, size_t* bytes) {
  FRAGCTL_REQUIRE(text != nullptr && bytes != nullptr, "fragctl_parse_size: text or bytes is NULL");
  return guarded([&] {
    const absl::StatusOr<std::size_t> parsed = fragctl::parse_size(text);
    // As the options do: no device holds more than 2^62 bytes.
    if (parsed.ok() && *parsed > fragctl::max_request_bytes) {
      return fail(FRAGCTL_ERROR_INVALID_ARGUMENT,
                  fmt::format("fragctl_parse_size: '{}': expected a size of at most 4 EiB (2^62 bytes)", text));
    }
    if (parsed.ok()) *bytes = *parsed;
    return fragctl::capi::from_status(parsed.status());
  });
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
  FRAGCTL_NOT_IN_SPAN_CALLBACK(allocator, "fragctl_destroy");
  if (allocator->dependents.load() > 0) {
    return fail(FRAGCTL_ERROR_STATE, "fragctl_destroy: a checkpoint store, a ZeRO-3 manager or a block "
                                     "imported through it (fragctl_import_block) still uses this allocator; "
                                     "destroy or close it first");
  }
  return guarded([&] {
    delete allocator;
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_malloc(fragctl_allocator* allocator, void** ptr, size_t bytes, void* stream) {
  FRAGCTL_REQUIRE(allocator != nullptr && ptr != nullptr, "fragctl_malloc: allocator or ptr is NULL");
  *ptr = nullptr;
  FRAGCTL_NOT_IN_SPAN_CALLBACK(allocator, "fragctl_malloc");
  return guarded([&] {
    *ptr = allocator->stack->allocator().allocate(bytes, stream);
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_free(fragctl_allocator* allocator, void* ptr, size_t bytes, void* stream) {
  FRAGCTL_REQUIRE(allocator != nullptr, "fragctl_free: allocator is NULL");
  FRAGCTL_NOT_IN_SPAN_CALLBACK(allocator, "fragctl_free");
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

fragctl_status fragctl_record_stream(fragctl_allocator* allocator, void* ptr, void* stream) {
  FRAGCTL_REQUIRE(allocator != nullptr, "fragctl_record_stream: allocator is NULL");
  FRAGCTL_NOT_IN_SPAN_CALLBACK(allocator, "fragctl_record_stream");
  return guarded([&] {
    allocator->stack->allocator().record_stream(ptr, stream);
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_stream_ending(fragctl_allocator* allocator, void* stream) {
  FRAGCTL_REQUIRE(allocator != nullptr, "fragctl_stream_ending: allocator is NULL");
  FRAGCTL_NOT_IN_SPAN_CALLBACK(allocator, "fragctl_stream_ending");
  return guarded([&] {
    allocator->stack->allocator().stream_ending(stream);
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_get_counters(fragctl_allocator* allocator, fragctl_counters* out) {
  FRAGCTL_REQUIRE(allocator != nullptr && out != nullptr, "fragctl_get_counters: allocator or out is NULL");
  FRAGCTL_NOT_IN_SPAN_CALLBACK(allocator, "fragctl_get_counters");
  FRAGCTL_REQUIRE(out->struct_size >= offsetof(fragctl_counters, requested),
                  "fragctl_get_counters: set out->struct_size to sizeof(fragctl_counters)");
  return guarded([&] {
    const fragctl::allocator_stats s = allocator->stack->stats();
    fragctl_counters c{};
    c.struct_size = sizeof c;
    c.requested = s.requested.current;
    c.requested_peak = s.requested.peak;
    c.requested_window_peak = s.window_peak.requested;
    c.requested_total = s.totals.requested;
    c.requested_freed_total = s.totals.requested_freed;
    c.allocated = s.allocated.current;
    c.allocated_peak = s.allocated.peak;
    c.allocated_window_peak = s.window_peak.allocated;
    c.allocated_total = s.totals.allocated;
    c.allocated_freed_total = s.totals.allocated_freed;
    c.reserved = s.reserved.current;
    c.reserved_peak = s.reserved.peak;
    c.reserved_window_peak = s.window_peak.reserved;
    c.reserved_total = s.totals.reserved;
    c.reserved_freed_total = s.totals.reserved_freed;
    c.allocations = s.allocations;
    c.frees = s.frees;
    c.live_blocks_window_peak = s.window_peak.live_blocks;
    c.ooms = s.ooms;
    c.retries = s.retries;
    using fragctl::backend_call;
    const auto& b = s.backend_calls;
    c.device_allocations = b.of(backend_call::allocate) + b.of(backend_call::create_physical);
    c.device_frees = b.of(backend_call::free) + b.of(backend_call::release_physical);
    c.segments = s.pool.segments;
    c.cached_free = s.pool.cached_free;
    c.largest_free_block = s.pool.largest_free_block;
    c.limit = allocator->stack->limit();
    // The caller's size read before the copy overwrites it (a smaller, older
    // struct was told 216 bytes were filled).
    const std::size_t filled = std::min<std::size_t>(out->struct_size, sizeof c);
    c.struct_size = filled;
    std::memcpy(out, &c, filled);
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_reset_peaks(fragctl_allocator* allocator) {
  FRAGCTL_REQUIRE(allocator != nullptr, "fragctl_reset_peaks: allocator is NULL");
  allocator->stack->reset_peaks();
  return FRAGCTL_OK;
}

fragctl_status fragctl_set_limit(fragctl_allocator* allocator, size_t bytes) {
  FRAGCTL_REQUIRE(allocator != nullptr, "fragctl_set_limit: allocator is NULL");
  allocator->stack->set_limit(bytes);
  return FRAGCTL_OK;
}

fragctl_status fragctl_memory_map(fragctl_allocator* allocator,
                                  void (*visit)(const fragctl_map_segment* segment, void* context), void* context) {
  FRAGCTL_REQUIRE(allocator != nullptr && visit != nullptr, "fragctl_memory_map: allocator or visit is NULL");
  FRAGCTL_NOT_IN_SPAN_CALLBACK(allocator, "fragctl_memory_map");
  return guarded([&] {
    const fragctl::memory_snapshot map = allocator->stack->allocator().memory_map();
    if (!map.available) {
      return fail(FRAGCTL_ERROR_STATE, fmt::format("fragctl_memory_map: policy {} does not describe its layout",
                                                   allocator->stack->configuration().policy));
    }
    std::vector<fragctl_map_block> blocks;
    for (const fragctl::memory_segment& segment : map.segments) {
      blocks.clear();
      for (const fragctl::memory_block& b : segment.blocks) {
        blocks.push_back({b.address, b.size, b.requested, use_of(b.use), b.stream});
      }
      const fragctl_map_segment out{segment.address, segment.size,       segment.stream,
                                    segment.pool.c_str(), blocks.data(), blocks.size()};
      visit(&out, context);
    }
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_release_cached(fragctl_allocator* allocator) {
  FRAGCTL_REQUIRE(allocator != nullptr, "fragctl_release_cached: allocator is NULL");
  FRAGCTL_NOT_IN_SPAN_CALLBACK(allocator, "fragctl_release_cached");
  return guarded([&] {
    allocator->stack->allocator().release_cached();
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_pause(fragctl_allocator* allocator, int keep) {
  FRAGCTL_REQUIRE(allocator != nullptr, "fragctl_pause: allocator is NULL");
  FRAGCTL_NOT_IN_SPAN_CALLBACK(allocator, "fragctl_pause");
  FRAGCTL_REQUIRE(keep == FRAGCTL_PAUSE_KEEP_NONE || keep == FRAGCTL_PAUSE_KEEP_HOST,
                  fmt::format("fragctl_pause: keep is {}, not FRAGCTL_PAUSE_KEEP_NONE (0) or _HOST (1)",
                              keep));
  return guarded([&] {
    // The allocator answers "paused already" under its own lock (state_error):
    // of two threads pausing at once, the one that loses gets STATE too.
    constexpr std::string_view paused_already = "fragctl_pause: the allocator is paused already";
    fragctl::device_allocator& a = allocator->stack->allocator();
    if (a.paused()) return fail(FRAGCTL_ERROR_STATE, paused_already);
    try {
      if (!a.pause(keep == FRAGCTL_PAUSE_KEEP_HOST ? fragctl::pause_keep::host : fragctl::pause_keep::none)) {
        return fail(FRAGCTL_ERROR_OUT_OF_MEMORY,
                    "fragctl_pause: pinned host memory for the blocks' contents ran out; only the cache was released");
      }
    } catch (const fragctl::state_error&) {
      return fail(FRAGCTL_ERROR_STATE, paused_already);
    }
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_resume(fragctl_allocator* allocator) {
  FRAGCTL_REQUIRE(allocator != nullptr, "fragctl_resume: allocator is NULL");
  FRAGCTL_NOT_IN_SPAN_CALLBACK(allocator, "fragctl_resume");
  return guarded([&] {
    // As fragctl_pause: the allocator's own "not paused" (state_error) is STATE too.
    constexpr std::string_view not_paused = "fragctl_resume: the allocator is not paused";
    fragctl::device_allocator& a = allocator->stack->allocator();
    if (!a.paused()) return fail(FRAGCTL_ERROR_STATE, not_paused);
    try {
      if (!a.resume()) {
        return fail(FRAGCTL_ERROR_OUT_OF_MEMORY,
                    "fragctl_resume: the device refused the memory; the allocator stays paused (call again once "
                    "it is free)");
      }
    } catch (const fragctl::state_error&) {
      return fail(FRAGCTL_ERROR_STATE, not_paused);
    }
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_paused(fragctl_allocator* allocator, int* paused) {
  FRAGCTL_REQUIRE(allocator != nullptr && paused != nullptr, "fragctl_paused: allocator or paused is NULL");
  FRAGCTL_NOT_IN_SPAN_CALLBACK(allocator, "fragctl_paused");
  return guarded([&] {
    *paused = allocator->stack->allocator().paused() ? 1 : 0;
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_enable_peer_access(fragctl_allocator* allocator, int peer) {
  FRAGCTL_REQUIRE(allocator != nullptr, "fragctl_enable_peer_access: allocator is NULL");
  FRAGCTL_NOT_IN_SPAN_CALLBACK(allocator, "fragctl_enable_peer_access");
  return guarded([&] {
    allocator->stack->allocator().enable_peer_access(peer);
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_watch_spans(fragctl_allocator* allocator, fragctl_span_callback callback, void* context) {
  FRAGCTL_REQUIRE(allocator != nullptr, "fragctl_watch_spans: allocator is NULL");
  return guarded([&] {
    fragctl::device_backend& backend = allocator->stack->backend();
    const std::scoped_lock lock(allocator->watchers_lock);
    if (callback == nullptr) {
      backend.watch_spans(nullptr, nullptr);
      return FRAGCTL_OK;
    }
    fragctl::capi::span_watcher& w =
        allocator->span_watchers.emplace_front(fragctl::capi::span_watcher{callback, context, allocator});
    backend.watch_spans(
        [](fragctl::device_backend::span_event event, void* address, std::size_t bytes, void* ctx) noexcept {
          fragctl::capi::run_span_callback(
              *static_cast<const fragctl::capi::span_watcher*>(ctx),
              event == fragctl::device_backend::span_event::mapped ? FRAGCTL_SPAN_MAPPED : FRAGCTL_SPAN_UNMAPPING,
              reinterpret_cast<std::uint64_t>(address), bytes);
        },
        &w);
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_spans(fragctl_allocator* allocator, void (*visit)(uint64_t, uint64_t, void*), void* context) {
  FRAGCTL_REQUIRE(allocator != nullptr && visit != nullptr, "fragctl_spans: allocator or visit is NULL");
  return guarded([&] {
    allocator->stack->backend().for_each_span(
        [&](void* address, std::size_t bytes) { visit(reinterpret_cast<std::uint64_t>(address), bytes, context); });
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
  FRAGCTL_NOT_IN_SPAN_CALLBACK(allocator, "fragctl_stats_json");
  return guarded([&] {
    *json = fragctl::capi::copy_out(fragctl::to_json(allocator->stack->stats()));
    return FRAGCTL_OK;
  });
}

void fragctl_string_free(char* text) { std::free(text); }

namespace {

// A report that could not be written is IO, whatever the reason (a
// directory or a link at the path was STATE, the header promises IO); the
// message is kept.
fragctl_status report_status(const absl::Status& written) {
  const fragctl_status status = fragctl::capi::from_status(written);
  return status == FRAGCTL_OK ? FRAGCTL_OK : FRAGCTL_ERROR_IO;
}

}  // namespace

fragctl_status fragctl_write_report(fragctl_allocator* allocator, const char* path) {
  FRAGCTL_REQUIRE(allocator != nullptr && path != nullptr, "fragctl_write_report: allocator or path is NULL");
  FRAGCTL_NOT_IN_SPAN_CALLBACK(allocator, "fragctl_write_report");
  return guarded([&] {
    const std::vector<fragctl::stats_export_entry> one{allocator->stack->export_entry()};
    return report_status(fragctl::write_stats_export_file(path, one, "request"));
  });
}

namespace {

// A process that asked for outputs gets the process hooks when the library
// loads, so SIGUSR1 (or SIGTERM) sent before its first allocator exists is
// handled, not fatal (docs/reliability.md, "Process lifecycle").
[[maybe_unused]] const bool hooks_at_load = [] {
  const auto cfg = fragctl::config_from_environment();
  if (cfg.ok() && (!cfg->report_path.empty() || !cfg->prometheus_path.empty() || !cfg->trace_path.empty())) {
    fragctl::install_process_hooks();
  }
  return true;
}();

}  // namespace

fragctl_status fragctl_flush(void) {
  return guarded([&] {
    const std::uint64_t failures_before = fragctl::output_failures();
    fragctl::flush_process_outputs("request");
    const std::uint64_t failed = fragctl::output_failures() - failures_before;
    if (failed == 0) return FRAGCTL_OK;
    // The latest failed output's message (in the process: another thread's
    // may come between), not whatever failed earlier on this thread.
    return fail(FRAGCTL_ERROR_IO, fmt::format("fragctl_flush: {} output(s) not written; the latest: {}", failed,
                                              fragctl::last_output_failure()));
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
    std::vector<fragctl::stats_export_entry> all;
    for (fragctl_allocator* a : fragctl::capi::default_allocators()) all.push_back(a->stack->export_entry());
    return report_status(fragctl::write_stats_export_file(path, all, "request"));
  });
}

}  // extern "C"
