// sim_backend: virtual memory. A reservation is a range of (fake or PROT_NONE)
// addresses; a physical handle is a byte count (and, backed, a region of the
// memory file); a mapping places part of a handle over part of a reservation.
// The checks mirror what cuMemMap/cuMemUnmap/cuMemRelease reject.
#include <algorithm>
#include <iterator>

#include "backend/sim/host_pages.hpp"
#include "backend/sim/sim_state.hpp"
#include "fmt/format.h"
#include "fragctl/sim_backend.hpp"

namespace fragctl {

using sim_detail::address_of;
using sim_detail::fail;
using sim_detail::pointer_to;
using sim_detail::sim_error;

bool sim_backend::state::in_reservation(std::uintptr_t a, std::size_t bytes) const {
  auto it = reservations.upper_bound(a);
  if (it == reservations.begin()) return false;
  --it;
  const std::uintptr_t end = it->first + it->second;
  return a < end && bytes <= end - a;
}

bool sim_backend::state::overlaps_mapping(std::uintptr_t a, std::size_t bytes) const {
  auto it = mappings.lower_bound(a);
  if (it != mappings.end() && it->first - a < bytes) return true;
  if (it == mappings.begin()) return false;
  --it;
  return it->first + it->second.bytes > a;
}

bool sim_backend::state::fully_mapped(std::uintptr_t a, std::size_t bytes) const {
  auto it = mappings.upper_bound(a);
  if (it == mappings.begin()) return false;
  --it;
  std::uintptr_t covered = it->first + it->second.bytes;  // mapped without a gap from `a` up to here
  if (covered <= a) return false;
  const std::uintptr_t end = a + bytes;
  while (covered < end) {
    ++it;
    if (it == mappings.end() || it->first != covered) return false;
    covered += it->second.bytes;
  }
  return true;
}

void* sim_backend::do_reserve_address(std::size_t bytes, std::size_t alignment) {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  s.require_virtual_memory("reserve_address");
  s.require_granular("reserve_address", 0, bytes);
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    fail(sim_error::invalid_value,
         fmt::format("reserve_address: alignment {} is not a power of two", alignment));
  }
  const std::size_t align = std::max(alignment, s.options.granularity);
  std::uintptr_t a = 0;
  if (s.options.backed) {
    a = address_of(sim_detail::map_anonymous(bytes, align, /*accessible=*/false));
  } else {
    a = s.fake_range(bytes, align);
  }
  if (a == 0) {
    fail(sim_error::out_of_memory,
         fmt::format("reserve_address: no {} bytes of address space aligned to {}", bytes, align));
  }
  s.reservations.emplace(a, bytes);
  return pointer_to(a);
}

void sim_backend::do_release_address(void* base, std::size_t bytes) {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  s.require_virtual_memory("release_address");
  const std::uintptr_t a = address_of(base);
  auto it = s.reservations.find(a);
  if (it == s.reservations.end() || it->second != bytes) {
    fail(sim_error::invalid_value,
         fmt::format("release_address: [{}, +{}) is not a whole reserved range", base, bytes));
  }
  if (s.overlaps_mapping(a, bytes)) {
    fail(sim_error::invalid_value, fmt::format("release_address: [{}, +{}) still has mappings", base, bytes));
  }
  if (s.options.backed) sim_detail::unmap_pages(base, bytes);
  s.reservations.erase(it);
}

std::optional<physical_handle> sim_backend::do_create_physical(std::size_t bytes) {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  s.require_virtual_memory("create_physical");
  s.require_granular("create_physical", 0, bytes);
  if (s.take_fault(sim_fault_target::create_physical) || !s.fits(bytes)) return std::nullopt;
  std::size_t file_offset = 0;
  if (s.options.backed) {
    // Regions of the memory file are never reused; released ones are punched
    // out, so the file stays sparse and holds only live physical memory.
    if (s.memory_file < 0) s.memory_file = sim_detail::create_memory_file();
    file_offset = s.memory_file_end;
    if (bytes > SIZE_MAX - file_offset ||
        !sim_detail::resize_memory_file(s.memory_file, file_offset + bytes)) {
      return std::nullopt;
    }
    s.memory_file_end = file_offset + bytes;
  }
  const std::uint64_t id = s.next_handle++;
  s.handles.emplace(id, sim_detail::physical_block{bytes, file_offset, 0, id});
  s.memory_refs[id] = 1;
  s.used += bytes;
  return physical_handle{id};
}

void sim_backend::do_release_physical(physical_handle handle, std::size_t bytes) {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  s.require_virtual_memory("release_physical");
  auto it = s.handles.find(handle.value);
  if (it == s.handles.end()) {
    fail(sim_error::invalid_handle, fmt::format("release_physical: {} is not a live handle", handle.value));
  }
  const sim_detail::physical_block& block = it->second;
  if (block.bytes != bytes) {
    fail(sim_error::invalid_value,
         fmt::format("release_physical: size {} does not match the handle's {}", bytes, block.bytes));
  }
  if (block.mappings != 0) {
    fail(sim_error::invalid_value,
         fmt::format("release_physical: handle {} is still mapped {} times", handle.value, block.mappings));
  }
  if (s.take_fault(sim_fault_target::release_physical)) {
    fail(sim_error::injected, fmt::format("release_physical: injected fault (handle {})", handle.value));
  }
  // The memory goes when its last handle (creator or import) goes.
  const auto refs = s.memory_refs.find(block.memory);
  if (refs != s.memory_refs.end() && --refs->second == 0) {
    if (s.options.backed) sim_detail::discard_file_range(s.memory_file, block.file_offset, block.bytes);
    s.used -= bytes;
    s.memory_refs.erase(refs);
  }
  s.handles.erase(it);
}

