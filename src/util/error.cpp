#include "fragctl/error.hpp"

#include <utility>

#include "fmt/format.h"
#include "util/error_class.hpp"
#include "util/strings.hpp"

namespace fragctl {

backend_error::backend_error(std::string what, int code, std::string code_name)
    : error(std::move(what)), code_(code), code_name_(std::move(code_name)) {}

out_of_memory::out_of_memory(const oom_details& d, const char* allocator_name) : details_(d) {
  const char* verdict = d.caused_by_fragmentation()
                            ? "yes: enough memory is free, but not in one block"
                            : "no: the device does not have that much free memory";
  using util::human_bytes;
  message_ = fmt::format(
      "{}: out of memory allocating {} ({} bytes); reserved {}, free in cache {}, largest free "
      "block {}, device free {} of {}; caused by fragmentation: {}",
      allocator_name, human_bytes(d.requested), d.requested, human_bytes(d.reserved),
      human_bytes(d.cached_free), human_bytes(d.largest_free_block), human_bytes(d.device_free),
      human_bytes(d.device_total), verdict);
}

namespace util {

caught_error classify_current_exception() noexcept {
  try {
    throw;
  } catch (const std::bad_alloc& e) {  // fragctl::out_of_memory included
    return {error_class::out_of_memory, e.what()};
  } catch (const invalid_argument& e) {
    return {error_class::invalid_argument, e.what()};
  } catch (const backend_error& e) {
    return {error_class::backend, e.what()};
  } catch (const error& e) {
    return {error_class::other_fragctl, e.what()};
  } catch (const std::exception& e) {
    return {error_class::internal, e.what()};
  } catch (...) {
    return {error_class::unknown, "unknown exception"};
  }
}

}  // namespace util
}  // namespace fragctl
