#include "bench_options.hpp"

#include <algorithm>

#include "fmt/format.h"
#include "fragctl/policy.hpp"
#include "fragctl/replay.hpp"
#include "util/strings.hpp"

namespace fragctl::bench {

namespace {

absl::Status usage(std::string message) { return absl::InvalidArgumentError(std::move(message)); }

absl::StatusOr<std::vector<std::string>> policy_list(std::string_view given,
                                                     const std::vector<std::string>& pseudo) {
  std::vector<std::string> all = replay_policy_set();
  all.insert(all.end(), pseudo.begin(), pseudo.end());
  if (given == "all") return all;
  std::vector<std::string> list;
  for (const std::string_view piece : util::split(given, ',')) {
    const std::string name(util::trim(piece));
    if (name.empty()) return usage("--policy: empty policy name");
    if (std::find(pseudo.begin(), pseudo.end(), name) == pseudo.end()) {
      if (const absl::Status s = validate_policy(name); !s.ok())
        return usage(fmt::format("--policy: {}", std::string(util::to_std(s.message()))));
    }
    list.push_back(name);
  }
  return list;
}

}  // namespace

absl::StatusOr<bench_options> parse_bench_options(int argc, char** argv,
                                                  const std::set<std::string, std::less<>>& extra_flags,
                                                  const std::vector<std::string>& pseudo_policies,
                                                  config base) {
  std::map<std::string, std::string, std::less<>> values;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.substr(0, 2) != "--") return usage(fmt::format("unexpected argument '{}'", arg));
    std::string_view name = arg.substr(2);
    std::string value;
    if (const auto eq = name.find('='); eq != std::string_view::npos) {
      value = std::string(name.substr(eq + 1));
      name = name.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return usage(fmt::format("--{} needs a value", name));
    }
    const bool known = name == "policy" || name == "backend" || name == "conf" || extra_flags.contains(name);
    if (!known) return usage(fmt::format("unknown option '--{}'", name));
    if (!values.emplace(std::string(name), std::move(value)).second)
      return usage(fmt::format("--{} given twice", name));
  }

  bench_options out;
  out.cfg = std::move(base);
  if (const auto it = values.find("conf"); it != values.end()) {
    auto parsed = parse_config(it->second, out.cfg);
    if (!parsed.ok()) return usage(fmt::format("--conf: {}", std::string(util::to_std(parsed.status().message()))));
    out.cfg = *std::move(parsed);
  }
  if (const auto it = values.find("backend"); it != values.end()) {
    auto kind = parse_backend_kind(it->second);
    if (!kind.ok()) return usage(fmt::format("--backend: {}", std::string(util::to_std(kind.status().message()))));
    out.cfg.backend = *kind;
  }
  const auto policy = values.find("policy");
  auto policies = policy_list(policy == values.end() ? std::string_view("all") : std::string_view(policy->second),
                              pseudo_policies);
  if (!policies.ok()) return policies.status();
  out.policies = *std::move(policies);
  out.all_policies = policy == values.end() || policy->second == "all";
  for (auto& [name, value] : values) {
    if (name != "policy" && name != "backend" && name != "conf") out.extra.emplace(name, value);
  }
  return out;
}

std::string extra_flag(const bench_options& o, std::string_view name, std::string fallback) {
  const auto it = o.extra.find(name);
  return it == o.extra.end() ? std::move(fallback) : it->second;
}

}  // namespace fragctl::bench
