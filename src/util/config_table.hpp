// What the environment table (environment.cpp) takes from the options table
// (config.cpp): one option set by key, with the option's own parser.
#pragma once

#include <string_view>

#include "absl/status/status.h"
#include "fragctl/config.hpp"

namespace fragctl::util {

/// Sets option `key` of `c` from `value`, the whole string (commas
/// included), as FRAGCTL_CONF's "key:value" would. The error is the parser's
/// message, without the key. Throws invalid_argument for an unknown key.
[[nodiscard]] absl::Status set_option(config& c, std::string_view key, std::string_view value);

}  // namespace fragctl::util
