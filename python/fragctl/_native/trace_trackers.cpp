// fragctl's spans as PyTorch's segments for trace trackers (trace_trackers.hpp).
#include "trace_trackers.hpp"

#include <algorithm>

#include <c10/util/Exception.h>

#include "c_api.hpp"

namespace fragctl_torch {

using c10::CachingDeviceAllocator::BlockInfo;
using c10::CachingDeviceAllocator::SegmentInfo;

void span_watch::watch(fragctl_allocator* allocator, c10::DeviceIndex device, c10::MempoolId_t pool) {
  const std::lock_guard lock(mutex_);
  auto& slot = sources_[allocator];
  if (slot != nullptr) return;
  slot = std::make_unique<source>(source{&history_, device, pool});
  check(api.fragctl_watch_spans(
            allocator,
            [](int event, std::uint64_t address, std::uint64_t size, void* context) {
              const auto& s = *static_cast<const source*>(context);
              try {
                s.h->segment(event == FRAGCTL_SPAN_MAPPED, s.device, address, size, nullptr, s.pool);
              } catch (...) {
                // Nothing may unwind into the C library; history::segment reports a tracker's failure.
              }
            },
            slot.get()),
        "watching the spans of an allocator");
}

void span_watch::forget(fragctl_allocator* allocator) {
  const std::lock_guard lock(mutex_);
  sources_.erase(allocator);
}

std::vector<std::pair<std::uint64_t, std::uint64_t>> spans_of(fragctl_allocator* allocator) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
  check(api.fragctl_spans(
            allocator,
            [](std::uint64_t address, std::uint64_t size, void* context) {
              static_cast<std::vector<std::pair<std::uint64_t, std::uint64_t>>*>(context)->emplace_back(address, size);
            },
            &out),
        "spans of an allocator");
  return out;
}

std::vector<SegmentInfo> split_at_spans(const SegmentInfo& segment,
                                        const std::vector<std::pair<std::uint64_t, std::uint64_t>>& spans,
                                        std::int32_t& counter) {
  const std::uint64_t lo = segment.address;
  const std::uint64_t hi = lo + segment.total_size;
  std::vector<std::uint64_t> cuts{lo};
  for (const auto& [address, size] : spans) {
    for (const std::uint64_t edge : {address, address + size}) {
      if (edge > lo && edge < hi) cuts.push_back(edge);
    }
  }
  cuts.push_back(hi);
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());

  std::vector<SegmentInfo> out;
  std::size_t block = 0;
  std::uint64_t block_start = lo;  // where segment.blocks[block] begins
  std::uint64_t requested_left = segment.blocks.empty() ? 0 : segment.blocks[0].requested_size;
  for (std::size_t c = 0; c + 1 < cuts.size(); ++c) {
    SegmentInfo piece = segment;
    piece.blocks.clear();
    piece.address = cuts[c];
    piece.total_size = cuts[c + 1] - cuts[c];
    piece.requested_size = piece.allocated_size = piece.active_size = 0;
    piece.registration_counter = counter++;
    std::uint64_t at = cuts[c];
    while (at < cuts[c + 1] && block < segment.blocks.size()) {
      const BlockInfo& b = segment.blocks[block];
      const std::uint64_t block_end = block_start + b.size;
      const std::uint64_t end = std::min<std::uint64_t>(block_end, cuts[c + 1]);
      BlockInfo part = b;
      part.size = end - at;
      part.requested_size = b.allocated ? std::min<std::uint64_t>(requested_left, part.size) : 0;
      requested_left -= part.requested_size;
      if (part.allocated) {
        piece.requested_size += part.requested_size;
        piece.allocated_size += part.size;
      }
      if (part.active) piece.active_size += part.size;
      piece.blocks.push_back(std::move(part));
      at = end;
      if (end == block_end) {
        block_start = block_end;
        if (++block < segment.blocks.size()) requested_left = segment.blocks[block].requested_size;
      }
    }
    out.push_back(std::move(piece));
  }
  return out;
}

}  // namespace fragctl_torch
