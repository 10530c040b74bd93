// FRAGCTL_CONF parsing: one table row per option gives its key, type, help,
// its parser and its formatter, so parser, error messages, defaults and docs
// agree. The environment variables are src/util/environment.cpp.
#include "fragctl/config.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <utility>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "fragctl/error.hpp"
#include "util/config_table.hpp"
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

// No device holds more than 2^62 bytes (the largest request an allocator
// accepts): a larger option value is a mistake, and would overflow the
// rounding arithmetic of the policies that use it.
absl::StatusOr<std::size_t> parse_option_size(std::string_view text) {
  auto bytes = parse_size(text);
  if (bytes.ok() && *bytes > (std::size_t{1} << 62))
    return absl::InvalidArgumentError("expected a size of at most 4 EiB (2^62 bytes)");
  return bytes;
}

absl::StatusOr<std::size_t> parse_count(std::string_view text) {
  std::uint64_t n = 0;
  if (!util::parse_u64(util::trim(text), n)) return absl::InvalidArgumentError("expected an integer >= 0");
  return static_cast<std::size_t>(n);
}

std::string format_bool(bool b) { return b ? "true" : "false"; }

std::string format_duration_ms(std::uint64_t ms) {
  if (ms == 0) return "0";
  return ms % 1000 == 0 ? fmt::format("{}s", ms / 1000) : fmt::format("{}ms", ms);
}

// A row of the options table: the key's one parser and one formatter of a
// config field. The default shown in docs and help is `show(config{})`, so
// the struct's initialiser is the only place a default is written.
struct option_row {
  std::string_view key;
  std::string_view type;
  std::string_view help;
  std::function<absl::Status(config&, std::string_view)> set;
  std::function<std::string(const config&)> show;
  std::string_view zero_means{};  ///< shown after a default of 0: "device total"
};

template <class T, class Parse, class Show>
option_row row(std::string_view key, std::string_view type, T config::*member, Parse parse, Show show,
               std::string_view help, std::string_view zero_means = {}) {
  return {key,
          type,
          help,
          [member, parse](config& c, std::string_view v) -> absl::Status {
            auto parsed = parse(v);
            if (!parsed.ok()) return parsed.status();
            c.*member = static_cast<T>(*parsed);
            return absl::OkStatus();
          },
          [member, show](const config& c) { return std::string(show(c.*member)); },
          zero_means};
}

option_row size_row(std::string_view key, std::size_t config::*m, std::string_view help,
                    std::string_view zero_means = {}) {
  return row(key, "size", m, parse_option_size, format_size, help, zero_means);
}
option_row bool_row(std::string_view key, bool config::*m, std::string_view help) {
  return row(key, "bool", m, parse_bool, format_bool, help);
}
option_row string_row(std::string_view key, std::string config::*m, std::string_view help) {
  return row(
      key, "string", m, [](std::string_view v) -> absl::StatusOr<std::string> { return std::string(v); },
      [](const std::string& v) { return v; }, help);
}
option_row count_row(std::string_view key, std::size_t config::*m, std::string_view help) {
  return row(
      key, "int", m, parse_count, [](std::size_t n) { return fmt::format("{}", n); }, help);
}

constexpr std::string_view release_delay_help =
    "arena: allocator calls (allocations plus frees: a count, not a time) a wholly free span beyond "
    "release_threshold stays mapped before it is unmapped (0 = at once)";

