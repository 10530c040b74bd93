#include "fragctl/error.hpp"

#include <algorithm>
#include <utility>

#include "fmt/format.h"
#include "util/error_class.hpp"
#include "util/strings.hpp"

namespace fragctl {

backend_error::backend_error(std::string what, int code, std::string code_name)
    : error(std::move(what)), code_(code), code_name_(std::move(code_name)) {}

std::string_view to_string(oom_verdict v) noexcept {
  switch (v) {
    case oom_verdict::fragmentation: return "fragmentation";
    case oom_verdict::capacity: return "capacity";
    case oom_verdict::other_process: return "other_process";
    case oom_verdict::declined: return "declined";
  }
  return "capacity";
}

std::size_t memory_used_by_others(const oom_details& d) noexcept {
  const std::size_t ours_and_free = d.device_free + d.reserved;
  return d.device_total > ours_and_free ? d.device_total - ours_and_free : 0;
}

std::size_t runtime_allowance(const oom_details& d) noexcept {
  return std::min<std::size_t>(std::size_t{2} << 30, d.device_total / 32);
}

std::size_t memory_beyond_runtime(const oom_details& d) noexcept {
  const std::size_t others = memory_used_by_others(d);
  const std::size_t runtime = runtime_allowance(d);
  return others > runtime ? others - runtime : 0;
}

oom_verdict diagnose(const oom_details& d) noexcept {
  if (d.requested <= d.device_free) return oom_verdict::declined;
  const std::size_t free_anywhere = d.cached_free + d.device_free;
  if (d.requested <= free_anywhere) return oom_verdict::fragmentation;
  const std::size_t beyond = memory_beyond_runtime(d);
  if (beyond > 0 && d.requested <= free_anywhere + beyond) return oom_verdict::other_process;
  return oom_verdict::capacity;
}

out_of_memory::out_of_memory(const oom_details& d, const char* allocator_name) : details_(d) {
  const oom_verdict v = diagnose(d);
  const char* verdict = v == oom_verdict::fragmentation ? "yes: enough memory is free, but not in one block"
                        : v == oom_verdict::declined
                            ? "no: the device has that much free memory; the allocator declined to take it"
                            : "no: the device does not have that much free memory";
  using util::human_bytes;
  message_ = fmt::format(
      "{}: out of memory allocating {} ({} bytes); reserved {}, free in cache {}, largest free "
      "block {}, device free {} of {}; caused by fragmentation: {}",
      allocator_name, human_bytes(d.requested), d.requested, human_bytes(d.reserved),
      human_bytes(d.cached_free), human_bytes(d.largest_free_block), human_bytes(d.device_free),
      human_bytes(d.device_total), verdict);
}

void out_of_memory::add_note(std::string_view note) {
  message_ += "; ";
  message_ += note;
}

namespace util {

caught_error classify_current_exception() noexcept {
  try {
    throw;
  } catch (const std::bad_alloc& e) {  // fragctl::out_of_memory included
    return {error_class::out_of_memory, e.what()};
  } catch (const state_error& e) {
    return {error_class::state, e.what()};
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
