// The stream-order rule, written once (docs/stream-order.md): memory freed
// on stream S may be used again at once on S, and on any other stream, or
// given back to the device, only once the work queued on S before the free
// has completed. Every component that reuses memory across streams asks this
// clock: the arena's blocks and granules, the caching policy's blocks freed
// on another stream than their segment's, the buckets policy's slots freed on
// another stream than their slab's, and stream_use_adaptor's frees of blocks
// other streams used (record_stream). Its events come from an event_pool
// (event_pool.hpp), as do the checkpoint store's markers (stream_marker.hpp),
// which order one stream's work after another's on the device instead.
//
// Every stream the clock meets gets a small index and a *tick*: the number of
// the next event that will be recorded on it. A free on stream S is stamped
// (S, S.tick) and costs nothing else: no backend call. Only when someone needs
// to know whether such frees finished (another stream wants the block, or a
// granule is to be unmapped) does `refresh(S)` record ONE event on S covering
// every free since the last event (tick += 1) and query the pending events,
// oldest first. `completed` is the highest tick whose event has been seen
// complete, so a stamp (S, t) is complete once S.completed >= t. Events of one
// stream complete in the order they were recorded, so the oldest-first query
// stops at the first that is not complete.
//
// The later an event is recorded, the more work it covers, and the later the
// memory behind it is reusable. A user that must fix the point at once calls
// `record_now(S)`: caching records at each cross-stream free (one event per
// free, so a block comes back as soon as the work queued before its free is
// done), buckets at each refill that finds held slots (one event per stream
// for all its frees so far). record_now ignores the cap on events in flight
// per stream that refresh keeps.
//
// Memory may be touched by frees on several streams. Two stamps of one
// stream merge into the later; stamps of different streams merge into a
// *multi* stamp that holds the current quiescence epoch. The epoch grows each
// time every stream is seen with all its frees complete (refresh_all,
// synchronize_all), so a multi stamp is complete once the epoch has moved past
// the one it holds. A holder of several independent stamps (a block used on
// several streams) may instead keep one stamp per stream and ask complete()
// of each.
//
// Events are pooled and reused; the clock owns all of them. Events are
// recorded after the frees they cover, so a stream must stay alive while
// frees on it are pending: its owner says before destroying it
// (device_allocator::stream_ending waits for it, then `end_stream` takes its
// frees as complete and frees its index for the next stream met, with its
// tick running on, so that old stamps of the index stay complete). Where a
// stream was destroyed unannounced, a runtime may refuse the record (its
// frees are then taken as complete, with a warning) or end the process
// (CUDA). Not thread-safe (its owner is used under its caller's lock).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/event_pool.hpp"
#include "fragctl/backend.hpp"
#include "fragctl/types.hpp"

namespace fragctl {

/// Who last freed a piece of memory, and when (in that stream's ticks).
struct free_stamp {
  /// No pending work: never freed, or known complete.
  static constexpr std::uint32_t none = UINT32_MAX;
  /// Frees on several streams; `tick` holds a quiescence epoch.
  static constexpr std::uint32_t multi = UINT32_MAX - 1;

  std::uint32_t stream = none;
  std::uint64_t tick = 0;
};

class stream_clock {
 public:
  explicit stream_clock(device_backend& backend);
  /// Destroys every event the clock created (pending ones too).
  ~stream_clock();
  stream_clock(const stream_clock&) = delete;
  stream_clock& operator=(const stream_clock&) = delete;

  /// The index of `stream`, registering it on first use (may allocate then).
  [[nodiscard]] std::uint32_t index_of(stream_t stream) {
    if (stream == last_stream_ && last_index_ != free_stamp::none) return last_index_;
    return lookup(stream);
  }

  /// Stamps a free on stream `index`. No backend call.
  [[nodiscard]] free_stamp on_free(std::uint32_t index) noexcept {
    stream_state& s = streams_[index];
    s.dirty = true;
    return {index, s.tick};
  }

  /// Whether all work of the frees behind `stamp` is known complete (from
  /// what earlier queries saw; no backend call).
  [[nodiscard]] bool complete(free_stamp stamp) const noexcept {
    if (stamp.stream == free_stamp::none) return true;
    if (stamp.stream == free_stamp::multi) return quiescent_epoch_ > stamp.tick;
    return streams_[stamp.stream].completed >= stamp.tick;
  }