const std::vector<option_row>& rows() {
  static const std::vector<option_row> table = {
      row(
          "device", "int", &config::device,
          [](std::string_view v) -> absl::StatusOr<int> {
            auto d = parse_int(v);
            if (d.ok() && *d < 0) return absl::InvalidArgumentError("expected a device ordinal >= 0");
            return d;
          },
          [](int d) { return fmt::format("{}", d); }, "device ordinal the allocator serves"),
      size_row("sim_capacity", &config::sim_capacity, "sim backend: device memory size"),
      row(
          "sim_granularity", "size", &config::sim_granularity,
          [](std::string_view v) -> absl::StatusOr<std::size_t> {
            auto s = parse_option_size(v);
            if (s.ok() && (*s < 4096 || (*s & (*s - 1)) != 0))
              return absl::InvalidArgumentError("expected a power of two of at least 4KiB");
            return s;
          },
          format_size, "sim backend: physical allocation granularity (power of two)"),
      bool_row("sim_backed", &config::sim_backed, "sim backend: real host memory instead of fake addresses"),
      bool_row("sim_virtual_memory", &config::sim_virtual_memory, "sim backend: offer the virtual memory calls"),
      row(
          "sim_devices", "int", &config::sim_devices,
          [](std::string_view v) -> absl::StatusOr<int> {
            auto d = parse_int(v);
            if (d.ok() && (*d < 1 || *d > 64)) return absl::InvalidArgumentError("expected 1 to 64 devices");
            return d;
          },
          [](int d) { return fmt::format("{}", d); },
          "sim backend: devices in the simulated machine (the others are possible access peers)"),
      size_row("sim_context", &config::sim_context,
               "sim backend: device bytes this process's runtime context holds from the start"),
      size_row("sim_other_processes", &config::sim_other_processes, "sim backend: device bytes other processes hold"),
      size_row("small_size", &config::small_size,
               "caching: requests up to this size use the small pool (warmup: smaller ones are pre-filled apart)"),
      size_row("small_segment", &config::small_segment, "caching: segment size of the small pool"),
      size_row("large_segment", &config::large_segment, "caching: segment size for requests below large_segment_limit"),
      size_row("large_segment_limit", &config::large_segment_limit,
               "caching: requests below this share large_segment segments"),
      size_row("segment_round", &config::segment_round,
               "caching: larger requests get their own segment rounded to this"),
      row(
          "max_split_size", "size", &config::max_split_size,
          [](std::string_view v) -> absl::StatusOr<std::size_t> {
            if (util::lower(v) == "unlimited") return SIZE_MAX;
            auto s = parse_option_size(v);
            if (!s.ok())
              return absl::InvalidArgumentError("expected a size of at most 4 EiB (2^62 bytes) or \"unlimited\"");
            return s;
          },
          [](std::size_t s) { return s == SIZE_MAX ? std::string("unlimited") : format_size(s); },
          "caching: cached blocks this large or larger are never split"),
      bool_row("release_on_oom", &config::release_on_oom,
               "caching: on out-of-memory free unused cached segments and retry once"),
      size_row("arena_size", &config::arena_size, "arena: virtual address range reserved per device", "device total"),
      size_row("release_threshold", &config::release_threshold,
               "arena: free mapped bytes kept mapped instead of unmapped"),
      count_row("release_delay", &config::release_delay, release_delay_help),
      count_row("release_delay_calls", &config::release_delay,
                "arena: release_delay under a name that says its unit: allocator calls, not a time"),
      size_row("map_chunk", &config::map_chunk,
               "arena: largest physical handle (span); growth maps up to this much per driver call (the "
               "granularity or less: one handle per granule)"),
      bool_row("wait_before_growing", &config::wait_before_growing,
               "arena: before creating physical memory above the most held so far while cached spans wait on "
               "pending frees, wait for them and re-stitch the spans (false: create at once)"),
      bool_row("step_plan", &config::step_plan,
               "arena: learn a step that repeats itself and serve it from one planned range mapped once, with "
               "no driver call (false: every block placed by best fit)"),
      bool_row("lifetime_placement", &config::lifetime_placement,
               "arena: a block whose size's last block lived at least 8,000 calls goes next to a long-lived block "
               "where that is mapped, so that long-lived blocks pack together and the holes short-lived ones leave "
               "stay whole (false: best fit for every block)"),
      size_row("fallback_size", &config::fallback_size, "arena without virtual memory: size of the pre-reserved block",
               "90% of free"),
      size_row("buckets_limit", &config::buckets_limit, "buckets: largest request served from size classes"),
      size_row("slab_size", &config::slab_size, "buckets: slab carved into fixed-size slots"),
      row(
          "slab_reserve", "int", &config::slab_reserve,
          [](std::string_view v) -> absl::StatusOr<std::size_t> {
            auto d = parse_int(v);
            if (!d.ok() || *d < 0) return absl::InvalidArgumentError("expected an integer >= 0");
            return static_cast<std::size_t>(*d);
          },
          [](std::size_t n) { return fmt::format("{}", n); },
          "buckets: empty slabs kept per class before returning them upstream"),
      size_row("warmup_bytes", &config::warmup_bytes, "warmup: bytes to pre-reserve at start"),
      string_row("warmup_profile", &config::warmup_profile,
                 "warmup: JSON report of a previous run to size the pre-reservation"),
      row(
          "warmup_on_exhausted", "enum: grow|fail", &config::warmup_on_exhausted,
          [](std::string_view v) -> absl::StatusOr<warmup_exhausted> {
            if (v == "grow") return warmup_exhausted::grow;
            if (v == "fail") return warmup_exhausted::fail;
            return absl::InvalidArgumentError("expected grow or fail");
          },
          [](warmup_exhausted w) { return w == warmup_exhausted::grow ? "grow" : "fail"; },
          "warmup: what to do when the profile was too small"),
      size_row("limit", &config::limit,
               "refuse allocations that would take the bytes allocated (each request at its rounded size) above this",
               "none"),
      bool_row("thread_safe", &config::thread_safe, "serialize calls with a lock (off only for single-threaded use)"),
      bool_row("block_table", &config::block_table,
               "keep each live block's size and stream, so it can be looked up and freed by pointer alone "
               "(fragctl_block_info; the native PyTorch route sets it)"),
      string_row("report", &config::report_path, "same as FRAGCTL_REPORT: write the JSON report here at exit"),
      string_row("trace", &config::trace_path, "same as FRAGCTL_TRACE: record every allocate and free to this CSV"),
      row("report_interval", "duration", &config::report_interval_ms, parse_duration_ms, format_duration_ms,
          "same as FRAGCTL_REPORT_INTERVAL: rewrite the report and Prometheus files this often", "off"),
      string_row("prometheus", &config::prometheus_path, "same as FRAGCTL_PROMETHEUS: write Prometheus text here"),
      bool_row("report_map", &config::report_map, "put each allocator's memory map into the JSON report"),
  };
  return table;
}

