// The `warmup` policy: pre-fill an upstream policy's cache from a profile
// (DESIGN.md, "The four policies"; docs/policies/warmup.md).
//
// Theory. A training step repeats the same allocations; the backend calls
// (cuMemAlloc, cuMemMap, ...) of the first steps are what makes them slow and
// what fragments the device. Users warm up by hand: allocate N GB, free it,
// and hope the framework's cache keeps it in a useful shape. This policy does
// that on purpose:
//
//  1. Target. warmup_bytes if set, else the peak reserved bytes of
//     warmup_profile (a JSON report written by FRAGCTL_REPORT, or one
//     allocator's to_json).
//  2. Shape. A cache only helps requests that fit what it holds: arena stitches
//     pages, so one block of the target is as good as any; caching splits a
//     large-pool segment for any request above small_size but serves small
//     requests only from its small pool's 2 MiB segments; buckets keeps slabs
//     per size class. So with a profile the pre-fill follows its request-size
//     histogram: the share (by bytes) of requests of small_size or more is one
//     block, and each smaller log2 bucket gets its share (doubled: small
//     tensors live longer than their traffic suggests) in blocks spread
//     over the bucket (four sizes, 1.25x to 2x its lower bound, which also
//     warms four size classes of `buckets`). Without a histogram it is one
//     block and 1/16 of the target in blocks of small_size (caching's small
//     pool, which one block never reaches). Every block is allocated from the upstream on the warm-up
//     stream, then all are freed.
//  3. Keep. The upstream must keep what was freed: caching keeps segments
//     until release_cached; arena unmaps free granules beyond its
//     release_threshold, so warmup:arena needs release_threshold >= the
//     target. warmup_upstream_config() returns the configuration to build
//     the upstream with (make_policy uses it); a policy built otherwise that
//     hands the warm-up back is reported with one warning.
//  4. Watch. After warm-up, every allocate compares the backend's memory-call
//     counter before and after the upstream call. A request that needed the
//     backend means the profile was too small: under warmup_on_exhausted
//     `fail` it is freed again and out_of_memory says by how much; under
//     `grow` it stands, and one warning gives the figure to put in
//     warmup_bytes. Where the live bytes still fit in the warm-up, the
//     pre-fill had the bytes but not the shape: the message says so and
//     points to warmup_profile instead of a larger warmup_bytes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "fragctl/config.hpp"
#include "fragctl/device_allocator.hpp"
#include "fragctl/policy.hpp"
#include "fragctl/stats.hpp"
#include "fragctl/types.hpp"

namespace fragctl {

/// What the warm-up pre-fills: a byte target and, from a report, the size mix.
struct warmup_profile {
  std::size_t bytes = 0;  ///< target: bytes to pre-fill
  /// Request counts per log2 bucket (stats.hpp); all zero without a report.
  std::array<std::uint64_t, size_histogram_buckets> size_histogram{};
  std::string source;  ///< "warmup_bytes", or the report's path
};

/// Reads cfg.warmup_bytes and cfg.warmup_profile. With a profile, picks the
/// report's allocator on cfg.device (the one with the largest peak reserved
/// if several), and takes its peak reserved bytes (peak allocated, then peak
/// requested, when the report lacks it); warmup_bytes, when set, overrides
/// that target and the histogram still gives the shape. Errors: the file
/// cannot be read, or is not a fragctl report or statistics JSON (message
/// names the path). Neither option set gives a profile of 0 bytes.
[[nodiscard]] absl::StatusOr<warmup_profile> load_warmup_profile(const config& cfg);

/// One size of the pre-fill and how many blocks of it.
struct warmup_block {
  std::size_t bytes = 0;
  std::size_t count = 0;
};

/// The blocks a profile pre-fills, largest first. A bucket's share of
/// profile.bytes is its share of the bytes requested over the run (count x
/// mid-size), except that buckets below `one_block_from` together get twice
/// theirs (at most all of it): long-lived small tensors hold more of the peak
/// than of the traffic. Buckets of `one_block_from` bytes or more
/// (cfg.small_size: what caching serves from its large pool, where one
/// segment is split for any of them) share one block; each smaller bucket
/// gets blocks of four sizes across the bucket (of its top size when fewer
/// than four such blocks make the share), at most 16384 blocks of one size
/// (the rest moves up a bucket). Without a histogram: 1/16 of profile.bytes
/// (at least one block from twice `one_block_from`) in blocks of
/// `one_block_from` bytes, so that caching's small pool is warm too, and the
/// rest one block. The total is within half a block per bucket of profile.bytes.
[[nodiscard]] std::vector<warmup_block> plan_warmup(const warmup_profile& profile,
                                                    std::size_t one_block_from = MiB);

/// `cfg` as the upstream of a warmup policy should be built with: the arena's
/// release_threshold raised to at least the warm-up target, so the pre-mapped
/// granules stay mapped. Returns `cfg` unchanged when the profile cannot be
/// read (the warmup policy then reports the error).
[[nodiscard]] config warmup_upstream_config(const config& cfg);

/// Pre-fills an owned upstream policy from a profile at construction, then
/// forwards every call to it, watching allocations for backend calls (see the
/// comment above). Stream order, alignment, sizes and misuse reports are the
/// upstream's. Not thread-safe (wrap it in thread_safe_adaptor).
class warmup_policy final : public device_allocator {
 public:
  static constexpr std::string_view policy_name = "warmup";

