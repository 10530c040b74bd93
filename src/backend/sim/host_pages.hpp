// The POSIX calls behind the sim backend's backed mode. Reserved ranges are
// PROT_NONE anonymous mappings; physical memory is one memfd whose regions are
// mapped MAP_SHARED|MAP_FIXED over a reservation, so data lives in the file and
// survives unmap and remap, as it lives in a CUDA allocation handle.
//
// Every function reports an out-of-memory condition (ENOMEM, ENOSPC, EFBIG)
// by its return value and throws backend_error (code errno, name "os_error")
// for any other failure, which means a broken precondition.
#pragma once

#include <cstddef>

namespace fragctl::sim_detail {

/// The host page size.
[[nodiscard]] std::size_t page_size() noexcept;

/// Maps `bytes` (a multiple of the page size) of private anonymous memory
/// aligned to `alignment` (a power of two), readable and writable when
/// `accessible`, else PROT_NONE; committed lazily (MAP_NORESERVE). nullptr when
/// out of memory or address space.
[[nodiscard]] void* map_anonymous(std::size_t bytes, std::size_t alignment, bool accessible);
/// Unmaps pages mapped by map_anonymous (or any part of a reservation).
void unmap_pages(void* base, std::size_t bytes);
/// unmap_pages for destructors: errors are ignored.
void release_pages(void* base, std::size_t bytes) noexcept;
/// Replaces [va, va + bytes) with PROT_NONE anonymous pages, dropping any file
/// mapping there while keeping the address range reserved.
void clear_pages(void* va, std::size_t bytes);
/// Maps `bytes` of `fd` from `offset` at `va` (MAP_SHARED|MAP_FIXED), PROT_NONE.
/// False when out of memory.
[[nodiscard]] bool map_file(void* va, std::size_t bytes, int fd, std::size_t offset);
/// Makes [va, va + bytes) readable and writable. False when out of memory.
[[nodiscard]] bool grant_access(void* va, std::size_t bytes);

/// Creates the memory file that holds every physical allocation.
[[nodiscard]] int create_memory_file();
/// Sets the file's size (sparse: no memory is committed). False when out of space.
[[nodiscard]] bool resize_memory_file(int fd, std::size_t bytes);
/// Returns the memory of [offset, offset + bytes) of the file to the system.
void discard_file_range(int fd, std::size_t offset, std::size_t bytes);
/// Closes the file; errors are ignored (used from destructors).
void close_memory_file(int fd) noexcept;

}  // namespace fragctl::sim_detail
