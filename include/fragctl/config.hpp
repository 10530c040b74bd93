// Configuration: FRAGCTL_POLICY, FRAGCTL_BACKEND and FRAGCTL_CONF parsed once
// into one typed struct (DESIGN.md, "Configuration"; docs/configuration.md
// has a row per option). Policies take this struct and never call getenv.
//
// Two tables hold every option once: config_options() (the FRAGCTL_CONF
// keys) and environment_variables() (every variable fragctl reads). Each
// default lives only in the struct below; the tables show it by formatting a
// default-constructed config.
//
// FRAGCTL_CONF is "key:value,key:value". Sizes accept a plain byte count or a
// number with a unit: B, KiB, MiB, GiB, TiB (also KB/MB/GB/TB as powers of
// 1000, and k/K, m/M, g/G shorthands as powers of 1024). Booleans accept
// true/false/1/0/yes/no/on/off. An unknown key or a bad value is an error
// naming the key and what it accepts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "fragctl/types.hpp"

namespace fragctl {

enum class warmup_exhausted : std::uint8_t { grow, fail };

/// The logger's level until FRAGCTL_LOG_LEVEL or a configuration names one
/// (config::log_level is empty by default: it then leaves the level as it is).
inline constexpr std::string_view default_log_level = "warn";

struct config {
  // Selection (FRAGCTL_POLICY, FRAGCTL_BACKEND).
  std::string policy;  ///< policy expression; empty means the default for the backend
  backend_kind backend = backend_kind::automatic;
  int device = 0;

  // sim backend.
  std::size_t sim_capacity = 80 * GiB;
  std::size_t sim_granularity = 2 * MiB;
  bool sim_backed = false;
  bool sim_virtual_memory = true;
  int sim_devices = 1;
  std::size_t sim_context = 0;          ///< sim_options::context_bytes
  std::size_t sim_other_processes = 0;  ///< sim_options::other_process_bytes

  // caching policy (PyTorch-class defaults).
  std::size_t small_size = 1 * MiB;           ///< requests up to this go to the small pool
  std::size_t small_segment = 2 * MiB;        ///< segment size of the small pool
  std::size_t large_segment = 20 * MiB;       ///< segment size for mid-size requests
  std::size_t large_segment_limit = 10 * MiB; ///< requests below this share large_segment segments
  std::size_t segment_round = 2 * MiB;        ///< rounding of segments for bigger requests
  std::size_t max_split_size = SIZE_MAX;      ///< blocks at least this big are never split
  bool release_on_oom = true;                 ///< free unused cached segments and retry once

  // arena policy.
  std::size_t arena_size = 0;                 ///< virtual range to reserve; 0 = device total
  std::size_t release_threshold = 0;          ///< free mapped bytes kept instead of unmapped
  /// Allocator calls (allocations plus frees: a count, not a time) a free span
  /// beyond the threshold stays mapped; FRAGCTL_CONF key release_delay or
  /// release_delay_calls.
  std::size_t release_delay = std::size_t{1} << 20;
  std::size_t map_chunk = 16 * MiB;           ///< largest physical handle (span) the arena maps
  bool wait_before_growing = true;            ///< above the high-water mark, wait for pending frees before creating
  bool step_plan = true;                      ///< learn a repeating step and serve it from a planned layout
  bool lifetime_placement = true;             ///< blocks of sizes that lived long go next to long-lived blocks
  std::size_t fallback_size = 0;              ///< pre-reserved block without VM; 0 = 90% of free

  // buckets policy.
  std::size_t buckets_limit = 1 * MiB;        ///< largest size served from size classes
  std::size_t slab_size = 2 * MiB;            ///< slab carved into slots
  std::size_t slab_reserve = 4;               ///< empty slabs kept per class before returning them

  // warmup policy.
  std::size_t warmup_bytes = 0;               ///< bytes to pre-reserve
  std::string warmup_profile;                 ///< JSON report of a previous run
  warmup_exhausted warmup_on_exhausted = warmup_exhausted::grow;

  // adaptors.
  std::size_t limit = 0;                      ///< byte cap on allocated bytes (requests at their rounded size); 0 = none
  bool thread_safe = true;                    ///< wrap the allocator in a lock
  bool block_table = false;                   ///< keep the live-block table (block_info by pointer)

