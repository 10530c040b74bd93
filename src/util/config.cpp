// FRAGCTL_CONF parsing: one table row per option gives its key, type, default,
// help and how to store it, so parser, error messages and docs agree.
#include "fragctl/config.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <mutex>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "fragctl/log.hpp"
#include "util/pytorch_conf.hpp"
#include "util/strings.hpp"

namespace fragctl {

namespace {

absl::StatusOr<bool> parse_bool(std::string_view text) {
  const std::string t = util::lower(text);
  if (t == "true" || t == "1" || t == "yes" || t == "on") return true;
  if (t == "false" || t == "0" || t == "no" || t == "off") return false;
  return absl::InvalidArgumentError("expected true/false, 1/0, yes/no or on/off");
}

absl::StatusOr<int> parse_int(std::string_view text) {
  std::int64_t value = 0;
  if (!util::parse_i64(util::trim(text), value) || value < INT32_MIN || value > INT32_MAX)
    return absl::InvalidArgumentError("expected an integer");
  return static_cast<int>(value);
}

using setter = std::function<absl::Status(config&, std::string_view)>;

template <class T, class Parse>
setter field(T config::*member, Parse parse) {
  return [member, parse](config& c, std::string_view v) -> absl::Status {
    auto parsed = parse(v);
    if (!parsed.ok()) return parsed.status();
    c.*member = static_cast<T>(*parsed);
    return absl::OkStatus();
  };
}

// No device holds more than 2^62 bytes (the largest request an allocator
// accepts): a larger option value is a mistake, and would overflow the
// rounding arithmetic of the policies that use it.
absl::StatusOr<std::size_t> parse_option_size(std::string_view text) {
  auto bytes = parse_size(text);
  if (bytes.ok() && *bytes > (std::size_t{1} << 62))
    return absl::InvalidArgumentError("expected a size of at most 4 EiB (2^62 bytes)");
  return bytes;
}

setter size_field(std::size_t config::*m) { return field(m, parse_option_size); }
setter bool_field(bool config::*m) { return field(m, parse_bool); }
setter string_field(std::string config::*m) {
  return [m](config& c, std::string_view v) {
    c.*m = std::string(v);
    return absl::OkStatus();
  };
}

struct option_row {
  option_info info;
  setter set;
};

const std::vector<option_row>& rows() {
  static const std::vector<option_row> table = {
      {{"device", "int", "0", "device ordinal the allocator serves"},
       field(&config::device, [](std::string_view v) -> absl::StatusOr<int> {
         auto d = parse_int(v);
         if (d.ok() && *d < 0) return absl::InvalidArgumentError("expected a device ordinal >= 0");
         return d;
       })},
      {{"sim_capacity", "size", "80GiB", "sim backend: device memory size"},
       size_field(&config::sim_capacity)},
      {{"sim_granularity", "size", "2MiB", "sim backend: physical allocation granularity (power of two)"},
       [](config& c, std::string_view v) -> absl::Status {
         auto s = parse_option_size(v);
         if (!s.ok()) return s.status();
         if (*s < 4096 || (*s & (*s - 1)) != 0)
           return absl::InvalidArgumentError("expected a power of two of at least 4KiB");
         c.sim_granularity = *s;
         return absl::OkStatus();
       }},
      {{"sim_backed", "bool", "false", "sim backend: real host memory instead of fake addresses"},
       bool_field(&config::sim_backed)},
      {{"sim_virtual_memory", "bool", "true", "sim backend: offer the virtual memory calls"},
       bool_field(&config::sim_virtual_memory)},
      {{"small_size", "size", "1MiB",
        "caching: requests up to this size use the small pool (warmup: smaller ones are pre-filled apart)"},
       size_field(&config::small_size)},
      {{"small_segment", "size", "2MiB", "caching: segment size of the small pool"},
       size_field(&config::small_segment)},
      {{"large_segment", "size", "20MiB", "caching: segment size for requests below large_segment_limit"},
       size_field(&config::large_segment)},
      {{"large_segment_limit", "size", "10MiB", "caching: requests below this share large_segment segments"},
       size_field(&config::large_segment_limit)},
      {{"segment_round", "size", "2MiB", "caching: larger requests get their own segment rounded to this"},
       size_field(&config::segment_round)},
      {{"max_split_size", "size", "unlimited", "caching: cached blocks this large or larger are never split"},
       [](config& c, std::string_view v) -> absl::Status {
         if (util::lower(v) == "unlimited") {
           c.max_split_size = SIZE_MAX;
           return absl::OkStatus();
         }
         auto s = parse_option_size(v);
         if (!s.ok())
           return absl::InvalidArgumentError("expected a size of at most 4 EiB (2^62 bytes) or \"unlimited\"");
         c.max_split_size = *s;
         return absl::OkStatus();
       }},
      {{"release_on_oom", "bool", "true", "caching: on out-of-memory free unused cached segments and retry once"},
       bool_field(&config::release_on_oom)},
      {{"arena_size", "size", "0 (device total)", "arena: virtual address range reserved per device"},
       size_field(&config::arena_size)},
      {{"release_threshold", "size", "0", "arena: free mapped bytes kept mapped instead of unmapped"},
       size_field(&config::release_threshold)},
      {{"release_delay", "int", "1048576",
        "arena: allocator calls a wholly free span beyond release_threshold stays mapped before it is "
        "unmapped (0 = at once)"},
       field(&config::release_delay, [](std::string_view v) -> absl::StatusOr<std::size_t> {
         std::uint64_t n = 0;
         if (!util::parse_u64(util::trim(v), n)) return absl::InvalidArgumentError("expected an integer >= 0");
         return static_cast<std::size_t>(n);
       })},
      {{"map_chunk", "size", "32MiB",
        "arena: largest physical handle (span); growth maps up to this much per driver call (the granularity or "
        "less: one handle per granule)"},
       size_field(&config::map_chunk)},
      {{"wait_before_growing", "bool", "true",
        "arena: before creating physical memory while cached spans wait on pending frees, wait for them and "
        "re-stitch the spans (false: create at once)"},
       bool_field(&config::wait_before_growing)},
      {{"fallback_size", "size", "0 (90% of free)", "arena without virtual memory: size of the pre-reserved block"},
       size_field(&config::fallback_size)},
      {{"buckets_limit", "size", "1MiB", "buckets: largest request served from size classes"},
       size_field(&config::buckets_limit)},
      {{"slab_size", "size", "2MiB", "buckets: slab carved into fixed-size slots"},
       size_field(&config::slab_size)},
      {{"slab_reserve", "int", "4", "buckets: empty slabs kept per class before returning them upstream"},
       field(&config::slab_reserve, [](std::string_view v) -> absl::StatusOr<std::size_t> {
         auto d = parse_int(v);
         if (!d.ok() || *d < 0) return absl::InvalidArgumentError("expected an integer >= 0");
         return static_cast<std::size_t>(*d);
       })},
      {{"warmup_bytes", "size", "0", "warmup: bytes to pre-reserve at start"},
       size_field(&config::warmup_bytes)},
      {{"warmup_profile", "string", "", "warmup: JSON report of a previous run to size the pre-reservation"},
       string_field(&config::warmup_profile)},
      {{"warmup_on_exhausted", "enum: grow|fail", "grow", "warmup: what to do when the profile was too small"},
       field(&config::warmup_on_exhausted,
             [](std::string_view v) -> absl::StatusOr<warmup_exhausted> {
               if (v == "grow") return warmup_exhausted::grow;
               if (v == "fail") return warmup_exhausted::fail;
               return absl::InvalidArgumentError("expected grow or fail");
             })},
      {{"limit", "size", "0 (none)", "refuse allocations that would take requested bytes above this"},
       size_field(&config::limit)},
      {{"thread_safe", "bool", "true", "serialize calls with a lock (off only for single-threaded use)"},
       bool_field(&config::thread_safe)},
      {{"report", "string", "", "same as FRAGCTL_REPORT: write the JSON report here at exit"},
       string_field(&config::report_path)},
      {{"trace", "string", "", "same as FRAGCTL_TRACE: record every allocate and free to this CSV"},
       string_field(&config::trace_path)},
      {{"report_interval", "duration", "0 (off)",
        "same as FRAGCTL_REPORT_INTERVAL: rewrite the report and Prometheus files this often"},
       field(&config::report_interval_ms, parse_duration_ms)},
      {{"prometheus", "string", "", "same as FRAGCTL_PROMETHEUS: write Prometheus text here"},
       string_field(&config::prometheus_path)},
      {{"report_map", "bool", "true", "put each allocator's memory map into the JSON report"},
       bool_field(&config::report_map)},
  };
  return table;
}

}  // namespace

const std::vector<option_info>& config_options() {
  static const std::vector<option_info> infos = [] {
    std::vector<option_info> v;
    for (const auto& row : rows()) v.push_back(row.info);
    return v;
  }();
  return infos;
}

absl::StatusOr<std::size_t> parse_size(std::string_view text) {
  std::string_view t = util::trim(text);
  std::size_t split = 0;
  while (split < t.size() && ((t[split] >= '0' && t[split] <= '9') || t[split] == '.'))
    ++split;
  const std::string_view number = t.substr(0, split);
  const std::string unit = util::lower(util::trim(t.substr(split)));
  double multiplier = 0;
  if (unit.empty() || unit == "b") multiplier = 1;
  else if (unit == "k" || unit == "kib") multiplier = 0x1p10;
  else if (unit == "m" || unit == "mib") multiplier = 0x1p20;
  else if (unit == "g" || unit == "gib") multiplier = 0x1p30;
  else if (unit == "t" || unit == "tib") multiplier = 0x1p40;
  else if (unit == "kb") multiplier = 1e3;
  else if (unit == "mb") multiplier = 1e6;
  else if (unit == "gb") multiplier = 1e9;
  else if (unit == "tb") multiplier = 1e12;
  const auto bad = [&] {
    return absl::InvalidArgumentError(fmt::format(
        "\"{}\" is not a size: expected bytes or a number with B, KiB, MiB, GiB, TiB (powers of 2: MiB is 2^20 "
        "bytes) or KB, MB, GB, TB (powers of 10: MB is 10^6 bytes)", text));
  };
  if (number.empty() || multiplier == 0) return bad();
  if (number.find('.') == std::string_view::npos) {
    std::uint64_t whole = 0;
    if (!util::parse_u64(number, whole)) return bad();
    const auto m = static_cast<std::uint64_t>(multiplier);
    if (whole > std::numeric_limits<std::uint64_t>::max() / m) return bad();
    return static_cast<std::size_t>(whole * m);
  }
  double value = 0;
  if (!util::parse_double(number, value)) return bad();
  const double bytes = std::round(value * multiplier);
  if (!(bytes >= 0) || bytes >= 0x1p64) return bad();
  if (bytes == 0 && value > 0)
    return absl::InvalidArgumentError(fmt::format("\"{}\" is less than one byte: give 0 or at least 1 byte", text));
  return static_cast<std::size_t>(bytes);
}

absl::StatusOr<std::uint64_t> parse_duration_ms(std::string_view text) {
  const std::string_view t = util::trim(text);
  std::size_t split = 0;
  while (split < t.size() && ((t[split] >= '0' && t[split] <= '9') || t[split] == '.')) ++split;
  const std::string unit = util::lower(util::trim(t.substr(split)));
  double per_unit = 0;
  if (unit.empty() || unit == "s") per_unit = 1e3;
  else if (unit == "ms") per_unit = 1;
  else if (unit == "m" || unit == "min") per_unit = 60e3;
  else if (unit == "h") per_unit = 3600e3;
  double value = 0;
  if (per_unit == 0 || split == 0 || !util::parse_double(t.substr(0, split), value) || !(value >= 0) ||
      value * per_unit >= 0x1p63) {
    return absl::InvalidArgumentError(
        fmt::format("\"{}\" is not a duration: expected a number with ms, s, m or h (e.g. 10s)", text));
  }
  const auto ms = static_cast<std::uint64_t>(std::llround(value * per_unit));
  if (ms == 0 && value > 0) {
    return absl::InvalidArgumentError(
        fmt::format("\"{}\" is less than 1 ms, which would round to 0 (off): give 0 for off or at least 1ms", text));
  }
  return ms;
}

absl::StatusOr<backend_kind> parse_backend_kind(std::string_view text) {
  const std::string t = util::lower(util::trim(text));
  if (t == "cuda") return backend_kind::cuda;
  if (t == "hip") return backend_kind::hip;
  if (t == "sim") return backend_kind::sim;
  if (t.empty() || t == "auto") return backend_kind::automatic;
  return absl::InvalidArgumentError(fmt::format("\"{}\" is not a backend: expected cuda, hip, sim or auto", text));
}

absl::StatusOr<config> parse_config(std::string_view conf, config base) {
  for (std::string_view item : util::split(conf, ',')) {
    item = util::trim(item);
    if (item.empty()) continue;
    const std::size_t colon = item.find(':');
    if (colon == std::string_view::npos) {
      return absl::InvalidArgumentError(
          fmt::format("FRAGCTL_CONF: \"{}\" is not key:value", item));
    }
    const std::string_view key = util::trim(item.substr(0, colon));
    const std::string_view value = util::trim(item.substr(colon + 1));
    const option_row* row = nullptr;
    for (const auto& r : rows()) {
      if (r.info.key == key) row = &r;
    }
    if (row == nullptr) {
      if (auto pytorch = util::apply_pytorch_key(base, key, value)) {
        if (!pytorch->ok())
          return absl::InvalidArgumentError(fmt::format("FRAGCTL_CONF: {}", util::to_std(pytorch->status().message())));
        continue;
      }
      std::vector<std::string_view> keys;
      for (const auto& r : rows()) keys.push_back(r.info.key);
      return absl::InvalidArgumentError(fmt::format("FRAGCTL_CONF: unknown key \"{}\"; known keys: {}",
                                                    key, fmt::join(keys, ", ")));
    }
    if (absl::Status s = row->set(base, value); !s.ok()) {
      return absl::InvalidArgumentError(fmt::format("FRAGCTL_CONF: bad value \"{}\" for {} ({}): {}", value,
                                                    key, row->info.type, util::to_std(s.message())));
    }
    base.options_set.emplace_back(key);
  }
  return base;
}

namespace {

/// Every variable config_from_environment and the logger read.
constexpr std::string_view environment_variables[] = {
    "FRAGCTL_POLICY",     "FRAGCTL_BACKEND",    "FRAGCTL_CONF",           "FRAGCTL_REPORT",
    "FRAGCTL_TRACE",      "FRAGCTL_LOG_LEVEL",  "FRAGCTL_PROMETHEUS",     "FRAGCTL_REPORT_INTERVAL"};

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

/// Warns once per process about each FRAGCTL_* variable of the environment
/// that is not one the library reads but within three edits of one (a typo
/// such as FRAGCTL_POLICYS), naming that one. Other FRAGCTL_* names belong to
/// the project's scripts and tests and are left alone.
void warn_misspelt_environment_variables() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      const std::string_view entry(*e);
      const std::string_view name = entry.substr(0, entry.find('='));
      if (!name.starts_with("FRAGCTL_")) continue;
      std::string_view closest;
      std::size_t best = 4;
      for (const std::string_view known : environment_variables) {
        if (known == name) {
          closest = {};
          break;
        }
        if (const std::size_t d = edit_distance(name, known); d < best) {
          best = d;
          closest = known;
        }
      }
      if (!closest.empty())
        logger().warn("{} is not a fragctl variable and is ignored; did you mean {}?", name, closest);
    }
  });
}

}  // namespace

