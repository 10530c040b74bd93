// memory_snapshot: sums and the JSON form (fragctl/memory_map.hpp).
#include "fragctl/memory_map.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#include "core/json_io.hpp"
#include "core/memory_map_json.hpp"
#include "fmt/format.h"

namespace fragctl {

std::string_view to_string(block_use use) noexcept {
  switch (use) {
    case block_use::live:
      return "live";
    case block_use::free:
      return "free";
    case block_use::pending:
      return "pending";
  }
  return "free";
}

std::size_t memory_snapshot::reserved_bytes() const noexcept {
  std::size_t total = 0;
  for (const memory_segment& s : segments) total += s.size;
  return total;
}

std::size_t memory_snapshot::bytes(block_use use) const noexcept {
  std::size_t total = 0;
  for (const memory_segment& s : segments)
    for (const memory_block& b : s.blocks)
      if (b.use == use) total += b.size;
  return total;
}

std::size_t memory_snapshot::block_count() const noexcept {
  std::size_t n = 0;
  for (const memory_segment& s : segments) n += s.blocks.size();
  return n;
}

std::size_t memory_snapshot::largest_free_block() const noexcept {
  std::size_t largest = 0;
  for (const memory_segment& s : segments)
    for (const memory_block& b : s.blocks)
      if (b.use == block_use::free) largest = std::max(largest, b.size);
  return largest;
}

namespace detail {

namespace {

using nlohmann::json;

std::string hex(std::uintptr_t v) { return fmt::format("{:#x}", v); }
std::string hex(stream_t s) { return hex(reinterpret_cast<std::uintptr_t>(s)); }

// Reads the fields of one object; the first error sticks.
class reader {
 public:
  explicit reader(std::string where) : where_(std::move(where)) {}

  void address(const json& obj, const char* key, std::uintptr_t& out) {
    if (!status_.ok()) return;
    const auto it = obj.find(key);
    if (it == obj.end()) return;
    const std::string text = it->is_string() ? it->get<std::string>() : std::string();
    char* end = nullptr;
    const unsigned long long v = std::strtoull(text.c_str(), &end, 16);
    if (text.size() < 3 || text.compare(0, 2, "0x") != 0 || end != text.c_str() + text.size()) {
      fail(key, "a hex string such as \"0x7f00\"");
      return;
    }
    out = static_cast<std::uintptr_t>(v);
  }

  void stream(const json& obj, const char* key, stream_t& out) {
    std::uintptr_t v = 0;
    address(obj, key, v);
    out = reinterpret_cast<stream_t>(v);
  }

  void size(const json& obj, const char* key, std::size_t& out) {
    if (!status_.ok()) return;
    const auto it = obj.find(key);
    if (it == obj.end()) return;
    if (!it->is_number_unsigned()) {
      fail(key, "a non-negative integer");
      return;
    }
    out = it->get<std::size_t>();
  }

  void fail(std::string_view key, std::string_view expected) {
    status_ = absl::InvalidArgumentError(fmt::format("{}: field \"{}\": expected {}", where_, key, expected));
  }

  [[nodiscard]] const absl::Status& status() const noexcept { return status_; }

 private:
  std::string where_;
  absl::Status status_;
};

absl::StatusOr<block_use> use_from(const json& j, std::string_view where) {
  const std::string text = j.is_string() ? j.get<std::string>() : std::string();
  for (const block_use u : {block_use::live, block_use::free, block_use::pending})
    if (text == to_string(u)) return u;
  return absl::InvalidArgumentError(
      fmt::format("{}: field \"use\": expected \"live\", \"free\" or \"pending\"", where));
}

}  // namespace

json memory_snapshot_to_json_value(const memory_snapshot& m, std::size_t max_blocks) {
  const bool omit = m.block_count() > max_blocks;
  json segments = json::array();
  for (const memory_segment& s : m.segments) {
    json seg{{"address", hex(s.address)}, {"size", s.size}, {"stream", hex(s.stream)}, {"pool", s.pool}};
    if (!omit) {
      json blocks = json::array();
      for (const memory_block& b : s.blocks) {
        blocks.push_back(json{{"address", hex(b.address)},
                              {"size", b.size},
                              {"requested", b.requested},
                              {"use", std::string(to_string(b.use))},
                              {"stream", hex(b.stream)}});
      }
      seg["blocks"] = std::move(blocks);
    }
    segments.push_back(std::move(seg));
  }
  json j{{"available", m.available}, {"allocator", m.allocator}, {"segments", std::move(segments)}};
  if (omit) j["blocks_omitted"] = true;
  return j;
}

absl::StatusOr<memory_snapshot> memory_snapshot_from_json_value(const json& j, std::string_view where) {
  if (!j.is_object()) return absl::InvalidArgumentError(fmt::format("{}: expected a JSON object", where));
  memory_snapshot m;
  if (const auto a = j.find("available"); a != j.end()) {
    if (!a->is_boolean()) return absl::InvalidArgumentError(fmt::format("{}: field \"available\": expected a boolean", where));
    m.available = a->get<bool>();
  }
  if (const auto a = j.find("allocator"); a != j.end() && a->is_string()) m.allocator = a->get<std::string>();
  const auto segs = j.find("segments");
  if (segs == j.end()) return m;
  if (!segs->is_array()) return absl::InvalidArgumentError(fmt::format("{}: field \"segments\": expected an array", where));
  for (std::size_t i = 0; i < segs->size(); ++i) {
    const json& sj = (*segs)[i];
    const std::string seg_where = fmt::format("{}: segments[{}]", where, i);
    if (!sj.is_object()) return absl::InvalidArgumentError(fmt::format("{}: expected an object", seg_where));
    memory_segment s;
    reader r(seg_where);
    r.address(sj, "address", s.address);
    r.size(sj, "size", s.size);
    r.stream(sj, "stream", s.stream);
    if (!r.status().ok()) return r.status();
    if (const auto p = sj.find("pool"); p != sj.end() && p->is_string()) s.pool = p->get<std::string>();
    if (const auto blocks = sj.find("blocks"); blocks != sj.end()) {
      if (!blocks->is_array()) return absl::InvalidArgumentError(fmt::format("{}: field \"blocks\": expected an array", seg_where));
      for (std::size_t k = 0; k < blocks->size(); ++k) {
        const json& bj = (*blocks)[k];
        const std::string block_where = fmt::format("{}.blocks[{}]", seg_where, k);
        if (!bj.is_object()) return absl::InvalidArgumentError(fmt::format("{}: expected an object", block_where));
        memory_block b;
        reader br(block_where);
        br.address(bj, "address", b.address);
        br.size(bj, "size", b.size);
        br.size(bj, "requested", b.requested);
        br.stream(bj, "stream", b.stream);
        if (!br.status().ok()) return br.status();
        if (const auto u = bj.find("use"); u != bj.end()) {
          auto use = use_from(*u, block_where);
          if (!use.ok()) return use.status();
          b.use = *use;
        }
        s.blocks.push_back(b);
      }
    }
    m.segments.push_back(std::move(s));
  }
  return m;
}

}  // namespace detail

std::string to_json(const memory_snapshot& m, std::size_t max_blocks) {
  return detail::dump_json(detail::memory_snapshot_to_json_value(m, max_blocks));
}

absl::StatusOr<memory_snapshot> memory_snapshot_from_json(std::string_view text) {
  auto j = detail::parse_json(text, "memory map JSON");
  if (!j.ok()) return j.status();
  return detail::memory_snapshot_from_json_value(*j, "memory map JSON");
}

}  // namespace fragctl