  /// Loads the profile (load_warmup_profile) and pre-fills `upstream`, which
  /// the policy owns, by allocating plan_warmup's blocks on `stream` and
  /// freeing them there. Throws invalid_argument when the profile cannot be
  /// read; when the device cannot hold the whole warm-up, throws
  /// out_of_memory under warmup_on_exhausted `fail` and keeps what fitted
  /// (one warning) under `grow`. Backend errors propagate.
  warmup_policy(const config& cfg, std::unique_ptr<device_allocator> upstream,
                stream_t stream = nullptr);

  /// The wrapped policy.
  [[nodiscard]] device_allocator& upstream() const noexcept { return *upstream_; }
  /// The profile the warm-up followed.
  [[nodiscard]] const warmup_profile& profile() const noexcept { return profile_; }
  /// Bytes allocated (then freed) during the warm-up.
  [[nodiscard]] std::size_t warmed_bytes() const noexcept { return warmed_bytes_; }
  /// Device bytes the backend held right after the warm-up.
  [[nodiscard]] std::size_t warmed_reserved() const noexcept { return warm_held_; }
  /// Backend memory calls (allocate, free, map, unmap, ...) made since the
  /// warm-up ended, by anything using the backend: 0 means the warm-up held.
  [[nodiscard]] std::uint64_t backend_calls_since_warmup() const noexcept;
  /// Most device bytes the backend held beyond warmed_reserved() after a
  /// request that needed the backend while the live bytes exceeded the
  /// warm-up (0 while the warm-up holds, or lacked only shape).
  [[nodiscard]] std::size_t shortfall() const noexcept { return shortfall_; }
  /// What warmup_bytes should be for this workload, as far as seen so far:
  /// the target plus the shortfall.
  [[nodiscard]] std::size_t suggested_bytes() const noexcept { return profile_.bytes + shortfall_; }

 private:
  void* do_allocate(std::size_t bytes, stream_t stream) override;
  free_result do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override {
    return upstream_->try_deallocate(ptr, bytes, stream);
  }
  std::size_t do_allocation_size(std::size_t bytes) const noexcept override {
    return upstream_->allocation_size(bytes);
  }
  pool_state do_state() const override { return upstream_->state(); }
  void do_release_cached() override;
  void do_enable_peer_access(int peer) override { upstream_->enable_peer_access(peer); }
  shared_memory do_share(void* ptr, std::size_t bytes) const override { return upstream_->share(ptr, bytes); }
  std::optional<free_result> do_check_free(void* ptr, std::size_t bytes) const override {
    return upstream_->check_free(ptr, bytes);
  }
  void do_stream_ending(stream_t stream) override { forget_stream(*upstream_, stream); }
  device_backend& do_backend() const noexcept override { return upstream_->backend(); }
  std::string_view do_name() const noexcept override { return name_; }
  memory_snapshot do_memory_map() const override { return upstream_->memory_map(); }

  void warm_up(stream_t stream);
  void exhausted(void* p, std::size_t bytes, stream_t stream, std::size_t held_now);

  std::unique_ptr<device_allocator> upstream_;
  std::string name_;
  warmup_profile profile_;
  warmup_exhausted on_exhausted_;
  std::size_t one_block_from_;  ///< cfg.small_size: plan_warmup's one-block bound
  bool armed_ = false;   ///< watching for backend calls (a warm-up happened, not released)
  bool warned_ = false;  ///< the grow warning was logged
  std::size_t warmed_bytes_ = 0;
  std::size_t warm_held_ = 0;
  std::uint64_t baseline_calls_ = 0;
  std::size_t shortfall_ = 0;
};

static_assert(allocator_policy<warmup_policy>);

}  // namespace fragctl
