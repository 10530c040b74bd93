// The non-virtual half of device_allocator: the cold parts of the argument
// checks and the misuse reports (the hot parts are inline in the header).
#include "fragctl/device_allocator.hpp"

#include <cstdlib>
#include <string>

#include "fmt/format.h"
#include "fragctl/backend.hpp"
#include "fragctl/error.hpp"
#include "fragctl/log.hpp"

namespace fragctl {

void device_allocator::throw_too_large(std::size_t bytes) const {
  throw invalid_argument(
      fmt::format("{}: allocate({} bytes): larger than any device (limit 2^62 bytes)", name(), bytes));
}

void device_allocator::stream_ending(stream_t stream) {
  if (stream == nullptr) return;  // the default stream is never destroyed
  // Once, here, before any adaptor's lock: the wait may be long, and every
  // part of the allocator may then take the stream's frees and uses as done.
  backend().synchronize_stream(stream);
  do_stream_ending(stream);
}

void device_allocator::report_misuse(free_status status, void* ptr, std::size_t bytes) noexcept {
  switch (status) {
    case free_status::ok:
      return;
    case free_status::not_owned:
      misuse_not_owned_.fetch_add(1, std::memory_order_relaxed);
      logger().warn("{}: deallocate({}, {} bytes): not a live block of this allocator "
                    "(double free or foreign pointer); ignored",
                    name(), ptr, bytes);
      break;
    case free_status::size_mismatch:
      misuse_size_mismatch_.fetch_add(1, std::memory_order_relaxed);
      logger().warn("{}: deallocate({}, {} bytes): size differs from the allocated size; "
                    "freed with the allocated size",
                    name(), ptr, bytes);
      break;
  }
#ifdef FRAGCTL_CHECKED
  std::abort();
#endif
}

void device_allocator::do_record_stream(void* ptr, stream_t stream) {
  throw invalid_argument(fmt::format("{}: record_stream({}, {}): this allocator does not track stream uses; "
                                     "use an allocator_stack (make_allocator), which does",
                                     name(), ptr, stream));
}

bool device_allocator::do_pause(pause_keep /*keep*/) {
  throw invalid_argument(fmt::format("{}: pause: only the arena policy over virtual memory keeps addresses "
                                     "without physical memory",
                                     name()));
}

shared_memory device_allocator::do_share(void* ptr, std::size_t /*bytes*/) const {
  throw invalid_argument(fmt::format("{}: share({}): this allocator does not say what memory lies under its blocks",
                                     name(), ptr));
}

void device_allocator::do_enable_peer_access(int peer) {
  throw invalid_argument(fmt::format("{}: enable_peer_access({}): this allocator does not say how its memory is "
                                     "reached from other devices",
                                     name(), peer));
}

bool device_allocator::do_resume() {
  throw invalid_argument(fmt::format("{}: resume: this allocator cannot pause", name()));
}

memory_snapshot device_allocator::memory_map() const {
  memory_snapshot m = do_memory_map();
  if (m.allocator.empty()) m.allocator = std::string(name());
  return m;
}

device_allocator::misuse_counters device_allocator::misuse() const noexcept {
  return {misuse_not_owned_.load(std::memory_order_relaxed),
          misuse_size_mismatch_.load(std::memory_order_relaxed)};
}

}  // namespace fragctl