absl::StatusOr<config> config_from_environment() {
  warn_misspelt_environment_variables();
  config c;
  const auto env = [](const char* name) -> std::string_view {
    const char* v = std::getenv(name);
    return v == nullptr ? std::string_view() : std::string_view(v);
  };
  c.policy = std::string(util::trim(env("FRAGCTL_POLICY")));
  auto backend = parse_backend_kind(env("FRAGCTL_BACKEND"));
  if (!backend.ok())
    return absl::InvalidArgumentError(fmt::format("FRAGCTL_BACKEND: {}", util::to_std(backend.status().message())));
  c.backend = *backend;
  if (std::getenv("FRAGCTL_CONF") == nullptr && !env("PYTORCH_CUDA_ALLOC_CONF").empty()) {
    auto pytorch = util::apply_pytorch_conf(env("PYTORCH_CUDA_ALLOC_CONF"), std::move(c));
    if (!pytorch.ok()) return pytorch.status();
    logger().warn("FRAGCTL_CONF unset, read PYTORCH_CUDA_ALLOC_CONF: {}", pytorch->summary);
    c = std::move(pytorch->applied);
  }
  auto parsed = parse_config(env("FRAGCTL_CONF"), std::move(c));
  if (!parsed.ok()) return parsed.status();
  if (!env("FRAGCTL_REPORT").empty()) parsed->report_path = std::string(env("FRAGCTL_REPORT"));
  if (!env("FRAGCTL_TRACE").empty()) parsed->trace_path = std::string(env("FRAGCTL_TRACE"));
  if (!env("FRAGCTL_LOG_LEVEL").empty()) parsed->log_level = std::string(env("FRAGCTL_LOG_LEVEL"));
  if (!env("FRAGCTL_PROMETHEUS").empty()) parsed->prometheus_path = std::string(env("FRAGCTL_PROMETHEUS"));
  if (!env("FRAGCTL_REPORT_INTERVAL").empty()) {
    auto interval = parse_duration_ms(env("FRAGCTL_REPORT_INTERVAL"));
    if (!interval.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("FRAGCTL_REPORT_INTERVAL: {}", util::to_std(interval.status().message())));
    }
    parsed->report_interval_ms = *interval;
  }
  return parsed;
}

}  // namespace fragctl
