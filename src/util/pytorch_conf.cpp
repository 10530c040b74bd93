#include "util/pytorch_conf.hpp"

#include <cstdint>
#include <vector>

#include "fmt/format.h"
#include "util/strings.hpp"

namespace fragctl::util {
namespace {

absl::StatusOr<bool> pytorch_bool(std::string_view v) {
  const std::string t = lower(trim(v));
  if (t == "true" || t == "1") return true;
  if (t == "false" || t == "0") return false;
  return absl::InvalidArgumentError(fmt::format("\"{}\" is not True or False", v));
}

absl::StatusOr<std::string> max_split_size_mb(config& c, std::string_view v) {
  std::uint64_t mib = 0;
  if (!parse_u64(trim(v), mib) || mib == 0 || mib > (SIZE_MAX >> 20)) {
    return absl::InvalidArgumentError(fmt::format(
        "bad value \"{}\" for max_split_size_mb: expected a whole number of MiB (PyTorch's _mb is 2^20 bytes)", v));
  }
  c.max_split_size = static_cast<std::size_t>(mib) << 20;
  return fmt::format("max_split_size:{}MiB", mib);
}

// expandable_segments grows one virtual range by mapping pages: the arena.
absl::StatusOr<std::string> expandable_segments(config& c, std::string_view v) {
  auto on = pytorch_bool(v);
  if (!on.ok()) return absl::InvalidArgumentError(fmt::format("expandable_segments: {}", to_std(on.status().message())));
  const char* wanted = *on ? "arena" : "caching";
  if (c.policy.empty()) {
    c.policy = wanted;
  } else if (*on != (c.policy.find("arena") != std::string::npos)) {
    return absl::InvalidArgumentError(
        fmt::format("expandable_segments:{} asks for the {} policy, but FRAGCTL_POLICY is \"{}\"; drop one of them",
                    v, wanted, c.policy));
  }
  // The program may still name a policy of its own (enable("caching"),
  // fragctl_create): this one holds only where none is named.
  return fmt::format("policy {} where the program names none", c.policy);
}

absl::StatusOr<std::string> no_equivalent(std::string_view key, std::string_view instead) {
  return absl::InvalidArgumentError(
      fmt::format("{} is PyTorch's key, and fragctl has no option of the same meaning: {}", key, instead));
}

}  // namespace

std::vector<std::string_view> pytorch_conf_items(std::string_view conf) {
  std::vector<std::string_view> items;
  std::size_t start = 0;
  int depth = 0;
  for (std::size_t i = 0; i <= conf.size(); ++i) {
    if (i < conf.size() && conf[i] == '[') ++depth;
    if (i < conf.size() && conf[i] == ']' && depth > 0) --depth;
    if (i < conf.size() && (conf[i] != ',' || depth > 0)) continue;
    if (const std::string_view item = trim(conf.substr(start, i - start)); !item.empty()) items.push_back(item);
    start = i + 1;
  }
  return items;
}

std::optional<absl::StatusOr<std::string>> apply_pytorch_key(config& c, std::string_view key,
                                                             std::string_view value) {
  if (key == "max_split_size_mb") return max_split_size_mb(c, value);
  if (key == "expandable_segments") return expandable_segments(c, value);
  if (key == "roundup_power2_divisions") {
    return no_equivalent(key,
                         "the caching policy rounds to 512 bytes and segments to segment_round; for size classes "
                         "(4 per doubling) use FRAGCTL_POLICY=buckets:arena, whose limit is buckets_limit");
  }
  if (key == "garbage_collection_threshold") {
    return no_equivalent(key,
                         "fragctl frees cached memory on out-of-memory (release_on_oom, caching) or keeps at most "
                         "release_threshold bytes mapped (arena); the arena policy holds little cache to collect");
  }
  if (key == "backend") {
    return no_equivalent(key,
                         "it chooses PyTorch's allocator; put it in PYTORCH_CUDA_ALLOC_CONF "
                         "(backend:cudaMallocAsync for LD_PRELOAD), and fragctl's device backend in FRAGCTL_BACKEND");
  }
  if (key == "release_lock_on_cudamalloc" || key == "pinned_use_cuda_host_register" ||
      key == "pinned_num_register_threads" || key == "pinned_use_background_threads") {
    return no_equivalent(key, "it tunes PyTorch's own allocator; leave it in PYTORCH_CUDA_ALLOC_CONF");
  }
  return std::nullopt;
}

pytorch_key_owner owner_of_pytorch_key(std::string_view key) {
  if (key == "max_split_size_mb" || key == "expandable_segments") return pytorch_key_owner::fragctl;
  config scratch;
  if (key.starts_with("pinned_") || !apply_pytorch_key(scratch, key, {})) return pytorch_key_owner::pytorch;
  return pytorch_key_owner::device_allocator;
}

absl::StatusOr<pytorch_conf_result> apply_pytorch_conf(std::string_view conf, config base) {
  std::vector<std::string> mapped;
  std::vector<std::string> left;
  for (const std::string_view item : pytorch_conf_items(conf)) {
    const std::size_t colon = item.find(':');
    const std::string_view key = trim(item.substr(0, colon));
    const std::string_view value = colon == std::string_view::npos ? std::string_view() : trim(item.substr(colon + 1));
    config trial = base;
    auto applied = apply_pytorch_key(trial, key, value);
    if (applied && applied->ok()) {
      mapped.push_back(fmt::format("{} -> {}", item, **applied));
      base = std::move(trial);
    } else if (owner_of_pytorch_key(key) == pytorch_key_owner::fragctl) {
      return absl::InvalidArgumentError(
          fmt::format("PYTORCH_CUDA_ALLOC_CONF: {}", to_std(applied->status().message())));
    } else {
      left.emplace_back(item);
    }
  }
  std::string summary = mapped.empty() ? "mapped nothing" : fmt::format("mapped {}", fmt::join(mapped, ", "));
  if (!left.empty()) summary += fmt::format("; left to PyTorch: {}", fmt::join(left, ", "));
  return pytorch_conf_result{std::move(base), std::move(summary), !mapped.empty()};
}

}  // namespace fragctl::util
