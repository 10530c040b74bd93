// The `warmup` policy: profile loading, the pre-fill plan, and watching the
// backend after warm-up. The theory is in warmup_policy.hpp.
#include "allocator_policies/warmup/warmup_policy.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <system_error>
#include <utility>

#include "core/json_io.hpp"
#include "fmt/format.h"
#include "fragctl/backend.hpp"
#include "fragctl/error.hpp"
#include "fragctl/log.hpp"
#include "nlohmann/json.hpp"
#include "util/strings.hpp"

namespace fragctl {

namespace {

using util::human_bytes;

/// Blocks of one size a plan may hold; bytes beyond move to the next bucket
/// up, so a profile of many tiny requests costs thousands of calls, not millions.
constexpr std::size_t max_blocks_per_size = std::size_t{1} << 14;

/// How much more than their share of the traffic requests below the one-block
/// bound get in the pre-fill (plan_warmup).
constexpr double small_share_boost = 2.0;

/// Without a histogram, the share of the target pre-filled as blocks of
/// `one_block_from` bytes for small requests: caching serves those only from
/// its small pool, which one large block never reaches (issue 18).
constexpr std::size_t default_small_share_divisor = 16;

/// Margin on the arena's release_threshold for rounding blocks to granules.
constexpr std::size_t threshold_margin = 32 * MiB;

[[nodiscard]] std::size_t profile_target(const allocator_stats& s) {
  if (s.reserved.peak > 0) return s.reserved.peak;
  if (s.allocated.peak > 0) return s.allocated.peak;
  return s.requested.peak;
}

/// The statistics in `text` for `device`: a single to_json object, or the
/// report entry on that device with the largest peak reserved (any device
/// when none matches).
[[nodiscard]] absl::StatusOr<allocator_stats> stats_for_device(const std::string& text, int device) {
  auto parsed = detail::parse_json(text, "");
  if (!parsed.ok()) return parsed.status();
  const nlohmann::json& doc = *parsed;
  if (!doc.is_object() || !doc.contains("allocators") || !doc["allocators"].is_array() ||
      doc["allocators"].size() <= 1) {
    return stats_from_json(text);
  }
  std::optional<allocator_stats> best;
  bool best_on_device = false;
  for (const nlohmann::json& entry : doc["allocators"]) {
    auto s = stats_from_json(entry.dump());
    if (!s.ok()) return s.status();
    const bool on_device = s->device == device;
    if (!best || (on_device && !best_on_device) ||
        (on_device == best_on_device && profile_target(*s) > profile_target(*best))) {
      best = *std::move(s);
      best_on_device = on_device;
    }
  }
  return *std::move(best);
}

[[nodiscard]] std::size_t plan_total(const std::vector<warmup_block>& plan) {
  std::size_t total = 0;
  for (const warmup_block& b : plan) total += b.bytes * b.count;
  return total;
}

/// The plan without a histogram: 1/default_small_share_divisor of `bytes`
/// (at least one block once `bytes` is twice `small`) in blocks of `small`,
/// the rest one block.
[[nodiscard]] std::vector<warmup_block> default_plan(std::size_t bytes, std::size_t small) {
  small = round_up(std::max(small, min_alignment), min_alignment);
  std::size_t count = bytes / default_small_share_divisor / small;
  if (count == 0 && bytes / 2 >= small) count = 1;
  count = std::min(count, max_blocks_per_size);
  std::vector<warmup_block> plan;
  const std::size_t rest = bytes - count * small;
  if (rest > 0) plan.push_back({round_up(rest, min_alignment), 1});
  if (count > 0) {
    if (!plan.empty() && plan.back().bytes == small) {
      plan.back().count += count;
    } else {
      plan.push_back({small, count});
    }
  }
  return plan;
}

}  // namespace

absl::StatusOr<warmup_profile> load_warmup_profile(const config& cfg) {
  warmup_profile p;
  if (!cfg.warmup_profile.empty()) {
    std::error_code ec;
    if (std::filesystem::is_directory(cfg.warmup_profile, ec)) {
      return absl::InvalidArgumentError(fmt::format(
          "warmup_profile \"{}\" is a directory: name a fragctl report of an earlier run", cfg.warmup_profile));
    }
    std::ifstream in(cfg.warmup_profile, std::ios::binary);
    if (!in) {
      return absl::NotFoundError(
          fmt::format("warmup_profile: cannot open \"{}\"", cfg.warmup_profile));
    }
    std::ostringstream text;
    text << in.rdbuf();
    auto stats = stats_for_device(text.str(), cfg.device);
    if (!stats.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("warmup_profile \"{}\": not a fragctl report or statistics JSON: {}",
                      cfg.warmup_profile, util::to_std(stats.status().message())));
    }
    p.bytes = profile_target(*stats);
    p.size_histogram = stats->size_histogram;
    p.source = cfg.warmup_profile;
  }
  if (cfg.warmup_bytes > 0) {
    p.bytes = cfg.warmup_bytes;
    p.source = p.source.empty() ? "warmup_bytes" : fmt::format("warmup_bytes, shaped by {}", p.source);
  }
  return p;
}

