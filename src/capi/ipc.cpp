// Sharing blocks with other processes (fragctl_export_block,
// fragctl_import_block, fragctl_close_block; docs/interop.md, "Sharing
// tensors between processes"). The handle format lives here only: the
// native PyTorch backend, the Python package and C programs all reach it
// through these three calls.
//
// The handle. Byte 0 is 2 and byte 1 a kind letter, as in PyTorch's own
// shareable handles (its SHAREABLE_HANDLE_VERSION, then a type), so that a
// reader of either dispatches on byte 1:
//  * 'c': a plain device allocation (caching's segments, the arena's
//    fallback block): the runtime's 64-byte IPC handle of the allocation
//    follows. This is exactly PyTorch's form for cudaMalloc memory, so a
//    process under PyTorch's own allocator opens it, and fragctl opens
//    PyTorch's.
//  * 'F': mapped memory (the arena): a header, then one record per physical
//    handle mapped one after the other from the start of the range:
//        byte 2      format version (1)
//        byte 3      descriptor kind (1: POSIX file descriptor; 2: sim token)
//        bytes 4-7   exporter's process id (int32)
//        bytes 8-11  number of records (uint32)
//        bytes 12-15 zero
//        each record (24 bytes): descriptor (int32), zero (uint32), serial
//        (uint64: unique in the exporting process, so that a handle string
//        never names two different memories even when a descriptor number is
//        reused), bytes (uint64)
//    All integers little-endian as the machine writes them (exporter and
//    importer share a machine). PyTorch's allocator refuses an 'F' handle
//    (unknown type): a consumer of arena memory must run under fragctl.
//
// Importing takes the exporter's descriptors with pidfd_open and
// pidfd_getfd (syscall numbers, as glibc may lack the wrappers), maps every
// handle into one reserved range, grants access, and remembers what it did
// so that fragctl_close_block undoes it. A failure midway undoes what was
// done.
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "capi/handle.hpp"
#include "fmt/format.h"
#include "fragctl/backend.hpp"
#include "fragctl/device_allocator.hpp"
#include "fragctl/error.hpp"
#include "fragctl/log.hpp"

using fragctl::capi::fail;
using fragctl::capi::guarded;

