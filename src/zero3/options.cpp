// parse_options: one table row per key, so parser, errors and docs agree.
#include "fragctl/zero3/options.hpp"

#include <cmath>
#include <functional>

#include "fmt/format.h"
#include "fragctl/config.hpp"
#include "util/strings.hpp"

namespace fragctl::zero3 {

namespace {

// An element count: "50000000", "5e7", "1.5e9".
absl::StatusOr<std::size_t> parse_count(std::string_view text) {
  const std::string_view t = util::trim(text);
  std::uint64_t whole = 0;
  if (util::parse_u64(t, whole)) return static_cast<std::size_t>(whole);
  double value = 0;
  if (!util::parse_double(t, value) || !(value >= 0) || value >= 0x1p63 || value != std::floor(value)) {
    return absl::InvalidArgumentError(fmt::format("\"{}\" is not a count: expected a whole number such as 5e7", text));
  }
  return static_cast<std::size_t>(value);
}

absl::StatusOr<bool> parse_flag(std::string_view text) {
  const std::string t = util::lower(util::trim(text));
  if (t == "true" || t == "1" || t == "yes" || t == "on") return true;
  if (t == "false" || t == "0" || t == "no" || t == "off") return false;
  return absl::InvalidArgumentError("expected true/false, 1/0, yes/no or on/off");
}

struct parse_state {
  options o;
  std::size_t element_bytes = 2;
};

using setter = std::function<absl::Status(parse_state&, std::string_view)>;

struct row {
  option_row info;
  setter set;
};

setter count_times_element(std::size_t options::*member) {
  return [member](parse_state& s, std::string_view v) -> absl::Status {
    auto n = parse_count(v);
    if (!n.ok()) return n.status();
    s.o.*member = *n * s.element_bytes;
    return absl::OkStatus();
  };
}

setter bytes(std::size_t options::*member) {
  return [member](parse_state& s, std::string_view v) -> absl::Status {
    auto n = parse_size(v);
    if (!n.ok()) return n.status();
    s.o.*member = *n;
    return absl::OkStatus();
  };
}

const std::vector<row>& rows() {
  static const std::vector<row> table = {
      {{"stage3_prefetch_bucket_size", "count", "5e7",
        "DeepSpeed's name: elements gathered ahead of use; sets prefetch_bytes = count x element_bytes"},
       count_times_element(&options::prefetch_bytes)},
      {{"stage3_max_live_parameters", "count", "1e9",
        "DeepSpeed's name: elements gathered at once, at most; sets max_live_bytes = count x element_bytes"},
       count_times_element(&options::max_live_bytes)},
      {{"stage3_param_persistence_threshold", "count", "1e5",
        "DeepSpeed's name: parameters with fewer elements stay whole on every rank"},
       [](parse_state& s, std::string_view v) -> absl::Status {
         auto n = parse_count(v);
         if (!n.ok()) return n.status();
         s.o.persistence_threshold = *n;
         return absl::OkStatus();
       }},
      {{"prefetch_bytes", "size", "100MB", "bytes of blocks gathered ahead of use; 0 turns prefetching off"},
       bytes(&options::prefetch_bytes)},
      {{"max_live_bytes", "size", "2GB", "hard cap on gathered bytes live at once"}, bytes(&options::max_live_bytes)},
      {{"element_bytes", "int", "2", "bytes per element for the DeepSpeed counts that follow it in the string"},
       [](parse_state& s, std::string_view v) -> absl::Status {
         std::uint64_t n = 0;
         if (!util::parse_u64(util::trim(v), n) || (n != 1 && n != 2 && n != 4 && n != 8)) {
           return absl::InvalidArgumentError("expected 1, 2, 4 or 8");
         }
         s.element_bytes = static_cast<std::size_t>(n);
         return absl::OkStatus();
       }},
      {{"alignment", "size", "512", "alignment of every parameter, shard and gradient view (power of two, >= 512)"},
       [](parse_state& s, std::string_view v) -> absl::Status {
         auto n = parse_size(v);
         if (!n.ok()) return n.status();
         if (*n < 512 || (*n & (*n - 1)) != 0) return absl::InvalidArgumentError("expected a power of two >= 512");
         s.o.alignment = *n;
         return absl::OkStatus();
       }},
      {{"gradient_type", "enum: bf16|fp16|fp32", "bf16",
        "element type of the reduce bucket and gradient shard; fp32 sums across ranks in fp32"},
       [](parse_state& s, std::string_view v) -> absl::Status {
         auto t = parse_data_type(v);
         if (!t.ok() || *t == data_type::uint8) return absl::InvalidArgumentError("expected bf16, fp16 or fp32");
         s.o.gradient_type = *t;
         return absl::OkStatus();
       }},
      {{"prefetch", "bool", "true", "record the first step's fetch order and prefetch along it"},
       [](parse_state& s, std::string_view v) -> absl::Status {
         auto b = parse_flag(v);
         if (!b.ok()) return b.status();
         s.o.prefetch = *b;
         return absl::OkStatus();
       }},
  };
  return table;
}

}  // namespace

const std::vector<option_row>& option_rows() {
  static const std::vector<option_row> infos = [] {
    std::vector<option_row> out;
    for (const row& r : rows()) out.push_back(r.info);
    return out;
  }();
  return infos;
}

absl::StatusOr<options> parse_options(std::string_view text, options base) {
  parse_state state{base, 2};
  for (const std::string_view item : util::split(text, ',')) {
    if (util::trim(item).empty()) continue;
    const std::size_t colon = item.find(':');
    const std::string_view key = util::trim(item.substr(0, colon));
    if (colon == std::string_view::npos) {
      return absl::InvalidArgumentError(fmt::format("zero3 option \"{}\": expected key:value", item));
    }
    const row* found = nullptr;
    for (const row& r : rows()) {
      if (r.info.key == key) found = &r;
    }
    if (found == nullptr) {
      std::string keys;
      for (const row& r : rows()) keys += fmt::format("{}{}", keys.empty() ? "" : ", ", r.info.key);
      return absl::InvalidArgumentError(fmt::format("unknown zero3 option \"{}\"; accepted: {}", key, keys));
    }
    if (absl::Status s = found->set(state, item.substr(colon + 1)); !s.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("zero3 option {} ({}): {}", key, found->info.type, util::to_std(s.message())));
    }
  }
  return state.o;
}

}  // namespace fragctl::zero3
