// The device memory ledger and its split (fragctl/device_memory.hpp).
#include "fragctl/device_memory.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "fmt/format.h"
#include "util/fork_safe_mutex.hpp"
#include "util/strings.hpp"

namespace fragctl {

namespace {

struct member {
  const device_backend* backend = nullptr;
  bool graph_pool = false;
};

// What the ledger keeps of one device.
struct device_record {
  std::vector<member> members;
  bool has_context = false;
  std::size_t context = 0;
  std::map<std::string, std::size_t, std::less<>> nccl;  // label -> bytes
};

using device_key = std::pair<std::string, int>;  // backend name, ordinal

struct ledger {
  util::fork_safe_mutex mu;
  std::map<device_key, device_record> devices;
};

// Never destroyed: allocators left alive at exit may still report.
ledger& the_ledger() {
  static ledger* const l = new ledger;
  return *l;
}

device_key key_of(const device_backend& b) { return {std::string(b.name()), b.device()}; }

std::size_t minus(std::size_t a, std::size_t b) noexcept { return a > b ? a - b : 0; }

// Reserved bytes of the device's allocators other than `self` (nullptr:
// all of them), plain and graph pools.
std::pair<std::size_t, std::size_t> reserved_of_members(const device_record& r, const device_backend* self) {
  std::size_t plain = 0;
  std::size_t pools = 0;
  for (const member& m : r.members) {
    if (m.backend == self) continue;
    (m.graph_pool ? pools : plain) += m.backend->counters().held_bytes;
  }
  return {plain, pools};
}

void forget_if_unused(ledger& l, std::map<device_key, device_record>::iterator it) {
  if (it->second.members.empty() && it->second.nccl.empty()) l.devices.erase(it);
}

}  // namespace

device_memory_split split_device_memory(const device_memory_inputs& in) noexcept {
  device_memory_split s;
  s.total = in.total;
  s.used = minus(in.total, in.free);
  s.fragctl = in.reserved;
  s.per_process = in.process.measured;
  if (s.per_process) s.this_process = in.process.this_process;
  // Each known part takes what is left of "not fragctl's", the counted and
  // measured ones first (fragctl/device_memory.hpp); the remainder is `other`.
  std::size_t left = s.not_fragctl();
  const auto take = [&left](std::size_t want) {
    const std::size_t got = std::min(want, left);
    left -= got;
    return got;
  };
  s.other_fragctl = take(in.other_fragctl);
  s.graph_pools = take(in.graph_pools);
  s.other_processes = s.per_process ? take(in.process.other_processes) : 0;
  s.nccl = take(in.nccl);
  s.context = take(in.context);
  s.other = left;
  return s;
}

device_memory_split device_memory_split_of(const device_backend& backend, std::size_t reserved, std::size_t free,
                                           std::size_t total, std::size_t outside_at_start) noexcept {
  try {
    device_memory_inputs in;
    in.total = total;
    in.free = free;
    in.reserved = reserved;
    in.process = backend.get_process_memory();  // before the ledger's lock: the backend may lock
    in.context = outside_at_start;
    ledger& l = the_ledger();
    const std::lock_guard lock(l.mu);
    if (const auto it = l.devices.find(key_of(backend)); it != l.devices.end()) {
      const device_record& r = it->second;
      std::tie(in.other_fragctl, in.graph_pools) = reserved_of_members(r, &backend);
      if (r.has_context) in.context = r.context;
      for (const auto& [label, bytes] : r.nccl) in.nccl += bytes;
    }
    return split_device_memory(in);
  } catch (...) {  // out of host memory
    return {};
  }
}

std::string describe(const device_memory_split& s) {
  using util::human_bytes;
  std::string text = fmt::format(
      "not fragctl's {}: context {}, NCCL {}, graph pools {}, other fragctl allocators {}, "
      "other {}",
      human_bytes(s.not_fragctl()), human_bytes(s.context), human_bytes(s.nccl), human_bytes(s.graph_pools),
      human_bytes(s.other_fragctl), human_bytes(s.other));
  if (s.per_process) {
    text += fmt::format(", other processes {} (NVML; this process {})", human_bytes(s.other_processes),
                        human_bytes(s.this_process));
  } else {
    text += " (no per-process figures: other processes' memory is in other)";
  }
  return text;
}

void join_device_memory_ledger(const device_backend& backend, bool graph_pool, std::size_t outside_at_start) {
  const process_memory process = backend.get_process_memory();
  ledger& l = the_ledger();
  const std::lock_guard lock(l.mu);
  device_record& r = l.devices[key_of(backend)];
  r.members.push_back({&backend, graph_pool});
  if (r.has_context) return;
  r.has_context = true;
  if (process.measured) {
    const auto [plain, pools] = reserved_of_members(r, nullptr);
    std::size_t nccl = 0;
    for (const auto& [label, bytes] : r.nccl) nccl += bytes;
    r.context = minus(process.this_process, plain + pools + nccl);
  } else {
    r.context = outside_at_start;
  }
}

void leave_device_memory_ledger(const device_backend& backend) noexcept {
  ledger& l = the_ledger();
  const std::lock_guard lock(l.mu);
  const auto it = l.devices.find(key_of(backend));
  if (it == l.devices.end()) return;
  std::erase_if(it->second.members, [&](const member& m) { return m.backend == &backend; });
  forget_if_unused(l, it);
}

std::string_view to_string(device_memory_use use) noexcept {
  switch (use) {
    case device_memory_use::nccl: return "nccl";
  }
  return "?";
}

std::optional<device_memory_use> parse_device_memory_use(std::string_view text) noexcept {
  if (text == "nccl") return device_memory_use::nccl;
  return std::nullopt;
}

void attribute_device_memory(const device_backend& backend, device_memory_use use, std::string_view label,
                             std::size_t bytes) {
  (void)use;  // one use so far
  ledger& l = the_ledger();
  const std::lock_guard lock(l.mu);
  const device_key key = key_of(backend);
  if (bytes == 0) {
    const auto it = l.devices.find(key);
    if (it == l.devices.end()) return;
    if (const auto entry = it->second.nccl.find(label); entry != it->second.nccl.end()) it->second.nccl.erase(entry);
    forget_if_unused(l, it);
    return;
  }
  l.devices[key].nccl.insert_or_assign(std::string(label), bytes);
}

std::size_t process_memory_outside_fragctl(const device_backend& backend) noexcept {
  const process_memory process = backend.get_process_memory();
  if (!process.measured) return SIZE_MAX;
  try {
    ledger& l = the_ledger();
    const std::lock_guard lock(l.mu);
    std::size_t fragctl = 0;
    if (const auto it = l.devices.find(key_of(backend)); it != l.devices.end()) {
      const auto [plain, pools] = reserved_of_members(it->second, nullptr);
      fragctl = plain + pools;
    } else {
      fragctl = backend.counters().held_bytes;
    }
    return minus(process.this_process, fragctl);
  } catch (...) {
    return SIZE_MAX;
  }
}

}  // namespace fragctl