namespace {

constexpr char shareable_version = 2;  // PyTorch's SHAREABLE_HANDLE_VERSION
constexpr char kind_allocation = 'c';  // PyTorch's SHAREABLE_CUDA_MALLOC
constexpr char kind_mapped = 'F';
constexpr char format_version = 1;
constexpr char descriptor_fd = 1;
constexpr char descriptor_sim_token = 2;

struct mapped_header {
  char version;
  char kind;
  char format;
  char descriptor;
  std::int32_t pid;
  std::uint32_t count;
  std::uint32_t zero;
};
struct mapped_record {
  std::int32_t fd;
  std::uint32_t zero;
  std::uint64_t serial;
  std::uint64_t bytes;
};
static_assert(sizeof(mapped_header) == 16 && sizeof(mapped_record) == 24);

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

/// What fragctl_import_block mapped at one base address.
struct import_record {
  fragctl::device_backend* backend = nullptr;  // the importing allocator's, which lives while the record does
  fragctl_allocator* owner = nullptr;           // the importing allocator: a dependent of it per open
  bool allocation = false;  // opened with open_allocation; else mapped handles
  std::size_t opens = 1;    // open_allocation calls that gave this base (one close each)
  std::size_t bytes = 0;    // the reserved range (mapped handles)
  std::vector<std::pair<fragctl::physical_handle, std::size_t>> handles;
};

struct import_registry {
  std::mutex mutex;
  std::unordered_map<void*, import_record> records;
};

import_registry& imports() {
  static auto* const registry = new import_registry();  // never destroyed: closes may come at exit
  return *registry;
}

std::string handle_bytes(const fragctl::shared_memory& m, fragctl::device_backend& backend) {
  std::string out;
  if (m.handles.empty()) {
    const fragctl::ipc_memory_handle h = backend.export_allocation(m.base);
    out.reserve(2 + h.size());
    out.push_back(shareable_version);
    out.push_back(kind_allocation);
    out.append(h.data(), h.size());
    return out;
  }
  mapped_header header{};
  header.version = shareable_version;
  header.kind = kind_mapped;
  header.format = format_version;
  header.descriptor = backend.name() == "sim" ? descriptor_sim_token : descriptor_fd;
  header.pid = static_cast<std::int32_t>(::getpid());
  header.count = static_cast<std::uint32_t>(m.handles.size());
  out.resize(sizeof header + m.handles.size() * sizeof(mapped_record));
  std::memcpy(out.data(), &header, sizeof header);
  std::size_t at = sizeof header;
  for (const auto& h : m.handles) {
    mapped_record r{};
    r.fd = h.fd;
    r.serial = h.serial;
    r.bytes = h.bytes;
    std::memcpy(out.data() + at, &r, sizeof r);
    at += sizeof r;
  }
  return out;
}

/// A descriptor of this process for the exporter's `fd`: the same one when
/// the exporter is this process (owned == false), else a duplicate taken
/// with pidfd_getfd (owned: the caller closes it).
struct local_fd {
  int fd = -1;
  bool owned = false;
  local_fd() = default;
  local_fd(const local_fd&) = delete;
  local_fd& operator=(const local_fd&) = delete;
  ~local_fd() {
    if (owned) (void)::close(fd);
  }
};

[[noreturn]] void descriptor_error(const char* what, int pid, int err) {
  std::string message = fmt::format("fragctl_import_block: {} of process {} failed: {}", what, pid,
                                    std::strerror(err));
  if (err == ESRCH) message += " (the exporting process has exited)";
  if (err == EPERM) {
    message += " (taking another process's descriptors needs permission to trace it: the same user, and "
               "/proc/sys/kernel/yama/ptrace_scope 0, or the exporter allowing it with prctl(PR_SET_PTRACER))";
  }
  if (err == ENOSYS) message += " (pidfd_open/pidfd_getfd need Linux 5.6 or newer)";
  throw fragctl::backend_error(message, err, "descriptor");
}

void take_descriptor(int pid, int remote, local_fd& out) {
  if (pid == static_cast<int>(::getpid())) {
    out.fd = remote;
    return;
  }
  const long pidfd = ::syscall(SYS_pidfd_open, pid, 0);
  if (pidfd < 0) descriptor_error("pidfd_open", pid, errno);
  const long fd = ::syscall(SYS_pidfd_getfd, static_cast<int>(pidfd), remote, 0);
  const int err = errno;
  (void)::close(static_cast<int>(pidfd));
  if (fd < 0) descriptor_error("pidfd_getfd", pid, err);
  out.fd = static_cast<int>(fd);
  out.owned = true;
}

/// Unmaps and releases what `r` holds, the range last; logs and goes on
/// past a failing call (used to undo a failed import, and by close).
void undo(const import_record& r, void* base, std::size_t mapped) noexcept {
  std::size_t at = 0;
  for (std::size_t i = 0; i < r.handles.size(); ++i) {
    const auto& [handle, bytes] = r.handles[i];
    try {
      if (i < mapped) r.backend->unmap_imported(static_cast<char*>(base) + at, bytes);
      r.backend->release_imported(handle, bytes);
    } catch (const std::exception& e) {
      fragctl::logger().warn("fragctl_close_block: {}", e.what());
    }
    at += bytes;
  }
  try {
    r.backend->release_address(base, r.bytes);
  } catch (const std::exception& e) {
    fragctl::logger().warn("fragctl_close_block: {}", e.what());
  }
}

/// Maps the handles an 'F' handle names; returns the base, or nullptr
/// (everything undone) when the device runs out of memory.
void* import_mapped(fragctl::device_backend& backend, const char* data, std::size_t size, import_record& r) {
  mapped_header header{};
  if (size < sizeof header) throw fragctl::invalid_argument("fragctl_import_block: the handle is truncated");
  std::memcpy(&header, data, sizeof header);
  if (header.format != format_version) {
    throw fragctl::invalid_argument(fmt::format(
        "fragctl_import_block: handle format version {} (this fragctl reads {})", int{header.format},
        int{format_version}));
  }
  if (header.count == 0 || size != sizeof header + std::size_t{header.count} * sizeof(mapped_record)) {
    throw fragctl::invalid_argument("fragctl_import_block: the handle's length does not match its records");
  }
  if (header.descriptor == descriptor_sim_token && header.pid != static_cast<std::int32_t>(::getpid())) {
    throw fragctl::invalid_argument(
        "fragctl_import_block: a sim backend's handle can be imported only by the process that exported it");
  }
  if (header.descriptor != descriptor_fd && header.descriptor != descriptor_sim_token) {
    throw fragctl::invalid_argument("fragctl_import_block: unknown descriptor kind in the handle");
  }
  std::vector<mapped_record> records(header.count);
  std::memcpy(records.data(), data + sizeof header, records.size() * sizeof(mapped_record));
  const std::size_t g = backend.granularity();
  for (const mapped_record& rec : records) {
    if (rec.bytes == 0 || rec.bytes % g != 0) {
      throw fragctl::invalid_argument(fmt::format(
          "fragctl_import_block: a handle of {} bytes is not a multiple of the granularity {}", rec.bytes, g));
    }
    // No device holds more than 2^62 bytes: a sum beyond is a forged handle
    // (it wrapped to a reservation of 0 bytes, a BACKEND error).
    if (rec.bytes > fragctl::max_request_bytes - r.bytes) {
      throw fragctl::invalid_argument("fragctl_import_block: the handle's sizes add up to more than any device holds");
    }
    r.bytes += rec.bytes;
  }
  r.backend = &backend;
  r.handles.reserve(records.size());
  void* base = backend.reserve_address(r.bytes);
  std::size_t mapped = 0;
  try {
    for (const mapped_record& rec : records) {
      local_fd fd;
      take_descriptor(header.pid, rec.fd, fd);
      r.handles.emplace_back(backend.import_physical(fd.fd, rec.bytes), rec.bytes);
    }
    std::size_t at = 0;
    for (const auto& [handle, bytes] : r.handles) {
      void* va = static_cast<char*>(base) + at;
      const bool ok = backend.map_imported(va, bytes, handle);
      if (ok) ++mapped;
      if (!ok || !backend.set_access_imported(va, bytes)) {
        undo(r, base, mapped);
        return nullptr;  // out of memory
      }
      at += bytes;
    }
  } catch (...) {
    undo(r, base, mapped);
    throw;
  }
  return base;
}

}  // namespace

