// Logging: one spdlog logger named "fragctl", level from FRAGCTL_LOG_LEVEL
// (trace, debug, info, warn, error, critical, off; default warn), writing to
// stderr with a "[fragctl]" prefix.
#pragma once

#include <memory>
#include <string_view>

#include "spdlog/spdlog.h"

namespace fragctl {

/// The library's logger; created on first use, thread-safe.
[[nodiscard]] spdlog::logger& logger();

/// Sets the level by name; returns false (and changes nothing) for an unknown name.
bool set_log_level(std::string_view level);

}  // namespace fragctl