  // Outputs (FRAGCTL_REPORT, FRAGCTL_TRACE, FRAGCTL_LOG_LEVEL,
  // FRAGCTL_REPORT_INTERVAL, FRAGCTL_PROMETHEUS).
  std::string report_path;
  std::string prometheus_path;          ///< Prometheus text file for a node exporter's textfile collector
  std::uint64_t report_interval_ms = 0; ///< rewrite the report and Prometheus files this often; 0 = off
  bool report_map = true;               ///< put each allocator's memory map into the JSON report
  std::string trace_path;
  /// The logger's level (FRAGCTL_LOG_LEVEL), applied when an allocator is
  /// built; empty leaves it as it is (as FRAGCTL_LOG_LEVEL set it when the
  /// library loaded, else default_log_level). The logger is the process's:
  /// an allocator made from options alone (fragctl_create, a replay) must
  /// not reset it.
  std::string log_level;

  /// The FRAGCTL_CONF keys parse_config set, in order: an allocator stack
  /// warns about each that does not apply to the policy it builds.
  std::vector<std::string> options_set;

  bool operator==(const config&) const = default;
};

/// One documented option: a FRAGCTL_CONF key (and the same shape for the
/// ZeRO-3 options, zero3::option_row).
struct option_info {
  std::string_view key;
  std::string_view type;      ///< "size", "bool", "int", "string", "duration" or "enum: a|b"
  std::string default_value;  ///< the default-constructed struct's value as the parser reads it,
                              ///< then what 0 means where it is special: "0 (device total)"
  std::string_view help;
};

/// Every FRAGCTL_CONF key, in documentation order. Thread-safe.
[[nodiscard]] const std::vector<option_info>& config_options();

/// The value of option `key` in `c`, written as parse_config reads it back
/// ("32MiB", "true", "unlimited"). Throws invalid_argument for an unknown key.
[[nodiscard]] std::string option_value(const config& c, std::string_view key);

/// One environment variable fragctl reads (docs/configuration.md has a row
/// per variable, `fragctl --help` lists them).
struct environment_variable {
  std::string_view name;
  std::string_view value;     ///< what it takes: "file path", "duration"
  std::string default_value;  ///< the default config's value (empty where unset means "none")
  std::string_view help;
  std::string_view read_by;  ///< "config_from_environment", or the reader outside it
};

/// Every environment variable of the library, the zero3 service and the
/// Python package, config_from_environment's in the order it applies them.
/// Thread-safe.
[[nodiscard]] const std::vector<environment_variable>& environment_variables();

/// The value of `name` in the environment, nullopt when it is unset. Every
/// getenv of fragctl goes through here, so each variable read is a row of
/// environment_variables(); throws invalid_argument for a name that is not.
/// Logs nothing (the logger reads FRAGCTL_LOG_LEVEL through it).
[[nodiscard]] std::optional<std::string_view> environment_value(std::string_view name);

/// Applies "key:value,key:value" on top of `base`. Errors name the key and
/// what it accepts; `base` is untouched on error. PyTorch's allocator keys
/// are understood where fragctl has the same meaning (max_split_size_mb,
/// expandable_segments); PyTorch's others are errors naming what to use.
[[nodiscard]] absl::StatusOr<config> parse_config(std::string_view conf, config base = {});

/// Parses a size: "4096", "512MiB", "2GiB", "1.5GiB". A positive value below
/// one byte ("0.4B") is an error, not 0.
[[nodiscard]] absl::StatusOr<std::size_t> parse_size(std::string_view text);

/// Parses a duration into milliseconds: "10s", "500ms", "2m", "1h", or a
/// plain number of seconds ("10", "0.5"). A positive value below 1 ms is an
/// error (it would round to 0, which means off).
[[nodiscard]] absl::StatusOr<std::uint64_t> parse_duration_ms(std::string_view text);

/// Writes a size exactly, as parse_size reads it back: the shortest of a
/// plain byte count, a binary unit and a decimal one ("80GiB", "100MB", "512").
[[nodiscard]] std::string format_size(std::size_t bytes);

/// Parses "cuda", "hip", "sim" or "auto".
[[nodiscard]] absl::StatusOr<backend_kind> parse_backend_kind(std::string_view text);

/// "cuda", "hip", "sim" or "auto": what parse_backend_kind reads back.
[[nodiscard]] std::string_view backend_kind_name(backend_kind kind) noexcept;

/// Applies the rows of environment_variables() read by it (FRAGCTL_POLICY,
/// FRAGCTL_BACKEND, FRAGCTL_CONF, FRAGCTL_REPORT, ...) to a default config,
/// in table order; an empty variable counts as unset. Errors name the
/// variable and key. When FRAGCTL_CONF is unset, PYTORCH_CUDA_ALLOC_CONF's
/// keys that have a fragctl meaning are applied instead
/// (src/util/pytorch_conf.hpp), with one warning log line saying what was
/// mapped and what was left to PyTorch. Warns once per process about a
/// FRAGCTL_* variable within three edits of a row's name (a misspelling).
[[nodiscard]] absl::StatusOr<config> config_from_environment();

}  // namespace fragctl
