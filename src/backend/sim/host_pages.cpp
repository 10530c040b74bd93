#include "backend/sim/host_pages.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "fmt/format.h"
#include "fragctl/error.hpp"

namespace fragctl::sim_detail {
namespace {

[[noreturn]] void throw_errno(std::string_view what, int err) {
  throw backend_error(fmt::format("sim: {}: {}", what, std::strerror(err)), err, "os_error");
}

bool out_of_memory_errno(int err) noexcept { return err == ENOMEM || err == ENOSPC || err == EFBIG; }

}  // namespace

std::size_t page_size() noexcept {
  static const std::size_t size = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return size;
}

void* map_anonymous(std::size_t bytes, std::size_t alignment, bool accessible) {
  const std::size_t extra = alignment > page_size() ? alignment - page_size() : 0;
  if (bytes > SIZE_MAX - extra) return nullptr;
  const int prot = accessible ? PROT_READ | PROT_WRITE : PROT_NONE;
  void* raw = ::mmap(nullptr, bytes + extra, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) {
    if (out_of_memory_errno(errno) || errno == EINVAL) return nullptr;
    throw_errno("mmap", errno);
  }
  if (extra == 0) return raw;
  // Over-mapped by alignment - page; trim the head and tail around the aligned part.
  const auto start = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (start + alignment - 1) & ~(std::uintptr_t{alignment} - 1);
  const std::size_t head = aligned - start;
  const std::size_t tail = extra - head;
  if (head != 0) unmap_pages(raw, head);
  if (tail != 0) unmap_pages(reinterpret_cast<void*>(aligned + bytes), tail);
  return reinterpret_cast<void*>(aligned);
}

void unmap_pages(void* base, std::size_t bytes) {
  if (::munmap(base, bytes) != 0) throw_errno("munmap", errno);
}

void release_pages(void* base, std::size_t bytes) noexcept { ::munmap(base, bytes); }

void clear_pages(void* va, std::size_t bytes) {
  void* p = ::mmap(va, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  if (p == MAP_FAILED) throw_errno("mmap(PROT_NONE, MAP_FIXED)", errno);
}

bool map_file(void* va, std::size_t bytes, int fd, std::size_t offset) {
  void* p = ::mmap(va, bytes, PROT_NONE, MAP_SHARED | MAP_FIXED, fd, static_cast<off_t>(offset));
  if (p == MAP_FAILED) {
    if (out_of_memory_errno(errno)) return false;
    throw_errno("mmap(memfd, MAP_FIXED)", errno);
  }
  return true;
}

bool grant_access(void* va, std::size_t bytes) {
  if (::mprotect(va, bytes, PROT_READ | PROT_WRITE) != 0) {
    if (errno == ENOMEM) return false;
    throw_errno("mprotect", errno);
  }
  return true;
}

int create_memory_file() {
  const int fd = ::memfd_create("fragctl-sim", MFD_CLOEXEC);
  if (fd < 0) throw_errno("memfd_create", errno);
  return fd;
}

bool resize_memory_file(int fd, std::size_t bytes) {
  if (bytes > static_cast<std::size_t>(INT64_MAX)) return false;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    if (out_of_memory_errno(errno) || errno == EINVAL) return false;
    throw_errno("ftruncate", errno);
  }
  return true;
}

void discard_file_range(int fd, std::size_t offset, std::size_t bytes) {
  if (::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                  static_cast<off_t>(bytes)) != 0) {
    throw_errno("fallocate(PUNCH_HOLE)", errno);
  }
}

void close_memory_file(int fd) noexcept {
  if (fd >= 0) ::close(fd);
}

}  // namespace fragctl::sim_detail
