// The policy registry: FRAGCTL_POLICY expressions, resolved and built
// (allocator_stack.cpp puts the configured adaptors around the chain).
//
// Adding a policy is one include and one row of `registry()`: a base policy
// is constructed from (config, device_backend&), a wrapper from (config,
// unique_ptr<device_allocator> upstream); `row<P>` tells them apart through
// the allocator_policy concept. A wrapper that needs the policies below it
// configured differently (warmup keeps the arena from unmapping what it
// pre-fills) gives its row a function mapping its config to theirs.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "fragctl/error.hpp"
#include "fragctl/log.hpp"
#include "fragctl/policy.hpp"
#include "util/strings.hpp"

#include "allocator_policies/arena/arena_policy.hpp"
#include "allocator_policies/buckets/buckets_policy.hpp"
#include "allocator_policies/caching/caching_policy.hpp"
#include "allocator_policies/graph_pool/graph_pool_policy.hpp"
#include "allocator_policies/registry.hpp"
#include "allocator_policies/warmup/warmup_policy.hpp"

namespace fragctl {

namespace {

using base_factory = std::unique_ptr<device_allocator> (*)(const config&, device_backend&);
using wrapper_factory = std::unique_ptr<device_allocator> (*)(const config&, std::unique_ptr<device_allocator>);

using upstream_config_fn = config (*)(const config&);

struct registered_policy {
  policy_info info;
  base_factory make_base = nullptr;            // set for base policies
  wrapper_factory make_wrapper = nullptr;      // set for wrappers
  upstream_config_fn upstream_config = nullptr;  // optional: config of the policies below
  bool listed = true;                          // false: a pool kind, left out of policies()
};

template <allocator_policy P>
registered_policy row(std::string_view help, upstream_config_fn upstream_config = nullptr) {
  if constexpr (std::constructible_from<P, const config&, device_backend&>) {
    return {{P::policy_name, false, help},
            [](const config& cfg, device_backend& backend) -> std::unique_ptr<device_allocator> {
              return std::make_unique<P>(cfg, backend);
            },
            nullptr, upstream_config};
  } else {
    return {{P::policy_name, true, help},
            nullptr,
            [](const config& cfg, std::unique_ptr<device_allocator> upstream) -> std::unique_ptr<device_allocator> {
              return std::make_unique<P>(cfg, std::move(upstream));
            },
            upstream_config};
  }
}

// A pool kind: built on request (fragctl_create), not offered as a process's
// policy by policies() (a graph pool never gives memory back).
registered_policy pool_kind(registered_policy p) {
  p.listed = false;
  return p;
}

const std::vector<registered_policy>& registry() {
  static const std::vector<registered_policy> table = {
      row<caching_policy>("best-fit caching over per-stream segments (PyTorch-class baseline)"),
      row<arena_policy>("one virtual range per device, granules mapped on demand (page stitching)"),
      row<buckets_policy>("size-class slabs for small requests; larger ones go upstream"),
      row<warmup_policy>("pre-reserves what a byte count or a previous run's report says", &warmup_upstream_config),
      pool_kind(row<graph_pool_policy>("a CUDA graph's private pool: freed blocks stay in the pool for later captures",
                                       &graph_pool_upstream_config)),
  };
  return table;
}

const registered_policy* find(std::string_view name) {
  for (const registered_policy& p : registry()) {
    if (p.info.name == name) return &p;
  }
  return nullptr;
}

std::string accepted_names() {
  std::vector<std::string> names;
  for (const registered_policy& p : registry()) {
    names.push_back(fmt::format("{} ({})", p.info.name, p.info.wraps_upstream ? "wrapper" : "base"));
  }
  return fmt::format("{}", fmt::join(names, ", "));
}

// The policies of an expression, outermost first, ending in a base when one
// is named. Errors say which part is wrong and what is accepted.
absl::StatusOr<std::vector<const registered_policy*>> parse_expression(std::string_view expression) {
  std::vector<const registered_policy*> chain;
  const std::vector<std::string_view> parts = util::split(expression, ':');
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const std::string_view name = util::trim(parts[i]);
    if (name.empty()) {
      return absl::InvalidArgumentError(fmt::format(
          "policy \"{}\": empty name at position {}; accepted: {}", expression, i + 1, accepted_names()));
    }
    const registered_policy* p = find(name);
    if (p == nullptr) {
      return absl::InvalidArgumentError(
          fmt::format("policy \"{}\": unknown policy \"{}\"; accepted: {}", expression, name, accepted_names()));
    }
    chain.push_back(p);
  }
  for (std::size_t i = 0; i + 1 < chain.size(); ++i) {
    if (chain[i]->info.wraps_upstream) continue;
    return absl::InvalidArgumentError(fmt::format(
        "policy \"{}\": base policy \"{}\" must come last (wrappers from the outside in, then at most "
        "one base, e.g. \"warmup:{}\")",
        expression, chain[i]->info.name, chain[i]->info.name));
  }
  return chain;
}

// The expression with the default filled in: empty means the default policy,
// a trailing wrapper gets the default base.
std::vector<const registered_policy*> resolve(std::string_view expression, const device_backend& backend) {
  const std::string fallback = default_policy(backend);
  auto chain = parse_expression(util::trim(expression).empty() ? std::string_view(fallback) : expression);
  if (!chain.ok()) throw invalid_argument(std::string(util::to_std(chain.status().message())));
  if (chain->back()->info.wraps_upstream) {
    const registered_policy* base = find(fallback);
    if (base == nullptr) throw invalid_argument(fmt::format("default base policy \"{}\" is not built in", fallback));
    chain->push_back(base);
  }
  return *std::move(chain);
}

std::string expression_of(const std::vector<const registered_policy*>& chain) {
  std::vector<std::string_view> names;
  for (const registered_policy* p : chain) names.push_back(p->info.name);
  return fmt::format("{}", fmt::join(names, ":"));
}

// Builds from the base up; level i is configured by the upstream_config
// functions of the levels above it, applied from the outside in.
std::unique_ptr<device_allocator> build(const std::vector<const registered_policy*>& chain, const config& cfg,
                                        device_backend& backend) {
  std::vector<config> configs{cfg};
  for (std::size_t i = 0; i + 1 < chain.size(); ++i) {
    configs.push_back(chain[i]->upstream_config != nullptr ? chain[i]->upstream_config(configs[i]) : configs[i]);
  }
  std::unique_ptr<device_allocator> top = chain.back()->make_base(configs.back(), backend);
  for (std::size_t i = chain.size() - 1; i-- > 0;) top = chain[i]->make_wrapper(configs[i], std::move(top));
  return top;
}

// One warning per FRAGCTL_CONF key set that belongs to a policy (its help
// text in config_options() starts with the policy's name) when no policy of
// `chain` uses it (the owner, or one the help names as "name:"): such an
// option is ignored, and usually a mistake (max_split_size under arena).
void warn_inapplicable_options(const config& cfg, const std::vector<const registered_policy*>& chain) {
  for (const std::string& key : cfg.options_set) {
    for (const option_info& o : config_options()) {
      if (o.key != key) continue;
      const std::string_view owner = o.help.substr(0, o.help.find_first_of(" :"));
      const bool is_policy = find(owner) != nullptr;
      const bool in_chain = std::any_of(chain.begin(), chain.end(), [&](const registered_policy* p) {
        return p->info.name == owner || o.help.find(fmt::format("{}:", p->info.name)) != std::string_view::npos;
      });
      if (is_policy && !in_chain) {
        logger().warn("FRAGCTL_CONF: {} is an option of the {} policy, which policy {} does not use; ignored", key,
                      owner, expression_of(chain));
      }
    }
  }
}

}  // namespace