std::vector<warmup_block> plan_warmup(const warmup_profile& profile, std::size_t one_block_from) {
  if (profile.bytes == 0) return {};
  // Bytes each bucket asked for over the run: count x mid-point of [2^i, 2^(i+1)).
  std::array<double, size_histogram_buckets> weight{};
  double total_weight = 0;
  for (std::size_t i = 0; i < size_histogram_buckets; ++i) {
    weight[i] = static_cast<double>(profile.size_histogram[i]) * 1.5 * std::ldexp(1.0, static_cast<int>(i));
    total_weight += weight[i];
  }
  if (total_weight == 0) return default_plan(profile.bytes, one_block_from);
  // Small requests get small_share_boost times their share of the traffic,
  // taken from the one block: long-lived small tensors hold more of the peak
  // than of the traffic.
  double small_weight = 0;
  for (std::size_t i = 0; i < size_histogram_buckets && (std::size_t{1} << i) < one_block_from; ++i) {
    small_weight += weight[i];
  }
  const double small_fraction = std::min(1.0, small_share_boost * small_weight / total_weight);
  const double small_scale = small_weight > 0 ? small_fraction * total_weight / small_weight : 0;
  const double large_scale =
      total_weight > small_weight ? (1 - small_fraction) * total_weight / (total_weight - small_weight) : 0;

  std::map<std::size_t, std::size_t, std::greater<>> blocks;
  double one_block = 0;  // the share of the large buckets, pre-filled as one block
  double carry = 0;      // bytes moved up from a bucket that hit max_blocks_per_size
  for (std::size_t i = 0; i < size_histogram_buckets; ++i) {
    const bool large = (std::size_t{1} << i) >= one_block_from;
    const double share =
        static_cast<double>(profile.bytes) * weight[i] / total_weight * (large ? large_scale : small_scale) + carry;
    carry = 0;
    if (share <= 0) continue;
    if (large) {
      one_block += share;
      continue;
    }
    const std::size_t top = std::size_t{2} << i;  // holds every request of the bucket
    const auto whole = static_cast<std::size_t>(std::llround(share / static_cast<double>(top)));
    if (whole < 4) {
      if (whole > 0) blocks[std::max(top, min_alignment)] += whole;
      continue;
    }
    // Four sizes across the bucket: 1.25, 1.5, 1.75 and 2 times 2^i.
    for (std::size_t j = 1; j <= 4; ++j) {
      const std::size_t size = std::max(((4 + j) << i) / 4, min_alignment);
      auto n = static_cast<std::size_t>(std::llround(share / 4 / static_cast<double>(size)));
      if (n > max_blocks_per_size) {
        carry += static_cast<double>((n - max_blocks_per_size) * size);
        n = max_blocks_per_size;
      }
      blocks[size] += n;
    }
  }
  one_block += carry;
  if (one_block >= 1) blocks[round_up(static_cast<std::size_t>(std::llround(one_block)), min_alignment)] += 1;
  std::vector<warmup_block> plan;
  for (const auto& [bytes, count] : blocks) {
    if (count > 0) plan.push_back({bytes, count});
  }
  return plan;
}

config warmup_upstream_config(const config& cfg) {
  config c = cfg;
  auto profile = load_warmup_profile(cfg);
  if (!profile.ok()) return c;
  const std::size_t total = plan_total(plan_warmup(*profile, cfg.small_size));
  if (total > 0) c.release_threshold = std::max(c.release_threshold, round_up(total, 2 * MiB) + threshold_margin);
  return c;
}

// --- The policy ---------------------------------------------------------------

warmup_policy::warmup_policy(const config& cfg, std::unique_ptr<device_allocator> upstream, stream_t stream)
    : upstream_(std::move(upstream)),
      on_exhausted_(cfg.warmup_on_exhausted),
      one_block_from_(std::max<std::size_t>(cfg.small_size, 1)) {
  if (upstream_ == nullptr) throw invalid_argument("warmup: no upstream policy");
  name_ = fmt::format("warmup:{}", upstream_->name());
  auto profile = load_warmup_profile(cfg);
  if (!profile.ok()) throw invalid_argument(std::string(util::to_std(profile.status().message())));
  profile_ = *std::move(profile);
  warm_up(stream);
}

