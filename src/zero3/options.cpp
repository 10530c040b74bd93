// parse_options: one table row per key, so parser, errors, defaults and docs agree.
#include "fragctl/zero3/options.hpp"

#include <cmath>
#include <functional>

#include "fmt/format.h"
#include "fragctl/config.hpp"
#include "fragctl/zero3/layout.hpp"
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
  std::size_t element_bytes = default_element_bytes;
};

using setter = std::function<absl::Status(parse_state&, std::string_view)>;

// A key's parser and the formatter of its default: the documented default is
// `show(options{})`, so the struct's initialiser is the one place it is written.
struct row {
  std::string_view key;
  std::string_view type;
  std::string_view help;
  setter set;
  std::function<std::string(const options&)> show;
};

// DeepSpeed writes counts as 5e7: a whole number with at least four trailing
// zeros in that form, others in full.
std::string format_count(std::size_t n) {
  int zeros = 0;
  std::size_t mantissa = n;
  while (mantissa != 0 && mantissa % 10 == 0) {
    mantissa /= 10;
    ++zeros;
  }
  return zeros >= 4 ? fmt::format("{}e{}", mantissa, zeros) : fmt::format("{}", n);
}

row count_times_element(std::string_view key, std::size_t options::*member, std::string_view help) {
  return {key, "count", help,
          [member](parse_state& s, std::string_view v) -> absl::Status {
            auto n = parse_count(v);
            if (!n.ok()) return n.status();
            s.o.*member = *n * s.element_bytes;
            return absl::OkStatus();
          },
          [member](const options& o) { return format_count(o.*member / default_element_bytes); }};
}

row bytes(std::string_view key, std::size_t options::*member, std::string_view help) {
  return {key, "size", help,
          [member](parse_state& s, std::string_view v) -> absl::Status {
            auto n = parse_size(v);
            if (!n.ok()) return n.status();
            s.o.*member = *n;
            return absl::OkStatus();
          },
          [member](const options& o) { return format_size(o.*member); }};
}

const std::vector<row>& rows() {
  static const std::vector<row> table = {
      count_times_element(
          "stage3_prefetch_bucket_size", &options::prefetch_bytes,
          "DeepSpeed's name: elements gathered ahead of use; sets prefetch_bytes = count x element_bytes"),
      count_times_element(
          "stage3_max_live_parameters", &options::max_live_bytes,
          "DeepSpeed's name: elements gathered at once, at most; sets max_live_bytes = count x element_bytes"),
      {"stage3_param_persistence_threshold", "count",
       "DeepSpeed's name: parameters with fewer elements stay whole on every rank",
       [](parse_state& s, std::string_view v) -> absl::Status {
         auto n = parse_count(v);
         if (!n.ok()) return n.status();
         s.o.persistence_threshold = *n;
         return absl::OkStatus();
       },
       [](const options& o) { return format_count(o.persistence_threshold); }},
      bytes("prefetch_bytes", &options::prefetch_bytes,
            "bytes of blocks gathered ahead of use; 0 turns prefetching off"),
      bytes("max_live_bytes", &options::max_live_bytes, "hard cap on gathered bytes live at once"),
      {"element_bytes", "int", "bytes per element for the DeepSpeed counts that follow it in the string",
       [](parse_state& s, std::string_view v) -> absl::Status {
         std::uint64_t n = 0;
         if (!util::parse_u64(util::trim(v), n) || (n != 1 && n != 2 && n != 4 && n != 8)) {
           return absl::InvalidArgumentError("expected 1, 2, 4 or 8");
         }
         s.element_bytes = static_cast<std::size_t>(n);
         return absl::OkStatus();
       },
       [](const options&) { return fmt::format("{}", parse_state{}.element_bytes); }},
      {"alignment", "size", "alignment of every parameter, shard and gradient view (power of two, 512 B to 1 GiB)",
       [](parse_state& s, std::string_view v) -> absl::Status {
         auto n = parse_size(v);
         if (!n.ok()) return n.status();
         if (*n < 512 || *n > max_alignment || (*n & (*n - 1)) != 0)
           return absl::InvalidArgumentError("expected a power of two from 512 B to 1 GiB");
         s.o.alignment = *n;
         return absl::OkStatus();
       },
       [](const options& o) { return format_size(o.alignment); }},
      {"gradient_type", "enum: bf16|fp16|fp32",
       "element type of the reduce bucket and gradient shard; fp32 sums across ranks in fp32",
       [](parse_state& s, std::string_view v) -> absl::Status {
         auto t = parse_data_type(v);
         if (!t.ok() || *t == data_type::uint8) return absl::InvalidArgumentError("expected bf16, fp16 or fp32");
         s.o.gradient_type = *t;
         return absl::OkStatus();
       },
       [](const options& o) -> std::string {
         switch (o.gradient_type) {
           case data_type::bfloat16: return "bf16";
           case data_type::float16: return "fp16";
           case data_type::float32: return "fp32";
           case data_type::uint8: break;
         }
         return "uint8";
       }},
      {"prefetch", "bool", "record the first step's fetch order and prefetch along it",
       [](parse_state& s, std::string_view v) -> absl::Status {
         auto b = parse_flag(v);
         if (!b.ok()) return b.status();
         s.o.prefetch = *b;
         return absl::OkStatus();
       },
       [](const options& o) { return std::string(o.prefetch ? "true" : "false"); }},
  };
  return table;
}

}  // namespace

const std::vector<option_row>& option_rows() {
  static const std::vector<option_row> infos = [] {
    const options defaults;
    std::vector<option_row> out;
    for (const row& r : rows()) out.push_back({r.key, r.type, r.show(defaults), r.help});
    return out;
  }();
  return infos;
}

absl::StatusOr<options> parse_options(std::string_view text, options base) {
  parse_state state{base, default_element_bytes};
  for (const std::string_view item : util::split(text, ',')) {
    if (util::trim(item).empty()) continue;
    const std::size_t colon = item.find(':');
    const std::string_view key = util::trim(item.substr(0, colon));
    if (colon == std::string_view::npos) {
      return absl::InvalidArgumentError(fmt::format("zero3 option \"{}\": expected key:value", item));
    }
    const row* found = nullptr;
    for (const row& r : rows()) {
      if (r.key == key) found = &r;
    }
    if (found == nullptr) {
      std::string keys;
      for (const row& r : rows()) keys += fmt::format("{}{}", keys.empty() ? "" : ", ", r.key);
      return absl::InvalidArgumentError(fmt::format("unknown zero3 option \"{}\"; accepted: {}", key, keys));
    }
    if (absl::Status s = found->set(state, item.substr(colon + 1)); !s.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("zero3 option {} ({}): {}", key, found->type, util::to_std(s.message())));
    }
  }
  return state.o;
}

}  // namespace fragctl::zero3
