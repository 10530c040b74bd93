// Logging: one spdlog logger named "fragctl", level from FRAGCTL_LOG_LEVEL
// (trace, debug, info, warn, error, critical, off; default warn), writing to
// stderr with a "[fragctl]" prefix. Fork-safe: from its creation on, the
// logger's lock is taken before fork() and released in parent and child, so a
// forked child can log whatever the parent's threads were doing. Any other
// lock a fork handler takes must be taken before it: fork handlers registered
// after the logger's creation run first (process_hooks creates the logger
// before registering its own).
#pragma once

#include <memory>
#include <string_view>
#include <utility>

#include "spdlog/spdlog.h"

namespace fragctl {

/// The library's logger; created on first use, thread-safe.
[[nodiscard]] spdlog::logger& logger();

/// Sets the level by name; returns false (and changes nothing) for an unknown name.
bool set_log_level(std::string_view level);

/// Logs at `level` when the logger is that verbose, from a path that may not
/// throw: a message that cannot be made (out of host memory) is dropped.
template <class... Args>
void log_noexcept(spdlog::level::level_enum level, spdlog::format_string_t<Args...> format,
                  Args&&... args) noexcept {
  try {
    spdlog::logger& l = logger();
    if (l.should_log(level)) l.log(level, format, std::forward<Args>(args)...);
  } catch (...) {  // NOLINT(bugprone-empty-catch): a lost log line, nothing else
  }
}

}  // namespace fragctl
