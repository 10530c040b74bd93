// stream_use_adaptor: record_stream on top of the stream-order rule.
//
// A block lives on the stream it was allocated on; the policies below reuse
// a freed block on that stream at once, which is right as long as only that
// stream touched it. record_stream(p, s) says another stream s touched it
// too. Such a free is *deferred*: the block stays allocated upstream and
// gets one stamp per recorded stream from the stream clock (no backend call
// at free time). The clock records one event per stream when someone asks,
// covering every free on that stream so far; once every stamp of a deferred
// free is complete, the free goes upstream, stream-ordered on the block's own
// stream as usual.
//
// A deferred free's pointer is remembered until the free goes upstream: a
// second free of it meanwhile is a double free (not_owned), never passed on,
// where the policy would free the block at once, under the other stream's
// work, and the deferred free later whatever block was then at that address.
//
// The table of recorded uses and the set of waiting frees are empty in
// single-stream programs, so a free costs two tests more than without the
// adaptor. Deferred frees are looked at oldest first on each allocation,
// stopping at the first that is not complete: stamps of one stream complete
// in order, so this finds nearly all that can go and costs one event query
// per allocation while any wait.
#include <algorithm>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "core/stream_clock.hpp"
#include "fragctl/adaptors.hpp"
#include "fragctl/error.hpp"
#include "fragctl/log.hpp"

namespace fragctl {

struct stream_use_adaptor::impl {
  explicit impl(device_backend& backend) : clock(backend) {}

  using stamps = absl::InlinedVector<free_stamp, 2>;
  struct deferred_free {
    void* ptr;
    std::size_t bytes;
    stream_t stream;  // the stream the free named; the upstream gets it
    stamps waits;     // one per stream that used the block
  };

  // Hands back, oldest first, the deferred frees whose streams have all
  // passed them; with `wait`, first blocks until every stream has.
  void hand_back(device_allocator& upstream, bool wait) {
    if (wait) clock.synchronize_all();
    while (!deferred.empty()) {
      const deferred_free& d = deferred.front();
      for (const free_stamp& stamp : d.waits) {
        if (clock.complete(stamp)) continue;
        clock.refresh(stamp.stream);
        if (!clock.complete(stamp)) return;
      }
      upstream.deallocate(d.ptr, d.bytes, d.stream);
      waiting.erase(d.ptr);
      deferred.pop_front();
    }
  }

