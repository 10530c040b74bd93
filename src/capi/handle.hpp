// What a fragctl_allocator handle of the C API is, and how exceptions become
// status codes. Shared by the C API and the process-default registry.
#pragma once

#include <atomic>
#include <cstdint>
#include <forward_list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "fragctl/allocator_stack.hpp"
#include "fragctl/fragctl.h"
#include "fragctl/policy.hpp"

namespace fragctl::capi {

/// A callback and its context as fragctl_watch_spans registered them.
struct span_watcher {
  fragctl_span_callback callback;
  void* context;
  const fragctl_allocator* owner;  // whose events it receives
};

/// Whether this thread runs a span callback of `allocator` now: inside the
/// allocator call that maps or unmaps, which holds its lock (a call that
/// takes the lock again would wait for itself).
[[nodiscard]] bool inside_span_callback(const fragctl_allocator* allocator) noexcept;

/// Calls `w`'s callback, noting its allocator for inside_span_callback.
void run_span_callback(const span_watcher& w, int event, std::uint64_t address, std::uint64_t size) noexcept;

}  // namespace fragctl::capi

/// The C API's allocator handle: an allocator stack, owned by the handle.
/// Process-default handles are never destroyed; nor is a handle while
/// `dependents` (checkpoint stores and ZeRO-3 managers built on it, blocks
/// imported through it and not closed) is not zero.
struct fragctl_allocator {
  fragctl_allocator(std::unique_ptr<fragctl::allocator_stack> allocators, bool is_process_default)
      : stack(std::move(allocators)), process_default(is_process_default) {}

  /// Every watcher fragctl_watch_spans registered (under `watchers_lock`),
  /// kept for the handle's life: an event may still be on its way to one
  /// that was replaced. Declared before the stack, so they outlive it.
  std::forward_list<fragctl::capi::span_watcher> span_watchers;
  std::mutex watchers_lock;
  std::unique_ptr<fragctl::allocator_stack> stack;
  bool process_default = false;
  std::atomic<int> dependents{0};
};

// Returns INVALID_ARGUMENT with `message` unless `condition` holds (inside
// a C API function, where fragctl::capi::fail is visible).
#define FRAGCTL_REQUIRE(condition, message) \
  if (!(condition)) return fail(FRAGCTL_ERROR_INVALID_ARGUMENT, message)

// Returns STATE when called from a span callback of `allocator`
// (fragctl_watch_spans), where the call would wait for its own lock.
#define FRAGCTL_NOT_IN_SPAN_CALLBACK(allocator, function)                                                  \
  if (fragctl::capi::inside_span_callback(allocator))                                                      \
  return fail(FRAGCTL_ERROR_STATE, function ": called from a span callback of this allocator, inside the " \
                                            "call that maps or unmaps; only fragctl_spans may be called there")

namespace fragctl::capi {

/// Sets this thread's fragctl_last_error() text.
void set_last_error(std::string_view message);

/// The status for the exception in flight, its message stored as the last
/// error. The exception's class is util::classify_current_exception's
/// (util/error_class.hpp); the classes map to out_of_memory -> OUT_OF_MEMORY,
/// invalid_argument -> INVALID_ARGUMENT, state -> STATE, backend -> BACKEND,
/// other_fragctl -> IO (trace files), anything else -> INTERNAL. Call only inside a catch block.
fragctl_status status_of_current_exception() noexcept;

/// Runs `body` (returning fragctl_status) and turns any exception into a status.
template <class Body>
fragctl_status guarded(Body&& body) noexcept {
  try {
    return body();
  } catch (...) {
    return status_of_current_exception();
  }
}

/// A malloc'ed copy of `text` for fragctl_string_free; throws std::bad_alloc.
char* copy_out(const std::string& text);

/// Sets the last error to `message` and returns `status`.
fragctl_status fail(fragctl_status status, std::string_view message) noexcept;

}  // namespace fragctl::capi
