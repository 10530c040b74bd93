// tracing_adaptor: fragctl's trace CSV (shared/traces/README.md):
//
//   action,addr,size,stream,time_us
//
// `alloc` rows carry the caller's size, `free_requested` rows the size the
// block was allocated with, `oom` rows (addr 0) a request that failed. A free
// of a pointer the allocator does not own writes no row, so a replay never
// meets a free of an unknown address. Addresses and streams are decimal
// integers, time_us is a monotonic clock in microseconds. Rows are formatted
// into a memory buffer and written in large chunks.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iterator>

#include "fmt/format.h"
#include "fragctl/adaptors.hpp"
#include "fragctl/error.hpp"
#include "fragctl/log.hpp"

namespace fragctl {

struct tracing_adaptor::sink {
  static constexpr std::size_t flush_at = 256 * KiB;

  std::string path;
  std::FILE* file = nullptr;
  fmt::memory_buffer buffer;
  bool failed = false;

  void row(std::string_view action, const void* addr, std::size_t size, stream_t stream) {
    const auto now = std::chrono::steady_clock::now().time_since_epoch();
    fmt::format_to(std::back_inserter(buffer), "{},{},{},{},{}\n", action, reinterpret_cast<std::uintptr_t>(addr),
                   size, reinterpret_cast<std::uintptr_t>(stream),
                   std::chrono::duration_cast<std::chrono::microseconds>(now).count());
    if (buffer.size() >= flush_at) flush();
  }

  void flush() noexcept {
    if (buffer.size() != 0 && !failed) {
      if (std::fwrite(buffer.data(), 1, buffer.size(), file) != buffer.size() || std::fflush(file) != 0) {
        failed = true;
        logger().error("trace {}: write failed; no further rows are recorded", path);
      }
    }
    buffer.clear();
  }
};

tracing_adaptor::tracing_adaptor(std::unique_ptr<device_allocator> upstream, const std::string& path)
    : upstream_(std::move(upstream)), sink_(std::make_unique<sink>()) {
  if (!upstream_) throw invalid_argument("tracing_adaptor: upstream is null");
  sink_->path = path;
  sink_->file = std::fopen(path.c_str(), "w");
  if (sink_->file == nullptr) throw error(fmt::format("trace: cannot open \"{}\" for writing", path));
  fmt::format_to(std::back_inserter(sink_->buffer), "action,addr,size,stream,time_us\n");
  sink_->flush();
}

tracing_adaptor::~tracing_adaptor() {
  sink_->flush();
  std::fclose(sink_->file);
}

void tracing_adaptor::flush() { sink_->flush(); }

void* tracing_adaptor::do_allocate(std::size_t bytes, stream_t stream) {
  void* ptr = nullptr;
  try {
    ptr = upstream_->allocate(bytes, stream);
  } catch (const out_of_memory&) {
    sink_->row("oom", nullptr, bytes, stream);
    throw;
  }
  sink_->row("alloc", ptr, bytes, stream);
  return ptr;
}

free_result tracing_adaptor::do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept {
  const free_result result = upstream_->try_deallocate(ptr, bytes, stream);
  if (result.status == free_status::not_owned) return result;
  try {
    sink_->row("free_requested", ptr, result.status == free_status::ok ? bytes : result.bytes, stream);
  } catch (...) {
    // Formatting can only fail to allocate its buffer; the row is lost, the free stands.
  }
  return result;
}

std::size_t tracing_adaptor::do_allocation_size(std::size_t bytes) const noexcept {
  return upstream_->allocation_size(bytes);
}
pool_state tracing_adaptor::do_state() const { return upstream_->state(); }
void tracing_adaptor::do_release_cached() { upstream_->release_cached(); }
device_backend& tracing_adaptor::do_backend() const noexcept { return upstream_->backend(); }
std::string_view tracing_adaptor::do_name() const noexcept { return upstream_->name(); }
memory_snapshot tracing_adaptor::do_memory_map() const { return upstream_->memory_map(); }
void tracing_adaptor::do_record_stream(void* ptr, stream_t stream) { upstream_->record_stream(ptr, stream); }

}  // namespace fragctl