  stream_clock clock;
  absl::flat_hash_map<void*, absl::InlinedVector<stream_t, 2>> uses;  // live blocks used elsewhere
  std::deque<deferred_free> deferred;
  absl::flat_hash_set<void*> waiting;  // the pointers of `deferred`
};

stream_use_adaptor::stream_use_adaptor(std::unique_ptr<device_allocator> upstream)
    : forwarding_adaptor(std::move(upstream), "stream_use_adaptor") {
  impl_ = std::make_unique<impl>(this->upstream().backend());
}

stream_use_adaptor::~stream_use_adaptor() {
  if (impl_->deferred.empty()) return;
  try {
    impl_->clock.synchronize_all();
  } catch (const std::exception& e) {
    logger().error("stream uses: cannot wait for {} deferred frees at destruction ({}); handing them back anyway",
                   impl_->deferred.size(), e.what());
  }
  for (const impl::deferred_free& d : impl_->deferred) upstream().deallocate(d.ptr, d.bytes, d.stream);
}

std::size_t stream_use_adaptor::deferred() const noexcept { return impl_->deferred.size(); }

void* stream_use_adaptor::do_allocate(std::size_t bytes, stream_t stream) {
  if (impl_->deferred.empty()) [[likely]] return upstream().allocate(bytes, stream);
  return allocate_handing_back(bytes, stream);
}

void* stream_use_adaptor::allocate_handing_back(std::size_t bytes, stream_t stream) {
  impl& s = *impl_;
  s.hand_back(upstream(), /*wait=*/false);
  try {
    return upstream().allocate(bytes, stream);
  } catch (const out_of_memory&) {
    if (s.deferred.empty()) throw;
  }
  s.hand_back(upstream(), /*wait=*/true);
  return upstream().allocate(bytes, stream);
}

free_result stream_use_adaptor::do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept {
  if (impl_->uses.empty() && impl_->waiting.empty()) [[likely]] return upstream().try_deallocate(ptr, bytes, stream);
  return deallocate_recorded(ptr, bytes, stream);
}

free_result stream_use_adaptor::deallocate_recorded(void* ptr, std::size_t bytes, stream_t stream) noexcept {
  impl& s = *impl_;
  if (s.waiting.contains(ptr)) return {free_status::not_owned, 0};  // freed already; its free waits
  const auto it = s.uses.find(ptr);
  if (it == s.uses.end()) return upstream().try_deallocate(ptr, bytes, stream);
  // The free goes upstream later: a wrong size is judged now, as the
  // policy would judge it, and the free put off with the block's own size
  // (the statistics above count that size, and misuse is reported once).
  free_result result{free_status::ok, bytes};
  std::optional<free_result> judged;
  try {
    judged = upstream().check_free(ptr, bytes);
  } catch (...) {
    // An upstream that cannot tell (a user's allocator that throws): the size as given.
  }
  if (judged && judged->status != free_status::not_owned) {
    result = *judged;
    if (judged->status == free_status::size_mismatch) bytes = judged->bytes;
  }
  try {
    impl::deferred_free d{ptr, bytes, stream, {}};
    for (stream_t used : it->second) d.waits.push_back(s.clock.on_free(s.clock.index_of(used)));
    s.waiting.insert(ptr);
    s.deferred.push_back(std::move(d));
    s.uses.erase(it);
    return result;
  } catch (const std::exception& e) {
    // Out of host memory: no way to remember the wait. Withhold the block
    // (a leak) rather than let a stream still using it see it reused; it
    // stays in `waiting` where it got there, so a second free is refused.
    logger().error("stream uses: cannot defer the free of {} ({}); block withheld", ptr, e.what());
    s.uses.erase(it);
    return result;
  }
}

std::optional<free_result> stream_use_adaptor::do_check_free(void* ptr, std::size_t bytes) const {
  if (impl_->waiting.contains(ptr)) return free_result{free_status::not_owned, 0};  // freed; its free waits
  return upstream().check_free(ptr, bytes);
}

void stream_use_adaptor::do_record_stream(void* ptr, stream_t stream) {
  if (ptr == nullptr) return;
  // A pointer that is no live block's (another allocator's, an interior
  // pointer, a block freed already) has no free here to hold back: as
  // PyTorch's recordStream skips a pointer not its own, nothing is
  // recorded, where a use kept under its address would hold back the next
  // block handed out there.
  if (impl_->waiting.contains(ptr)) return;
  if (const auto live = upstream().check_free(ptr, 0); live && live->status == free_status::not_owned) {
    logger().debug("stream uses: record_stream({}) of a pointer that is not a live block; nothing recorded", ptr);
    return;
  }
  auto& streams = impl_->uses[ptr];
  if (std::find(streams.begin(), streams.end(), stream) == streams.end()) streams.push_back(stream);
}

void stream_use_adaptor::do_stream_ending(stream_t stream) {
  // The stream's work is done (stream_ending waited for it): its stamps are
  // complete, a use recorded on it holds nothing back, and a waiting free
  // that named it goes upstream on the default stream, never on the handle.
  // The upstream first: it may fail (out of host memory), nothing here can.
  forget_stream(upstream(), stream);
  impl& s = *impl_;
  s.clock.end_stream(stream);
  for (auto& [ptr, streams] : s.uses) streams.erase(std::remove(streams.begin(), streams.end(), stream), streams.end());
  absl::erase_if(s.uses, [](const auto& entry) { return entry.second.empty(); });
  for (impl::deferred_free& d : s.deferred) {
    if (d.stream == stream) d.stream = nullptr;
  }
}

void stream_use_adaptor::do_release_cached() {
  impl_->hand_back(upstream(), /*wait=*/true);
  upstream().release_cached();
}

}  // namespace fragctl
