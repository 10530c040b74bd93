// Command-line options the benchmark programs share (STYLE.md habit 9):
// `--policy=NAME` picks policies (a comma-separated list of policy
// expressions, or `all`; no flag runs all), `--backend=sim|cuda|hip|auto`
// picks the backend, `--conf=key:value,...` sets FRAGCTL_CONF options.
//
// Programs built on Google Benchmark call parse_bench_options on what
// benchmark::Initialize left in argv; every other program passes its own
// extra flag names, which come back in `extra`.
#pragma once

#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "fragctl/config.hpp"

namespace fragctl::bench {

struct bench_options {
  /// Policies to run, in order: expressions from --policy, or every
  /// expression of replay_policy_set() plus `pseudo_policies` without it.
  std::vector<std::string> policies;
  /// True when --policy was absent or `all`.
  bool all_policies = true;
  /// Base configuration: defaults, then --conf, then --backend.
  config cfg;
  /// Values of the program's own flags, by name without dashes.
  std::map<std::string, std::string, std::less<>> extra;
};

/// Parses argv[1..argc) (each "--name=value" or "--name value"). Accepts
/// --policy, --backend, --conf and the names in `extra_flags`; anything else
/// is an error naming the argument. `pseudo_policies` are names the program
/// runs besides policy expressions (e.g. "cudaMalloc"); they are accepted in
/// --policy and appended to `all`. `base` is the configuration the options
/// apply to (a program's own defaults, e.g. a larger sim_capacity).
[[nodiscard]] absl::StatusOr<bench_options> parse_bench_options(
    int argc, char** argv, const std::set<std::string, std::less<>>& extra_flags = {},
    const std::vector<std::string>& pseudo_policies = {}, config base = {});

/// The value of the program's own flag `name`, or `fallback` when absent.
[[nodiscard]] std::string extra_flag(const bench_options& o, std::string_view name, std::string fallback);

}  // namespace fragctl::bench