const option_row* find_row(std::string_view key) {
  for (const auto& r : rows())
    if (r.key == key) return &r;
  return nullptr;
}

}  // namespace

const std::vector<option_info>& config_options() {
  static const std::vector<option_info> infos = [] {
    const config defaults;
    std::vector<option_info> v;
    for (const auto& r : rows()) {
      std::string shown = r.show(defaults);
      if (shown == "0" && !r.zero_means.empty()) shown += fmt::format(" ({})", r.zero_means);
      v.push_back({r.key, r.type, std::move(shown), r.help});
    }
    return v;
  }();
  return infos;
}

std::string option_value(const config& c, std::string_view key) {
  const option_row* r = find_row(key);
  if (r == nullptr) throw invalid_argument(fmt::format("option_value: no option \"{}\"", key));
  return r->show(c);
}

absl::Status util::set_option(config& c, std::string_view key, std::string_view value) {
  const option_row* r = find_row(key);
  if (r == nullptr) throw invalid_argument(fmt::format("set_option: no option \"{}\"", key));
  return r->set(c, value);
}

std::string format_size(std::size_t bytes) {
  std::string best = fmt::format("{}", bytes);
  if (bytes == 0) return best;
  constexpr std::pair<std::size_t, std::string_view> units[] = {{std::size_t{1} << 40, "TiB"},
                                                                {std::size_t{1} << 30, "GiB"},
                                                                {std::size_t{1} << 20, "MiB"},
                                                                {std::size_t{1} << 10, "KiB"},
                                                                {1'000'000'000'000, "TB"},
                                                                {1'000'000'000, "GB"},
                                                                {1'000'000, "MB"},
                                                                {1'000, "KB"}};
  for (const auto& [unit, name] : units) {
    if (bytes % unit != 0) continue;
    std::string shown = fmt::format("{}{}", bytes / unit, name);
    if (shown.size() < best.size()) best = std::move(shown);
  }
  return best;
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
  if (per_unit == 0 || split == 0 || !util::parse_double(t.substr(0, split), value) || !(value >= 0)) {
    return absl::InvalidArgumentError(
        fmt::format("\"{}\" is not a duration: expected a number with ms, s, m (or min) or h (e.g. 10s)", text));
  }
  if (value * per_unit >= 0x1p63) {  // a duration all the same, just past what a count of ms holds
    return absl::InvalidArgumentError(
        fmt::format("\"{}\" is too long a duration: at most 2^63 ms (about 292 million years)", text));
  }
  const auto ms = static_cast<std::uint64_t>(std::llround(value * per_unit));
  if (ms == 0 && value > 0) {
    return absl::InvalidArgumentError(
        fmt::format("\"{}\" is less than 1 ms, which would round to 0 (off): give 0 for off or at least 1ms", text));
  }
  return ms;
}

std::string_view backend_kind_name(backend_kind kind) noexcept {
  switch (kind) {
    case backend_kind::cuda: return "cuda";
    case backend_kind::hip: return "hip";
    case backend_kind::sim: return "sim";
    case backend_kind::automatic: break;
  }
  return "auto";
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
    const option_row* row = find_row(key);
    if (row == nullptr) {
      if (auto pytorch = util::apply_pytorch_key(base, key, value)) {
        if (!pytorch->ok())
          return absl::InvalidArgumentError(fmt::format("FRAGCTL_CONF: {}", util::to_std(pytorch->status().message())));
        continue;
      }
      std::vector<std::string_view> keys;
      for (const auto& r : rows()) keys.push_back(r.key);
      return absl::InvalidArgumentError(fmt::format("FRAGCTL_CONF: unknown key \"{}\"; known keys: {}",
                                                    key, fmt::join(keys, ", ")));
    }
    if (absl::Status s = row->set(base, value); !s.ok()) {
      return absl::InvalidArgumentError(fmt::format("FRAGCTL_CONF: bad value \"{}\" for {} ({}): {}", value, key,
                                                    row->type, util::to_std(s.message())));
    }
    base.options_set.emplace_back(key);
  }
  return base;
}

}  // namespace fragctl