void warmup_policy::warm_up(stream_t stream) {
  device_backend& backend = upstream_->backend();
  const std::vector<warmup_block> plan = plan_warmup(profile_, one_block_from_);
  if (plan.empty()) {
    const backend_counters now = backend.counters();
    baseline_calls_ = now.memory_calls();
    warm_held_ = now.held_bytes;
    logger().info("{}: nothing to pre-fill (neither warmup_bytes nor warmup_profile is set)", name_);
    return;
  }
  const std::size_t planned = plan_total(plan);
  std::vector<std::pair<void*, std::size_t>> blocks;
  std::size_t count = 0;
  for (const warmup_block& b : plan) count += b.count;
  blocks.reserve(count);
  const auto free_all = [&] {
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) upstream_->deallocate(it->first, it->second, stream);
  };
  try {
    for (const warmup_block& b : plan) {
      for (std::size_t k = 0; k < b.count; ++k) {
        blocks.emplace_back(upstream_->allocate(b.bytes, stream), b.bytes);
        warmed_bytes_ += b.bytes;
      }
    }
  } catch (const out_of_memory& e) {
    const std::string what = fmt::format(
        "{}: the warm-up of {} (from {}) does not fit: {} pre-filled when the upstream ran out",
        name_, human_bytes(planned), profile_.source, human_bytes(warmed_bytes_));
    if (on_exhausted_ == warmup_exhausted::fail) {
      free_all();
      throw out_of_memory(e.details(), what.c_str());
    }
    logger().warn("{}; continuing with that", what);
  } catch (...) {
    free_all();
    throw;
  }
  const std::size_t peak_held = backend.counters().held_bytes;
  free_all();
  const backend_counters after = backend.counters();
  baseline_calls_ = after.memory_calls();
  warm_held_ = after.held_bytes;
  armed_ = true;
  if (warm_held_ < peak_held) {
    logger().warn(
        "{}: the upstream gave {} of the warm-up back to the backend when it was freed, and will "
        "call the backend for it again (warmup over arena needs release_threshold >= {})",
        name_, human_bytes(peak_held - warm_held_), human_bytes(planned));
  }
  logger().info("{}: pre-filled {} in {} blocks ({}); the backend holds {}", name_,
                human_bytes(warmed_bytes_), blocks.size(), profile_.source, human_bytes(warm_held_));
}

std::uint64_t warmup_policy::backend_calls_since_warmup() const noexcept {
  return upstream_->backend().counters().memory_calls() - baseline_calls_;
}

void* warmup_policy::do_allocate(std::size_t bytes, stream_t stream) {
  if (!armed_) return upstream_->allocate(bytes, stream);
  device_backend& backend = upstream_->backend();
  const std::uint64_t before = backend.counters().memory_calls();
  void* p = upstream_->allocate(bytes, stream);
  const backend_counters after = backend.counters();
  if (after.memory_calls() != before) exhausted(p, bytes, stream, after.held_bytes);
  return p;
}

void warmup_policy::exhausted(void* p, std::size_t bytes, stream_t stream, std::size_t held_now) {
  const std::size_t grown = held_now > warm_held_ ? held_now - warm_held_ : 0;
  const pool_state s = upstream_->state();
  // The live bytes (this request included) fit in what the warm-up holds: the
  // pre-fill lacks the shape for this request, not bytes, and a larger
  // warmup_bytes would not help.
  const bool shape = grown > 0 && s.allocated <= warm_held_;
  const std::size_t live_before = s.allocated - std::min(s.allocated, upstream_->allocation_size(bytes));
  if (!shape) shortfall_ = std::max(shortfall_, grown);
  const std::string why =
      shape ? fmt::format("the warm-up holds {} with {} live, enough bytes, but not in a shape that serves a "
                          "request of {} (from {}); give warmup_profile a report of a previous run, whose "
                          "request sizes shape the pre-fill",
                          human_bytes(warm_held_), human_bytes(live_before),
                          human_bytes(bytes), profile_.source)
      : grown > 0
          ? fmt::format("the warm-up profile was too small by {} (target {} from {}, {} "
                        "pre-filled; set warmup_bytes to at least {})",
                        human_bytes(grown), human_bytes(profile_.bytes), profile_.source,
                        human_bytes(warmed_bytes_), human_bytes(suggested_bytes()))
          : fmt::format("the upstream unmapped or returned warm-up memory and needed the backend "
                        "again ({} backend memory calls since warm-up; warm up on the stream that "
                        "uses the memory, and warmup over arena needs release_threshold >= {})",
                        backend_calls_since_warmup(), human_bytes(warmed_bytes_));
  if (on_exhausted_ == warmup_exhausted::fail) {
    upstream_->deallocate(p, bytes, stream);
    oom_details d;
    d.requested = bytes;
    const pool_state after = upstream_->state();
    d.reserved = after.reserved;
    d.cached_free = after.cached_free;
    d.largest_free_block = after.largest_free_block;
    const memory_info device = upstream_->backend().get_memory_info();
    d.device_free = device.free;
    d.device_total = device.total;
    const std::string what = fmt::format("{}: {} (warmup_on_exhausted:fail)", name_, why);
    throw out_of_memory(d, what.c_str());
  }
  if (!warned_) {
    warned_ = true;
    logger().warn("{}: allocating {} needed the backend after warm-up: {}; growing "
                  "(warmup_on_exhausted:grow)",
                  name_, human_bytes(bytes), why);
  }
}

void warmup_policy::do_release_cached() {
  upstream_->release_cached();
  if (armed_) {
    armed_ = false;
    logger().info("{}: release_cached gave the warm-up back; backend calls are no longer watched", name_);
  }
}

}  // namespace fragctl