  /// Whether memory with `stamp` may be handed out on stream `index` now.
  [[nodiscard]] bool usable_on(free_stamp stamp, std::uint32_t index) const noexcept {
    return stamp.stream == index || complete(stamp);
  }

  /// Records an event on stream `index` if it has frees no event covers yet,
  /// then queries its pending events oldest first. Never blocks.
  void refresh(std::uint32_t index);
  /// Records an event on stream `index` now if it has frees no event covers
  /// yet, however many of its events are in flight: those frees become
  /// complete as soon as the work queued on it so far is. Throws
  /// backend_error when no event can be created; a failed record (the stream
  /// is gone) takes the frees as complete, as refresh does.
  void record_now(std::uint32_t index) {
    stream_state& s = streams_[index];
    if (s.dirty) record(s);
  }
  /// refresh() on every stream; moves the quiescence epoch when every free so
  /// far is complete.
  void refresh_all();
  /// Blocks until every free so far on every stream is complete.
  void synchronize_all();
  /// `stream`'s work is done and its owner destroys it next: every free on
  /// it so far is complete, the clock never records on it again, and its
  /// index goes to the next new stream (stamps of the index stay complete).
  /// No backend call; nothing for a stream the clock never met.
  void end_stream(stream_t stream) noexcept;
  /// Blocks until the frees behind `stamp` are complete, and no longer: on
  /// its stream only, up to the first event covering it (recorded now if
  /// none does yet). A multi stamp waits for every stream.
  void synchronize(free_stamp stamp);

  /// The stamp of memory freed by `later` after it was last freed by `earlier`
  /// (granules): the later of two on one stream, else a multi stamp.
  [[nodiscard]] free_stamp merge(free_stamp earlier, free_stamp later) const noexcept {
    if (earlier.stream == later.stream || complete(earlier)) return later;
    return {free_stamp::multi, quiescent_epoch_};
  }

  /// The stamp of two adjacent free blocks coalesced into one, or nullopt when
  /// they must stay apart (pending frees on two different streams).
  [[nodiscard]] std::optional<free_stamp> join(free_stamp a, free_stamp b) const noexcept {
    if (complete(a)) return b;
    if (complete(b)) return a;
    if (a.stream == b.stream) return a.tick > b.tick ? a : b;
    return std::nullopt;
  }

  /// The stream registered as `index` (nullptr for none, multi or a stream
  /// that ended).
  [[nodiscard]] stream_t stream_of(std::uint32_t index) const noexcept {
    return index < streams_.size() ? streams_[index].stream : nullptr;
  }
  /// Number of streams seen so far.
  [[nodiscard]] std::size_t stream_count() const noexcept { return streams_.size(); }

 private:
  struct pending_event {
    event_t event;
    std::uint64_t tick;
  };
  struct stream_state {
    stream_t stream = nullptr;
    std::uint64_t tick = 1;       // tick of the next event recorded on this stream
    std::uint64_t completed = 0;  // highest tick seen complete
    bool dirty = false;           // frees since the last recorded event
    bool ended = false;           // its stream ended; the index is free for the next stream met
    std::vector<pending_event> pending;  // recorded, not yet seen complete; oldest first
  };

  std::uint32_t lookup(stream_t stream);
  /// The state of `stream` while it has not ended, else streams_.end(): a
  /// scan of a few streams, the index beyond them (a trace of 100,000
  /// streams made every new stream's lookup a scan of all: quadratic).
  [[nodiscard]] std::vector<stream_state>::iterator find(stream_t stream) noexcept {
    if (streams_.size() <= scanned_streams) {
      return std::find_if(streams_.begin(), streams_.end(),
                          [stream](const stream_state& s) { return !s.ended && s.stream == stream; });
    }
    const auto it = index_.find(stream);
    return it == index_.end() ? streams_.end() : streams_.begin() + it->second;
  }
  static constexpr std::size_t scanned_streams = 16;
  void record(stream_state& s);
  [[nodiscard]] bool idle(const stream_state& s) const noexcept { return !s.dirty && s.pending.empty(); }

  device_backend& backend_;
  event_pool events_;
  std::vector<stream_state> streams_;
  absl::flat_hash_map<stream_t, std::uint32_t> index_;  // streams not ended, by stream
  std::vector<std::uint32_t> ended_;                    // indices of ended streams, for the next new ones
  std::uint64_t quiescent_epoch_ = 1;
  stream_t last_stream_ = nullptr;
  std::uint32_t last_index_ = free_stamp::none;
};

}  // namespace fragctl