const std::vector<policy_info>& policies() {
  static const std::vector<policy_info> infos = [] {
    std::vector<policy_info> v;
    for (const registered_policy& p : registry()) {
      if (p.listed) v.push_back(p.info);
    }
    return v;
  }();
  return infos;
}

const std::vector<std::string>& documented_compositions() {
  static const std::vector<std::string> expressions = [] {
    std::vector<std::string> v;
    for (const char* e : {"caching", "arena", "buckets:caching", "buckets:arena", "warmup:arena",
                          "warmup:buckets:arena"}) {
      if (validate_policy(e).ok()) v.emplace_back(e);
    }
    return v;
  }();
  return expressions;
}

std::string default_policy(const device_backend& backend) {
  if (backend.supports_virtual_memory() && find("arena") != nullptr) return "arena";
  return "caching";
}

absl::Status validate_policy(std::string_view expression) {
  if (util::trim(expression).empty()) return absl::OkStatus();
  return parse_expression(expression).status();
}

std::unique_ptr<device_allocator> make_policy(std::string_view expression, const config& cfg,
                                              device_backend& backend) {
  return build(resolve(expression, backend), cfg, backend);
}

std::unique_ptr<device_allocator> build_configured_policy(config& cfg, device_backend& backend) {
  const auto chain = resolve(cfg.policy, backend);
  cfg.policy = expression_of(chain);
  warn_inapplicable_options(cfg, chain);
  return build(chain, cfg, backend);
}

}  // namespace fragctl
