// The policy expressions every reliability check runs over: each policy and
// each documented composition (docs/policies/*.md), with and without virtual
// memory where the arena changes shape without it (its fallback block).
#pragma once

#include <array>
#include <ostream>
#include <string_view>

namespace fragctl::fuzz {

struct policy_case {
  std::string_view name;        ///< test-name-safe label
  std::string_view expression;  ///< FRAGCTL_POLICY
  std::string_view conf;        ///< FRAGCTL_CONF applied on top of the defaults
  bool virtual_memory = true;   ///< whether the sim offers the VM calls
};

/// How GoogleTest prints a case in a failure message.
inline void PrintTo(const policy_case& c, std::ostream* out) {
  *out << c.expression << (c.virtual_memory ? "" : " (no virtual memory)") << (c.conf.empty() ? "" : " with ")
       << c.conf;
}

inline constexpr std::array policy_cases = {
    policy_case{"caching", "caching", "", true},
    policy_case{"arena", "arena", "", true},
    policy_case{"arena_fallback", "arena", "", false},
    policy_case{"buckets_caching", "buckets:caching", "", true},
    policy_case{"buckets_arena", "buckets:arena", "", true},
    policy_case{"buckets_arena_fallback", "buckets:arena", "", false},
    policy_case{"warmup_caching", "warmup:caching", "warmup_bytes:48MiB", true},
    policy_case{"warmup_arena", "warmup:arena", "warmup_bytes:48MiB", true},
    policy_case{"warmup_buckets_arena", "warmup:buckets:arena", "warmup_bytes:48MiB", true},
};

}  // namespace fragctl::fuzz