// Sharing: a token stands for the descriptor a real driver exports; only
// this process's sim backends can import it (the sim's memory is the
// process's own).
int sim_backend::do_export_physical(physical_handle handle) {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  s.require_virtual_memory("export_physical");
  if (!s.handles.contains(handle.value)) {
    fail(sim_error::invalid_handle, fmt::format("export_physical: {} is not a live handle", handle.value));
  }
  const int token = s.next_token++;
  s.tokens.emplace(token, handle.value);
  return token;
}

void sim_backend::do_close_export(int fd) noexcept {
  const std::lock_guard lock(state_->mu);
  state_->tokens.erase(fd);
}

physical_handle sim_backend::do_import_physical(int fd, std::size_t bytes) {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  s.require_virtual_memory("import_physical");
  const auto token = s.tokens.find(fd);
  if (token == s.tokens.end()) {
    fail(sim_error::invalid_handle, fmt::format("import_physical: {} is not an exported handle (its handle was "
                                                "released, or it comes from another process)",
                                                fd));
  }
  const sim_detail::physical_block exporter = s.handles.at(token->second);
  if (exporter.bytes != bytes) {
    fail(sim_error::invalid_value,
         fmt::format("import_physical: {} bytes, but the exported handle has {}", bytes, exporter.bytes));
  }
  const std::uint64_t id = s.next_handle++;
  s.handles.emplace(id, sim_detail::physical_block{bytes, exporter.file_offset, 0, exporter.memory});
  ++s.memory_refs[exporter.memory];
  return physical_handle{id};
}

bool sim_backend::do_map(void* va, std::size_t bytes, physical_handle handle) {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  s.require_virtual_memory("map");
  const std::uintptr_t a = address_of(va);
  s.require_granular("map", a, bytes);
  auto h = s.handles.find(handle.value);
  if (h == s.handles.end())
    fail(sim_error::invalid_handle, fmt::format("map: {} is not a live handle", handle.value));
  if (bytes != h->second.bytes) {
    fail(sim_error::invalid_value, fmt::format("map: {} bytes, but handle {} has {} (a handle is mapped whole)",
                                               bytes, handle.value, h->second.bytes));
  }
  if (!s.in_reservation(a, bytes)) {
    fail(sim_error::invalid_value, fmt::format("map: [{}, +{}) is not inside one reserved range", va, bytes));
  }
  if (s.overlaps_mapping(a, bytes)) {
    fail(sim_error::invalid_value, fmt::format("map: [{}, +{}) overlaps an existing mapping", va, bytes));
  }
  if (s.take_fault(sim_fault_target::map)) return false;
  if (s.options.backed && !sim_detail::map_file(va, bytes, s.memory_file, h->second.file_offset)) {
    return false;
  }
  s.mappings.emplace(a, sim_detail::mapping{bytes, handle.value, 0});
  ++h->second.mappings;
  return true;
}

bool sim_backend::do_set_access(void* va, std::size_t bytes) {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  s.require_virtual_memory("set_access");
  const std::uintptr_t a = address_of(va);
  s.require_granular("set_access", a, bytes);
  if (!s.fully_mapped(a, bytes)) {
    fail(sim_error::invalid_value, fmt::format("set_access: [{}, +{}) is not entirely mapped", va, bytes));
  }
  if (s.take_fault(sim_fault_target::set_access)) return false;
  if (s.options.backed && !sim_detail::grant_access(va, bytes)) return false;
  s.accessible.insert(a, a + bytes);
  for (const int peer : access_peers()) s.peer_accessible[peer].insert(a, a + bytes);
  return true;
}

void sim_backend::do_check_access_peer(int peer) const {
  const state& s = *state_;
  if (peer >= s.options.devices) {
    fail(sim_error::invalid_value, fmt::format("add_access_peer: no device {} in a machine of {} (sim_devices)", peer,
                                               s.options.devices));
  }
}

void sim_backend::do_unmap(void* va, std::size_t bytes) {
  state& s = *state_;
  const std::lock_guard lock(s.mu);
  s.require_virtual_memory("unmap");
  const std::uintptr_t a = address_of(va);
  s.require_granular("unmap", a, bytes);
  // The range must be exactly a run of whole, adjacent mappings.
  const auto first = s.mappings.find(a);
  auto last = first;
  std::uintptr_t covered = a;
  while (last != s.mappings.end() && last->first == covered && covered - a < bytes) {
    covered += last->second.bytes;
    ++last;
  }
  if (first == s.mappings.end() || covered - a != bytes) {
    fail(sim_error::invalid_value,
         fmt::format("unmap: [{}, +{}) is not exactly a run of whole mappings", va, bytes));
  }
  if (s.take_fault(sim_fault_target::unmap)) {
    fail(sim_error::injected, fmt::format("unmap: injected fault at [{}, +{})", va, bytes));
  }
  if (s.options.backed) sim_detail::clear_pages(va, bytes);
  for (auto it = first; it != last; ++it) --s.handles[it->second.handle].mappings;
  s.mappings.erase(first, last);
  s.accessible.erase(a, a + bytes);
  for (auto& [peer, ranges] : s.peer_accessible) ranges.erase(a, a + bytes);
}

}  // namespace fragctl
