// Policies and how they compose (DESIGN.md, "The four policies").
//
// A policy is a device_allocator in allocator_policies/<name>/ that satisfies
// `allocator_policy`. Base policies get memory from the backend (`caching`,
// `arena`); wrapper policies get it from an upstream allocator (`buckets`,
// `warmup`). A policy expression names wrappers from the outside in, then at
// most one base: "warmup:buckets:arena" is warmup over buckets over arena. An
// expression that ends in a wrapper gets the default base. The default
// expression is "arena" where the backend has virtual memory, else "caching".
#pragma once

#include <concepts>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "fragctl/adaptors.hpp"
#include "fragctl/backend.hpp"
#include "fragctl/config.hpp"
#include "fragctl/device_allocator.hpp"
#include "fragctl/report.hpp"
#include "fragctl/stats.hpp"

namespace fragctl {

/// What every policy class provides: it is a device_allocator, constructible
/// from the configuration (a base policy from the backend, a wrapper from its
/// upstream), and names itself with a constant usable in FRAGCTL_POLICY.
template <class P>
concept allocator_policy =
    std::derived_from<P, device_allocator> && !std::is_abstract_v<P> && requires {
      { P::policy_name } -> std::convertible_to<std::string_view>;
    } && (std::constructible_from<P, const config&, device_backend&> ||
          std::constructible_from<P, const config&, std::unique_ptr<device_allocator>>);

/// One registered policy.
struct policy_info {
  std::string_view name;
  bool wraps_upstream;    ///< true for wrappers (buckets, warmup)
  std::string_view help;  ///< one line for --help and docs
};

/// Every policy FRAGCTL_POLICY accepts.
[[nodiscard]] const std::vector<policy_info>& policies();

/// The expressions the documentation recommends and the conformance suite
/// covers, base policies first: "caching", "arena", "buckets:caching",
/// "buckets:arena", "warmup:arena", "warmup:buckets:arena" (those whose
/// policies are registered). `fragctl replay --policy all` replays these.
[[nodiscard]] const std::vector<std::string>& documented_compositions();

/// The default policy expression for a backend ("arena" with virtual memory,
/// else "caching").
[[nodiscard]] std::string default_policy(const device_backend& backend);

/// Checks a policy expression; errors name the unknown or misplaced part and
/// list what is accepted.
[[nodiscard]] absl::Status validate_policy(std::string_view expression);

/// Builds the bare policy chain of `expression` on `backend` (no adaptors).
/// Empty expression means default_policy(backend). Throws invalid_argument
/// for a bad expression.
[[nodiscard]] std::unique_ptr<device_allocator> make_policy(std::string_view expression,
                                                            const config& cfg,
                                                            device_backend& backend);

/// An allocator ready for use: the backend it owns, the policy chain, and
/// the adaptors the configuration asks for, from the outside in:
/// thread_safe (if cfg.thread_safe) > tracing (if cfg.trace_path) >
/// statistics > stream_use (record_stream) > limiting (cfg.limit, or none
/// until set_limit) > policy.
///
/// Construction applies cfg.log_level (set_log_level) and throws
/// invalid_argument for an unknown level or a bad policy expression. With
/// cfg.report_path or cfg.prometheus_path set, the stack joins the
/// FRAGCTL_REPORT registry (fragctl/report.hpp): its statistics (and, with
/// cfg.report_map, its memory map) are written there on SIGUSR1, at exit,
/// when it is destroyed, and every cfg.report_interval_ms.
class allocator_stack {
 public:
  allocator_stack(std::unique_ptr<device_backend> backend, const config& cfg);
  ~allocator_stack();

  /// The outermost allocator: use this one.
  [[nodiscard]] device_allocator& allocator() noexcept { return *top_; }
  [[nodiscard]] device_backend& backend() noexcept { return *backend_; }
  /// The configuration the stack was built with; its `policy` is the
  /// expression actually built, defaults filled in ("buckets:caching").
  [[nodiscard]] const config& configuration() const noexcept { return cfg_; }
  /// Caps the bytes the stack hands out (after rounding) at `bytes`; 0
  /// removes the cap. From any thread; see limiting_adaptor::set_limit.
  void set_limit(std::size_t bytes) noexcept;
  /// The cap now; 0 for none.
  [[nodiscard]] std::size_t limit() const noexcept;
  /// Starts a new window of resettable peaks (allocator_stats::window_peak).
  void reset_peaks() noexcept;
  /// Statistics of the whole stack, `allocator` set to configuration().policy.
  /// Callable from any thread (the pool state is read through the lock).
  [[nodiscard]] allocator_stats stats() const;
  /// Statistics and, with configuration().report_map, the memory map: what
  /// the stack's JSON report carries for it.
  [[nodiscard]] allocator_report report() const;

 private:
  config cfg_;
  std::unique_ptr<device_backend> backend_;  // declared first: destroyed last
  std::unique_ptr<device_allocator> top_;
  statistics_adaptor* statistics_ = nullptr;
  limiting_adaptor* limiting_ = nullptr;
};

/// Builds the backend cfg names and the stack on it.
[[nodiscard]] std::unique_ptr<allocator_stack> make_allocator(const config& cfg);

}  // namespace fragctl