extern "C" {

fragctl_status fragctl_export_block(fragctl_allocator* allocator, void* ptr, size_t bytes, void* handle,
                                    size_t capacity, size_t* handle_size, size_t* offset) {
  FRAGCTL_REQUIRE(allocator != nullptr && ptr != nullptr && handle_size != nullptr && offset != nullptr,
                  "fragctl_export_block: allocator, ptr, handle_size or offset is NULL");
  FRAGCTL_NOT_IN_SPAN_CALLBACK(allocator, "fragctl_export_block");
  return guarded([&] {
    fragctl::device_allocator& a = allocator->stack->allocator();
    const fragctl::shared_memory m = a.share(ptr, bytes);
    const std::string out = handle_bytes(m, a.backend());
    *handle_size = out.size();
    *offset = m.offset;
    if (handle == nullptr) return FRAGCTL_OK;
    if (capacity < out.size()) {
      return fail(FRAGCTL_ERROR_INVALID_ARGUMENT,
                  fmt::format("fragctl_export_block: the handle needs {} bytes, capacity is {}", out.size(), capacity));
    }
    std::memcpy(handle, out.data(), out.size());
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_import_block(fragctl_allocator* allocator, const void* handle, size_t handle_size,
                                    void** base) {
  FRAGCTL_REQUIRE(allocator != nullptr && handle != nullptr && base != nullptr,
                  "fragctl_import_block: allocator, handle or base is NULL");
  *base = nullptr;
  return guarded([&] {
    const auto* data = static_cast<const char*>(handle);
    if (handle_size < 2 || data[0] != shareable_version) {
      return fail(FRAGCTL_ERROR_INVALID_ARGUMENT,
                  "fragctl_import_block: not a shareable handle (fragctl_export_block's or PyTorch's)");
    }
    fragctl::device_backend& backend = allocator->stack->allocator().backend();
    import_record r;
    void* b = nullptr;
    if (data[1] == kind_allocation) {
      fragctl::ipc_memory_handle h{};
      if (handle_size != 2 + h.size()) {
        return fail(FRAGCTL_ERROR_INVALID_ARGUMENT, "fragctl_import_block: an IPC handle of the wrong length");
      }
      std::memcpy(h.data(), data + 2, h.size());
      b = backend.open_allocation(h);
      r.backend = &backend;
      r.allocation = true;
    } else if (data[1] == kind_mapped) {
      b = import_mapped(backend, data, handle_size, r);
      if (b == nullptr) {
        return fail(FRAGCTL_ERROR_OUT_OF_MEMORY, "fragctl_import_block: mapping the shared memory ran out of memory");
      }
    } else {
      return fail(FRAGCTL_ERROR_INVALID_ARGUMENT,
                  fmt::format("fragctl_import_block: unknown handle kind '{}' (PyTorch's expandable segments' "
                              "handles are opened by PyTorch's own allocator only)",
                              data[1]));
    }
    try {
      const std::lock_guard lock(imports().mutex);
      const auto [it, added] = imports().records.emplace(b, std::move(r));
      // The first importer's backend serves every close: that allocator is
      // not destroyed while an open of the block is left (a close after it
      // used a freed backend).
      if (!added) {
        ++it->second.opens;  // the runtime gave an opened allocation's base again
      } else {
        it->second.owner = allocator;
      }
      ++it->second.owner->dependents;
    } catch (...) {
      if (r.allocation) {
        backend.close_allocation(b);
      } else {
        undo(r, b, r.handles.size());
      }
      throw;
    }
    *base = b;
    return FRAGCTL_OK;
  });
}

fragctl_status fragctl_close_block(fragctl_allocator* allocator, void* base) {
  FRAGCTL_REQUIRE(allocator != nullptr && base != nullptr, "fragctl_close_block: allocator or base is NULL");
  return guarded([&] {
    import_record r;
    {
      const std::lock_guard lock(imports().mutex);
      const auto it = imports().records.find(base);
      if (it == imports().records.end()) {
        return fail(FRAGCTL_ERROR_INVALID_ARGUMENT,
                    fmt::format("fragctl_close_block: {} is not an address fragctl_import_block returned", base));
      }
      if (it->second.opens > 1) {  // opened again: this close answers one open
        --it->second.opens;
        r.backend = it->second.backend;
        r.owner = it->second.owner;
        r.allocation = true;
      } else {
        r = std::move(it->second);
        imports().records.erase(it);
      }
    }
    // This open's dependent goes once its backend call is done, thrown or not
    // (the registry forgot the open either way).
    struct dependent_done {
      fragctl_allocator* owner;
      ~dependent_done() { --owner->dependents; }
    } done{r.owner};
    if (r.allocation) {
      r.backend->close_allocation(base);
    } else {
      undo(r, base, r.handles.size());
    }
    return FRAGCTL_OK;
  });
}

}  // extern "C"
