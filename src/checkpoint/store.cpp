// The activation-checkpoint store; the theory is in fragctl/checkpoint/store.hpp.
#include "fragctl/checkpoint/store.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <limits>
#include <optional>
#include <vector>

#include "absl/container/btree_map.h"
#include "checkpoint/region.hpp"
#include "core/stream_marker.hpp"
#include "fmt/format.h"
#include "fragctl/backend.hpp"
#include "fragctl/error.hpp"
#include "fragctl/log.hpp"

namespace fragctl::checkpoint {

std::string_view to_string(copy_reason reason) noexcept {
  switch (reason) {
    case copy_reason::evict: return "evict";
    case copy_reason::evict_ahead: return "evict_ahead";
    case copy_reason::prefetch: return "prefetch";
    case copy_reason::fetch_on_demand: return "fetch_on_demand";
  }
  return "unknown";
}

namespace {

using clock = std::chrono::steady_clock;

/// Above every layer id: no bound on which layers may be evicted.
constexpr std::int64_t no_bound = std::int64_t{std::numeric_limits<int>::max()} + 1;

struct entry {
  std::size_t bytes = 0;
  std::size_t span = 0;        ///< bytes rounded up to the region's alignment
  stream_t stream = nullptr;   ///< last device user: the producer, then the getter
  marker_ref written;          ///< after the producer's writes; null until sealed
  bool on_device = false;
  std::size_t offset = 0;
  marker_ref device_ready;     ///< the host-to-device copy that placed it; null: the producer did
  bool prefetched = false;     ///< device copy placed by a prefetch
  void* host = nullptr;        ///< a valid host copy, or null
  bool in_use = false;         ///< between get and drop
};

struct pending_copy {
  marker_ref done;
  std::size_t bytes = 0;
  bool to_host = false;
  clock::time_point queued;
};

void add(byte_gauge& g, std::size_t bytes) {
  g.current += bytes;
  g.peak = std::max(g.peak, g.current);
}

}  // namespace

class store::state {
 public:
  state(device_allocator& allocator, store_options options);
  ~state();

  void* put(int layer, std::size_t bytes, stream_t stream);
  void* get(int layer, stream_t stream);
  /// Throws state_error for `what` ("put", "get") while the allocator is paused.
  void refuse_while_paused(const char* what, int layer) const;
  void drop(int layer);
  void reset();
  void synchronize();
  void stream_ending(stream_t stream);
  [[nodiscard]] residence where(int layer) const;
  [[nodiscard]] store_stats stats() const;

  const store_options options_;
  stream_t copy_ = nullptr;

 private:
  [[nodiscard]] char* address(const entry& e) const { return static_cast<char*>(base_) + e.offset; }
  void poll();
  void seal();
  /// The evictable checkpoint backward needs last (the lowest layer) among
  /// layers below `below`, other than `exclude`; entries_.end() if none.
  [[nodiscard]] absl::btree_map<int, entry>::iterator victim(std::int64_t below, std::optional<int> exclude);
  void evict(int layer, entry& e, copy_reason reason);
  std::optional<region::block> make_room(std::size_t span, std::int64_t below, std::optional<int> exclude);
  bool fetch(int layer, entry& e, copy_reason reason, std::int64_t below);
  void prefetch();
  void release(entry& e);
  void queued(const marker_ref& done, int layer, std::size_t bytes, copy_reason reason);
  [[noreturn]] void out_of_room(std::size_t span, const char* what) const;

