// The one table from exceptions to the error classes the library's C
// surfaces report (DESIGN.md, "Errors": exceptions inside C++, codes across
// the C API, the ZeRO-3 C API and the preload shim). Each surface maps a
// class to its own code; none repeats the catch ladder. Shared with the
// layers above (layers.txt); not public API.
#pragma once

#include <cstdint>
#include <string_view>

namespace fragctl::util {

enum class error_class : std::uint8_t {
  out_of_memory,     ///< fragctl::out_of_memory, or any other std::bad_alloc
  invalid_argument,  ///< fragctl::invalid_argument
  state,             ///< fragctl::state_error: a call not valid now (an allocation while paused)
  backend,           ///< fragctl::backend_error
  other_fragctl,     ///< any other fragctl::error (I/O)
  internal,          ///< any other std::exception
  unknown,           ///< not a std::exception
};

/// The exception being handled, classified, and its message: what() or, for
/// one that is not a std::exception, "unknown exception". The message lives
/// as long as the exception (until the handler that called this exits).
struct caught_error {
  error_class kind;
  std::string_view message;
};

/// Classifies the exception being handled. Precondition: called inside a
/// catch block (std::current_exception() is not null).
[[nodiscard]] caught_error classify_current_exception() noexcept;

}  // namespace fragctl::util