  device_allocator& allocator_;
  device_backend& backend_;
  const std::size_t budget_;
  marker_pool markers_;  // before every member that holds markers
  pinned_host_arena host_;
  region region_;
  void* base_ = nullptr;
  absl::btree_map<int, entry> entries_;
  std::vector<int> unsealed_;
  std::deque<pending_copy> pending_;
  std::vector<std::size_t> plan_;      ///< spans of the previous iteration's puts, in order
  std::vector<std::size_t> sequence_;  ///< spans of this iteration's puts so far
  std::optional<int> cursor_;          ///< the layer backward is at (last get)
  clock::time_point copy_idle_since_{};
  store_stats stats_;
};

namespace {

// The device budget rounded up to the store's alignment; a budget that
// cannot be rounded (within the alignment of SIZE_MAX) is refused.
std::size_t budget_of(std::size_t device_budget) {
  if (device_budget > SIZE_MAX - (store_alignment - 1)) {
    throw invalid_argument(fmt::format("checkpoint store: device_budget of {} bytes is larger than any device",
                                       device_budget));
  }
  return round_up(device_budget, store_alignment);
}

}  // namespace

store::state::state(device_allocator& allocator, store_options options)
    : options_(std::move(options)),
      allocator_(allocator),
      backend_(allocator.backend()),
      budget_(budget_of(options_.device_budget)),
      markers_(backend_),
      host_(backend_, options_.host),
      region_(budget_) {
  if (budget_ == 0) throw invalid_argument("checkpoint store: device_budget must be positive");
  base_ = allocator_.allocate(budget_, nullptr);
  try {
    copy_ = backend_.create_stream();
  } catch (...) {
    allocator_.deallocate(base_, budget_, nullptr);
    throw;
  }
  stats_.device_budget = budget_;
  stats_.host_provider = std::string(to_string(host_.provider()));
  if (!host_.jemalloc_source().empty()) stats_.host_provider += fmt::format(" ({})", host_.jemalloc_source());
}

store::state::~state() {
  try {
    reset();
    backend_.synchronize_stream(copy_);
    for (const marker_ref& f : region_.fences()) backend_.synchronize_event(f->event);
  } catch (const std::exception& e) {
    logger().error("checkpoint store: waiting for the region's last users failed: {}", e.what());
  }
  pending_.clear();
  allocator_.deallocate(base_, budget_, nullptr);
  try {
    backend_.destroy_stream(copy_);
  } catch (const std::exception& e) {
    logger().warn("checkpoint store: destroying the copy stream failed: {}", e.what());
  }
}

void store::state::poll() {
  while (!pending_.empty() && backend_.query_event(pending_.front().done->event)) {
    const pending_copy& c = pending_.front();
    const clock::time_point now = clock::now();
    const double busy = std::chrono::duration<double>(now - std::max(c.queued, copy_idle_since_)).count();
    (c.to_host ? stats_.to_host_seconds : stats_.to_device_seconds) += busy;
    copy_idle_since_ = now;
    pending_.pop_front();
  }
}

void store::state::seal() {
  for (int layer : unsealed_) {
    entry& e = entries_.at(layer);
    e.written = markers_.record(e.stream);
  }
  unsealed_.clear();
}

void store::state::queued(const marker_ref& done, int layer, std::size_t bytes, copy_reason reason) {
  const copy_event ev{layer, bytes, reason};
  pending_.push_back({done, bytes, ev.to_host(), clock::now()});
  switch (reason) {
    case copy_reason::evict: ++stats_.evictions; break;
    case copy_reason::evict_ahead: ++stats_.evictions_ahead; break;
    case copy_reason::prefetch: ++stats_.prefetches; break;
    case copy_reason::fetch_on_demand: ++stats_.fetches_on_demand; break;
  }
  (ev.to_host() ? stats_.bytes_to_host : stats_.bytes_to_device) += bytes;
  if (options_.on_copy) options_.on_copy(ev);
}

absl::btree_map<int, entry>::iterator store::state::victim(std::int64_t below, std::optional<int> exclude) {
  for (auto it = entries_.begin(); it != entries_.end() && it->first < below; ++it) {
    const entry& e = it->second;
    if (it->first != exclude && e.on_device && !e.in_use && e.written != nullptr) return it;
  }
  return entries_.end();
}

void store::state::evict(int layer, entry& e, copy_reason reason) {
  marker_ref fence;
  if (e.host == nullptr) {
    e.host = host_.allocate(e.bytes);
    add(stats_.host, e.bytes);
    if (e.device_ready == nullptr && markers_.order_after(copy_, *e.written)) ++stats_.stream_waits;
    backend_.memcpy_async(e.host, address(e), e.bytes, copy_);
    fence = markers_.record(copy_);
    queued(fence, layer, e.bytes, reason);
  } else {
    // A copy fetched earlier and not used since: the host copy is still valid.
    fence = e.device_ready != nullptr ? e.device_ready : markers_.record(copy_);
    ++stats_.evictions_without_copy;
  }
  region_.release(e.offset, e.span, std::move(fence));
  stats_.device.current -= e.span;
  e.on_device = false;
  e.prefetched = false;
  e.device_ready.reset();
}

std::optional<region::block> store::state::make_room(std::size_t span, std::int64_t below,
                                                     std::optional<int> exclude) {
  for (;;) {
    if (auto b = region_.allocate(span)) return b;
    auto it = victim(below, exclude);
    if (it == entries_.end()) return std::nullopt;
    evict(it->first, it->second, copy_reason::evict);
  }
}

void store::state::out_of_room(std::size_t span, const char* what) const {
  oom_details d;
  d.requested = span;
  d.reserved = budget_;
  d.cached_free = region_.free_bytes();
  d.largest_free_block = region_.largest_free();
  d.device_total = budget_;
  logger().warn("checkpoint store: {} bytes do not fit the {}-byte budget ({})", span, budget_, what);
  throw out_of_memory(d, "checkpoint_store");
}

void store::state::refuse_while_paused(const char* what, int layer) const {
  // The region's pages are given back while the allocator is paused: a
  // checkpoint written there, or copied out of it, would meet unmapped
  // memory (a red team's put wrote through one and faulted).
  if (allocator_.paused()) {
    throw state_error(
        fmt::format("checkpoint store: {} of layer {} while the allocator is paused (resume it first)", what, layer));
  }
}

void* store::state::put(int layer, std::size_t bytes, stream_t stream) {
  refuse_while_paused("put", layer);
  poll();
  seal();
  if (bytes == 0) throw invalid_argument(fmt::format("checkpoint store: put of layer {} with zero bytes", layer));
  if (entries_.contains(layer)) {
    throw invalid_argument(fmt::format("checkpoint store: layer {} is already stored; drop it first", layer));
  }
  // The budget is a multiple of the alignment: a put larger than it fails
  // before its size is rounded (which would wrap near SIZE_MAX).
  if (bytes > budget_) out_of_room(bytes, "larger than the budget");
  const std::size_t span = round_up(bytes, store_alignment);
  std::optional<region::block> b = make_room(span, no_bound, std::nullopt);
  if (!b) out_of_room(span, "the rest is in use");
  for (const marker_ref& f : b->fences) stats_.stream_waits += markers_.order_after(stream, *f) ? 1 : 0;

  entry& e = entries_[layer];
  e.bytes = bytes;
  e.span = span;
  e.stream = stream;
  e.on_device = true;
  e.offset = b->offset;
  unsealed_.push_back(layer);
  add(stats_.device, span);
  ++stats_.puts;
  sequence_.push_back(span);

  // Room for the next put now, so that its copy out overlaps this layer.
  if (options_.evict_ahead && sequence_.size() < plan_.size()) {
    const std::size_t next = plan_[sequence_.size()];
    while (region_.largest_free() < next) {
      auto v = victim(no_bound, layer);
      if (v == entries_.end()) break;
      evict(v->first, v->second, copy_reason::evict_ahead);
    }
  }
  return address(e);
}

bool store::state::fetch(int layer, entry& e, copy_reason reason, std::int64_t below) {
  std::optional<region::block> b = make_room(e.span, below, layer);
  if (!b) return false;
  for (const marker_ref& f : b->fences) stats_.stream_waits += markers_.order_after(copy_, *f) ? 1 : 0;
  // The copy first: a copy that fails leaves the entry on the host and the
  // room free (before, the entry read as on the device with no copy behind
  // it, and the next get used its missing marker).
  try {
    backend_.memcpy_async(static_cast<char*>(base_) + b->offset, e.host, e.bytes, copy_);
  } catch (...) {
    region_.release(b->offset, e.span, nullptr);
    throw;
  }
  e.offset = b->offset;
  e.on_device = true;
  e.prefetched = reason == copy_reason::prefetch;
  add(stats_.device, e.span);
  e.device_ready = markers_.record(copy_);
  queued(e.device_ready, layer, e.bytes, reason);
  return true;
}

void store::state::prefetch() {
  if (!cursor_ || options_.prefetch_depth == 0) return;
  std::size_t seen = 0;
  for (auto it = entries_.lower_bound(*cursor_); it != entries_.begin() && seen < options_.prefetch_depth;) {
    --it;
    ++seen;
    if (it->second.on_device) continue;
    if (!fetch(it->first, it->second, copy_reason::prefetch, it->first)) break;
  }
}

void* store::state::get(int layer, stream_t stream) {
  refuse_while_paused("get", layer);
  poll();
  seal();
  auto it = entries_.find(layer);
  if (it == entries_.end()) throw invalid_argument(fmt::format("checkpoint store: get of layer {}, which is not stored", layer));
  entry& e = it->second;
  ++stats_.gets;
  cursor_ = layer;
  if (!e.on_device) {
    if (!fetch(layer, e, copy_reason::fetch_on_demand, no_bound)) out_of_room(e.span, "fetching it back; the rest is in use");
    ++stats_.gets_on_demand;
  } else if (e.prefetched) {
    ++stats_.gets_prefetched;
    if (!backend_.query_event(e.device_ready->event)) ++stats_.gets_prefetch_pending;
  } else if (!e.in_use) {
    ++stats_.gets_resident;
  }

  if (e.device_ready != nullptr) {
    if (options_.measure_waits) {
      backend_.synchronize_stream(stream);
      const clock::time_point start = clock::now();
      backend_.synchronize_event(e.device_ready->event);
      stats_.wait_seconds += std::chrono::duration<double>(clock::now() - start).count();
    }
    stats_.stream_waits += markers_.order_after(stream, *e.device_ready) ? 1 : 0;
  } else if (e.stream != stream) {
    const marker_ref last = e.in_use ? markers_.record(e.stream) : e.written;
    stats_.stream_waits += markers_.order_after(stream, *last) ? 1 : 0;
  }
  e.in_use = true;
  e.stream = stream;
  e.device_ready.reset();
  e.prefetched = false;
  if (e.host != nullptr) {
    // Later users of the host buffer are copies on the copy stream, ordered
    // after the copy that read it.
    host_.deallocate(e.host, e.bytes);
    stats_.host.current -= e.bytes;
    e.host = nullptr;
  }
  void* p = address(e);
  prefetch();
  return p;
}

void store::state::release(entry& e) {
  if (e.on_device) {
    marker_ref fence = e.device_ready != nullptr ? e.device_ready : markers_.record(e.stream);
    region_.release(e.offset, e.span, std::move(fence));
    stats_.device.current -= e.span;
    e.on_device = false;
  }
  if (e.host != nullptr) {
    host_.deallocate(e.host, e.bytes);
    stats_.host.current -= e.bytes;
    e.host = nullptr;
  }
}

void store::state::drop(int layer) {
  poll();
  seal();
  auto it = entries_.find(layer);
  if (it == entries_.end()) {
    logger().warn("checkpoint store: drop of layer {}, which is not stored", layer);
    return;
  }
  release(it->second);
  entries_.erase(it);
  ++stats_.drops;
  // No prefetch into the region while the allocator is paused: its pages
  // are given back (a red team's drop copied into them).
  if (!allocator_.paused()) prefetch();
}

void store::state::reset() {
  poll();
  seal();
  for (auto& [layer, e] : entries_) release(e);
  entries_.clear();
  plan_ = std::move(sequence_);
  sequence_.clear();
  cursor_.reset();
  ++stats_.iterations;
}

void store::state::stream_ending(stream_t stream) {
  if (stream == nullptr) return;
  backend_.synchronize_stream(stream);
  seal();  // the writes on it are done: their markers are complete at once
  for (auto& [layer, e] : entries_) {
    if (e.stream == stream) e.stream = nullptr;
  }
}

void store::state::synchronize() {
  backend_.synchronize_stream(copy_);
  poll();
}

residence store::state::where(int layer) const {
  auto it = entries_.find(layer);
  if (it == entries_.end()) return residence::absent;
  return it->second.on_device ? residence::device : residence::host;
}

store_stats store::state::stats() const {
  store_stats s = stats_;
  s.host_arena = host_.stats();
  return s;
}

store::store(device_allocator& allocator, store_options options)
    : state_(std::make_unique<state>(allocator, std::move(options))) {}

store::~store() = default;

void* store::put(int layer, std::size_t bytes, stream_t stream) { return state_->put(layer, bytes, stream); }

void* store::get(int layer, stream_t stream) { return state_->get(layer, stream); }

void store::drop(int layer) noexcept {
  try {
    state_->drop(layer);
  } catch (const std::exception& e) {
    logger().error("checkpoint store: drop of layer {} failed: {}", layer, e.what());
  }
}

void store::reset() { state_->reset(); }

void store::synchronize() { state_->synchronize(); }
void store::stream_ending(stream_t stream) { state_->stream_ending(stream); }

residence store::where(int layer) const { return state_->where(layer); }

store_stats store::stats() const { return state_->stats(); }

const store_options& store::options() const noexcept { return state_->options_; }

stream_t store::copy_stream() const noexcept { return state_->copy_; }

}  // namespace fragctl::checkpoint
