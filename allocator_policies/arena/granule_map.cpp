#include "allocator_policies/arena/granule_map.hpp"

#include <algorithm>
#include <bit>

#include "fmt/format.h"
#include "fragctl/error.hpp"
#include "fragctl/log.hpp"

namespace fragctl::arena_detail {

granule_map::granule_map(device_backend& backend, stream_clock& clock, std::uintptr_t base, std::size_t bytes,
                         std::size_t granularity, std::size_t physical_limit, std::size_t max_span,
                         bool wait_before_growing)
    : backend_(backend),
      clock_(clock),
      base_(base),
      granularity_(granularity),
      shift_(static_cast<unsigned>(std::countr_zero(granularity))),
      limit_(physical_limit),
      wait_before_growing_(wait_before_growing) {
  const std::size_t count = bytes >> shift_;
  if (count >= nil - 1) {
    throw invalid_argument(fmt::format("arena: {} granules of {} bytes are too many; raise the granularity "
                                       "or lower arena_size",
                                       count, granularity));
  }
  max_span_ = static_cast<std::uint32_t>(std::clamp<std::size_t>(max_span >> shift_, 1, count == 0 ? 1 : count));
  granules_.resize(count);
  spans_.resize(1);  // the LRU sentinel
  spans_[lru].prev = spans_[lru].next = lru;
}

granule_map::~granule_map() {
  // Best effort: a call that fails is logged and everything else is still
  // given back (a handle whose unmap failed is not released: it is mapped).
  const auto attempt = [](const char* what, auto&& call) {
    try {
      call();
      return true;
    } catch (const std::exception& e) {
      logger().error("arena: {} at destruction failed: {}", what, e.what());
      return false;
    }
  };
  const auto give_back = [&](std::uint32_t first, std::uint32_t count, std::uint64_t handle) {
    const std::size_t bytes = std::size_t{count} << shift_;
    if (attempt("unmap", [&] { backend_.unmap(address(first), bytes); })) {
      attempt("release_physical", [&] { backend_.release_physical(physical_handle{handle}, bytes); });
    }
  };
  for (std::size_t s = 1; s < spans_.size(); ++s) {
    if (spans_[s].count != 0 && spans_[s].handle != paused_handle) {
      give_back(spans_[s].first, spans_[s].count, spans_[s].handle);
    }
  }
  drop_copies();
  for (const piece& p : stranded_) give_back(p.first, p.count, p.handle);
  for (const pooled& p : pool_) {
    attempt("release_physical",
            [&] { backend_.release_physical(physical_handle{p.handle}, std::size_t{p.count} << shift_); });
  }
}

bool granule_map::idle(std::uint32_t s, std::uint64_t& refreshed) {
  const free_stamp stamp = spans_[s].stamp;
  if (clock_.complete(stamp)) return true;
  if (stamp.stream == free_stamp::multi) {
    if (refreshed & (std::uint64_t{1} << 63)) return false;
    refreshed |= std::uint64_t{1} << 63;
    clock_.refresh_all();
  } else {
    const std::uint64_t bit = stamp.stream < 63 ? std::uint64_t{1} << stamp.stream : 0;
    if (refreshed & bit) return false;
    refreshed |= bit;
    clock_.refresh(stamp.stream);
  }
  return clock_.complete(stamp);
}

std::uint32_t granule_map::new_span() {
  if (!free_spans_.empty()) {
    const std::uint32_t s = free_spans_.back();
    free_spans_.pop_back();
    return s;
  }
  spans_.emplace_back();
  free_spans_.reserve(spans_.capacity());  // so that freeing a slot never allocates
  return static_cast<std::uint32_t>(spans_.size() - 1);
}

std::optional<granule_map::pooled> granule_map::take_pooled(std::uint32_t count) noexcept {
  auto it = std::upper_bound(pool_.begin(), pool_.end(), count,
                             [](std::uint32_t c, const pooled& p) { return c < p.count; });
  if (it == pool_.begin()) return std::nullopt;
  --it;
  const pooled p = *it;
  pool_.erase(it);
  pooled_ -= p.count;
  return p;
}

void granule_map::put_pooled(pooled p) noexcept {
  const auto it = std::upper_bound(pool_.begin(), pool_.end(), p.count,
                                   [](std::uint32_t c, const pooled& q) { return c < q.count; });
  pool_.insert(it, p);  // capacity reserved by the caller: no allocation
  pooled_ += p.count;
}

bool granule_map::settle(std::size_t granules, std::size_t lo, std::size_t hi, std::uint64_t& refreshed) {
  bool waited = false;
  std::size_t ready = 0;
  for (std::uint32_t s = spans_[lru].next; s != lru && ready < granules; s = spans_[s].next) {
    const span& sp = spans_[s];
    if (sp.first + sp.count > lo && sp.first <= hi) continue;
    if (!idle(s, refreshed)) {
      clock_.synchronize(sp.stamp);
      waited = true;
    }
    ready += sp.count;
  }
  return waited;
}

void granule_map::unmap_to_pool(std::uint32_t s) {
  pool_.reserve(pool_.size() + 1);
  backend_.unmap(address(spans_[s].first), std::size_t{spans_[s].count} << shift_);
  forget_unmapped(s);
}

void granule_map::forget_unmapped(std::uint32_t s) noexcept {
  span& sp = spans_[s];
  put_pooled({sp.handle, sp.count});
  for (std::uint32_t g = sp.first; g < sp.first + sp.count; ++g) granules_[g].span = nil;
  lru_remove(s);
  mapped_ -= sp.count;
  sp = span{};
  free_spans_.push_back(s);  // capacity reserved in new_span
}

void granule_map::unmap_all_to_pool(std::vector<std::uint32_t>& spans) {
  std::sort(spans.begin(), spans.end(),
            [&](std::uint32_t a, std::uint32_t b) { return spans_[a].first < spans_[b].first; });
  pool_.reserve(pool_.size() + spans.size());
  for (std::size_t i = 0; i < spans.size();) {
    // One unmap for each run of spans side by side: the driver unmaps a range
    // of whole mappings (sim checks it); its cost still follows the handles.
    std::size_t j = i + 1;
    std::uint32_t end = spans_[spans[i]].first + spans_[spans[i]].count;
    for (; j < spans.size() && spans_[spans[j]].first == end; ++j) end += spans_[spans[j]].count;
    const std::uint32_t first = spans_[spans[i]].first;
    backend_.unmap(address(first), std::size_t{end - first} << shift_);
    for (; i < j; ++i) forget_unmapped(spans[i]);
  }
}

void granule_map::trim(std::size_t keep, std::uint64_t before) {
  // A span freed on a GPU stream stays in flight for a while; a few of those
  // are skipped, then trimming waits for a later call.
  constexpr int max_skipped = 8;
  std::uint64_t refreshed = 0;
  int skipped = 0;
  for (std::uint32_t s = spans_[lru].next; s != lru && cached_bytes() > keep && spans_[s].cached_at <= before;) {
    const std::uint32_t next = spans_[s].next;
    if (idle(s, refreshed)) {
      unmap_to_pool(s);
    } else if (++skipped > max_skipped) {
      break;
    }
    s = next;
  }
}

std::uint32_t granule_map::fill_gap(std::uint32_t from, std::uint32_t to, std::size_t lo, std::size_t hi,
                                    std::vector<piece>& plan, std::uint64_t& refreshed) {
  std::uint32_t pos = from;
  const auto from_pool = [&] {
    while (pos < to) {
      const std::optional<pooled> p = take_pooled(to - pos);
      if (!p) return;
      plan.push_back({pos, p->count, p->handle});
      pos += p->count;
    }
  };
  from_pool();
  // Then cached spans that fit what is left, oldest first, placed in that
  // order (no pooled handle fits any more, so the pool hands back exactly
  // these).
  stolen_.clear();
  stolen_counts_.clear();
  std::uint32_t left = to - pos;
  for (std::uint32_t s = spans_[lru].next; s != lru && left > 0; s = spans_[s].next) {
    const span& sp = spans_[s];
    const bool in_range = sp.first <= hi && sp.first + sp.count > lo;
    if (sp.count <= left && !in_range && idle(s, refreshed)) {
      stolen_.push_back(s);
      stolen_counts_.push_back(sp.count);
      left -= sp.count;
    }
  }
  unmap_all_to_pool(stolen_);
  for (const std::uint32_t count : stolen_counts_) {
    const std::optional<pooled> p = take_pooled(count);
    plan.push_back({pos, p->count, p->handle});
    pos += p->count;
  }
  return pos;
}

void granule_map::release_for(std::size_t granules, std::size_t lo, std::size_t hi, std::uint64_t& refreshed) {
  std::size_t released = 0;
  while (released < granules && !pool_.empty()) {
    const pooled p = pool_.back();
    backend_.release_physical(physical_handle{p.handle}, std::size_t{p.count} << shift_);
    pool_.pop_back();
    pooled_ -= p.count;
    created_ -= p.count;
    released += p.count;
  }
  for (std::uint32_t s = spans_[lru].next; s != lru && released < granules;) {
    const std::uint32_t next = spans_[s].next;
    const span& sp = spans_[s];
    const bool in_range = sp.first <= hi && sp.first + sp.count > lo;
    if (!in_range && idle(s, refreshed)) {
      const std::uint32_t count = sp.count;
      unmap_to_pool(s);
      // A pooled handle of exactly its size (its own or one like it).
      const std::optional<pooled> p = take_pooled(count);
      try {
        backend_.release_physical(physical_handle{p->handle}, std::size_t{p->count} << shift_);
      } catch (...) {
        put_pooled(*p);  // still held: back where it was (the slot it left is free)
        throw;
      }
      created_ -= p->count;
      released += p->count;
    }
    s = next;
  }
}

bool granule_map::create_for(std::uint32_t from, std::uint32_t to, std::vector<piece>& plan) {
  const std::size_t start = plan.size();
  for (std::size_t pos = from; pos < to;) {
    const std::size_t end = std::min<std::size_t>(to, (pos / max_span_ + 1) * max_span_);
    const std::size_t count = end - pos;
    std::optional<physical_handle> h;
    if ((created_ + count) << shift_ <= limit_) h = backend_.create_physical(count << shift_);
    if (!h) {
      // Give back what this call created; a piece leaves the plan only once
      // it is released, so a release that throws leaves the rest accounted.
      while (plan.size() > start) {
        backend_.release_physical(physical_handle{plan.back().handle}, std::size_t{plan.back().count} << shift_);
        created_ -= plan.back().count;
        plan.pop_back();
      }
      return false;
    }
    add_created(count);
    plan.push_back({static_cast<std::uint32_t>(pos), static_cast<std::uint32_t>(count), h->value});
    pos = end;
  }
  return true;
}

void granule_map::pool_plan(const std::vector<piece>& plan, std::size_t from) noexcept {
  for (std::size_t i = from; i < plan.size(); ++i) put_pooled({plan[i].handle, plan[i].count});
}

bool granule_map::map_plan(const std::vector<piece>& plan) {
  // Everything that could allocate, before the first mapping.
  try {
    spans_.reserve(spans_.size() + plan.size());
    free_spans_.reserve(spans_.capacity());
  } catch (...) {
    pool_plan(plan, 0);
    throw;
  }
  std::vector<std::uint32_t>& made = made_;  // capacity reserved in map_range
  made.clear();
  std::size_t granted = 0;  // made[0, granted) are in runs that were granted access
  // Unmaps what this call mapped, and only that (never a range it did not
  // map: pytorch#188008 unmapped a partly mapped range whole). A span whose
  // unmap throws stays mapped: with access granted, as a cached span any
  // later steal or trim unmaps; without, stranded, so that no block is ever
  // served from memory the device cannot access.
  const auto undo = [&](std::size_t next_piece) noexcept {
    for (std::size_t k = 0; k < made.size(); ++k) {
      const std::uint32_t s = made[k];
      try {
        backend_.unmap(address(spans_[s].first), std::size_t{spans_[s].count} << shift_);
      } catch (...) {
        if (k >= granted) strand(s);
        continue;
      }
      forget_unmapped(s);
    }
    pool_plan(plan, next_piece);
  };
  std::size_t i = 0;  // pieces before i are mapped (in `made`), the others not
  try {
    for (; i < plan.size();) {
      // One set_access for each run of pieces at consecutive addresses.
      const std::size_t run = i;
      for (; i < plan.size() && (i == run || plan[i].first == plan[i - 1].first + plan[i - 1].count); ++i) {
        const piece& p = plan[i];
        if (!backend_.map(address(p.first), std::size_t{p.count} << shift_, physical_handle{p.handle})) {
          undo(i);
          return false;
        }
        const std::uint32_t s = new_span();  // no allocation: reserved above
        span& sp = spans_[s];
        sp.handle = p.handle;
        sp.first = p.first;
        sp.count = p.count;
        for (std::uint32_t g = p.first; g < p.first + p.count; ++g) granules_[g].span = s;
        mapped_ += p.count;
        lru_push(s);
        made.push_back(s);
      }
      const std::uint32_t lo = plan[run].first;
      const std::uint32_t hi = plan[i - 1].first + plan[i - 1].count;
      if (!backend_.set_access(address(lo), std::size_t{hi - lo} << shift_)) {
        undo(i);
        return false;
      }
      granted = made.size();
    }
  } catch (...) {
    undo(i);  // a map or set_access threw: nothing of this call stays mapped
    throw;
  }
  return true;
}

bool granule_map::map_range(std::uintptr_t addr, std::size_t bytes, bool wait, bool settle_first) {
  const auto lo = static_cast<std::uint32_t>(first(addr));
  const auto hi = static_cast<std::uint32_t>(last_of(addr, bytes));
  std::uint32_t need = 0;
  for (std::uint32_t g = lo; g <= hi; ++g) need += granules_[g].span == nil ? 1 : 0;
  if (need == 0) return true;
  // A stranded span's granules look unmapped: unmap it before planning there.
  if (!stranded_.empty()) unstrand();
  if (wait) clock_.synchronize_all();
  // Room for every handle this call may hand back to the pool, the plan and
  // the spans it maps or strands, so that undoing never allocates.
  pool_.reserve(pool_.size() + need);
  stranded_.reserve(stranded_.size() + need);
  plan_.clear();
  plan_.reserve(need);
  made_.reserve(need);
  holes_.clear();
  holes_.reserve(need);
  stolen_.reserve(need);
  stolen_counts_.reserve(need);

  bool replan = false;
  try {
    // Gaps: from the pool and stolen spans; what stays missing goes to holes_.
    // Each stream is asked about its pending frees at most once per call.
    std::uint64_t refreshed = 0;
    std::size_t missing = 0;
    for (std::uint32_t g = lo; g <= hi;) {
      if (granules_[g].span != nil) {
        ++g;
        continue;
      }
      const std::uint32_t from = g;
      while (g <= hi && granules_[g].span == nil) ++g;
      const std::uint32_t rest = fill_gap(from, g, lo, hi, plan_, refreshed);
      if (rest < g) {
        holes_.push_back({rest, g});
        missing += g - rest;
      }
    }
    if (!holes_.empty() && !wait && settle_first && created_ + missing > high_water_ &&
        settle(missing, lo, hi, refreshed)) {
      pool_plan(plan_, 0);
      plan_.clear();
      replan = true;
    } else if (!holes_.empty()) {
      // Give back as much unused memory as is about to be created.
      release_for(missing, lo, hi, refreshed);
      for (const auto& [from, to] : holes_) {
        if (!create_for(from, to, plan_)) {
          pool_plan(plan_, 0);
          return false;
        }
      }
      // Pieces in address order, so that runs of them share one set_access.
      std::sort(plan_.begin(), plan_.end(), [](const piece& a, const piece& b) { return a.first < b.first; });
    }
  } catch (...) {
    pool_plan(plan_, 0);  // a backend call threw: what was planned goes to the pool
    throw;
  }
  // Plan again, now that the frees of the spans settle() waited for are complete.
  if (replan) return map_range(addr, bytes, false, false);
  return map_plan(plan_);
}

void granule_map::strand(std::uint32_t s) noexcept {
  span& sp = spans_[s];
  stranded_.push_back({sp.first, sp.count, sp.handle});  // capacity reserved in map_range
  for (std::uint32_t g = sp.first; g < sp.first + sp.count; ++g) granules_[g].span = nil;
  lru_remove(s);
  sp = span{};               // still mapped: mapped_ keeps counting it
  free_spans_.push_back(s);  // capacity reserved in new_span
}

void granule_map::unstrand() {
  pool_.reserve(pool_.size() + stranded_.size());
  while (!stranded_.empty()) {
    const piece p = stranded_.back();
    backend_.unmap(address(p.first), std::size_t{p.count} << shift_);
    stranded_.pop_back();
    put_pooled({p.handle, p.count});
    mapped_ -= p.count;
  }
}

void granule_map::release_unused() {
  unstrand();
  while (spans_[lru].next != lru) unmap_to_pool(spans_[lru].next);
  while (!pool_.empty()) {
    const pooled p = pool_.back();
    backend_.release_physical(physical_handle{p.handle}, std::size_t{p.count} << shift_);
    pool_.pop_back();
    pooled_ -= p.count;
    created_ -= p.count;
  }
}

bool granule_map::pause(bool keep_contents, stream_t stream) {
  release_unused();  // nothing is cached or pooled from here on: every span has a live block
  std::vector<std::uint32_t> live;
  for (std::uint32_t s = 1; s < spans_.size(); ++s) {
    if (spans_[s].count != 0) live.push_back(s);
  }
  const auto bytes_of = [&](std::uint32_t s) { return std::size_t{spans_[s].count} << shift_; };
  // The copies, all of them before the first unmap: a refusal here changes nothing.
  copies_.reserve(live.size());
  if (keep_contents) {
    try {
      for (const std::uint32_t s : live) {
        void* host = backend_.allocate_host(bytes_of(s));
        if (host == nullptr) {
          drop_copies();
          return false;
        }
        copies_.push_back({s, host, bytes_of(s)});
        backend_.memcpy_async(host, address(spans_[s].first), bytes_of(s), stream);
      }
      backend_.synchronize_stream(stream);
    } catch (...) {
      drop_copies();
      throw;
    }
  }
  // Unmap and release span by span; a span is paused once both succeeded.
  // Releasing an exported handle closes its export (device_backend::
  // release_physical): counted, and told once, success or not.
  std::vector<std::uint32_t> released;
  released.reserve(live.size());
  detached now;
  const auto tell_detached = [&]() noexcept {
    if (now.handles == 0) return;
    detached_.handles += now.handles;
    detached_.bytes += now.bytes;
    logger().warn("arena: pause detached {} exported handle(s), {} bytes, from the processes that imported them: "
                  "consumers keep the old memory until they close it; re-export after resume",
                  now.handles, now.bytes);
  };
  paused_ = true;
  try {
    for (const std::uint32_t s : live) {
      span& sp = spans_[s];
      backend_.unmap(address(sp.first), bytes_of(s));
      mapped_ -= sp.count;
      const std::uint64_t handle = sp.handle;
      sp.handle = paused_handle;
      created_ -= sp.count;
      released.push_back(s);
      if (backend_.exported(physical_handle{handle})) {
        ++now.handles;
        now.bytes += bytes_of(s);
      }
      try {
        backend_.release_physical(physical_handle{handle}, bytes_of(s));
      } catch (const std::exception& e) {  // unmapped, so no block can reach it: only the handle is lost
        logger().error("arena: pause: release_physical of {} bytes failed: {}", bytes_of(s), e.what());
      }
    }
  } catch (...) {
    tell_detached();
    // With the contents kept, map the released spans back with them so that
    // the arena is as before (what that cannot map stays paused for
    // resume()). Without, their contents are gone: they stay paused, and the
    // caller sees paused() and resumes, as after a pause that succeeded.
    if (keep_contents) {
      try {
        (void)resume(stream);
      } catch (const std::exception& e) {
        logger().error("arena: undoing a failed pause: {}", e.what());
      }
    }
    throw;
  }
  tell_detached();
  return true;
}

bool granule_map::resume(stream_t stream) {
  std::vector<std::uint32_t> waiting, mapped_now;
  for (std::uint32_t s = 1; s < spans_.size(); ++s) {
    span& sp = spans_[s];
    if (sp.count == 0 || sp.handle != paused_handle) continue;
    if (sp.live != 0) {
      waiting.push_back(s);
      continue;
    }
    // Every block here was freed while paused: nothing to map back.
    for (std::uint32_t g = sp.first; g < sp.first + sp.count; ++g) granules_[g].span = nil;
    sp = span{};
    free_spans_.push_back(s);  // capacity reserved in new_span
  }
  mapped_now.reserve(waiting.size());
  if (!remap(waiting, mapped_now)) return false;
  try {
    for (const kept_copy& c : copies_) {
      const span& sp = spans_[c.span];
      if (sp.count != 0 && sp.handle != paused_handle) {
        backend_.memcpy_async(address(sp.first), c.host, c.bytes, stream);
      }
    }
    backend_.synchronize_stream(stream);
  } catch (...) {
    unremap(mapped_now);
    throw;
  }
  drop_copies();
  paused_ = false;
  return true;
}

bool granule_map::remap(const std::vector<std::uint32_t>& spans, std::vector<std::uint32_t>& mapped_now) {
  try {
    for (const std::uint32_t s : spans) {
      span& sp = spans_[s];
      const std::size_t bytes = std::size_t{sp.count} << shift_;
      std::optional<physical_handle> h;
      if ((created_ + sp.count) << shift_ <= limit_) h = backend_.create_physical(bytes);
      if (!h) {
        unremap(mapped_now);
        return false;
      }
      add_created(sp.count);
      bool ok = false;
      try {
        ok = backend_.map(address(sp.first), bytes, *h);
      } catch (...) {
        backend_.release_physical(*h, bytes);
        created_ -= sp.count;
        throw;
      }
      if (!ok) {
        backend_.release_physical(*h, bytes);
        created_ -= sp.count;
        unremap(mapped_now);
        return false;
      }
      sp.handle = h->value;
      mapped_ += sp.count;
      mapped_now.push_back(s);
      if (!backend_.set_access(address(sp.first), bytes)) {
        unremap(mapped_now);
        return false;
      }
    }
  } catch (...) {
    unremap(mapped_now);
    throw;
  }
  return true;
}

void granule_map::unremap(const std::vector<std::uint32_t>& spans) noexcept {
  for (const std::uint32_t s : spans) {
    span& sp = spans_[s];
    if (sp.handle == paused_handle) continue;
    const std::size_t bytes = std::size_t{sp.count} << shift_;
    try {
      backend_.unmap(address(sp.first), bytes);
    } catch (const std::exception& e) {
      // Still mapped, perhaps without access: the span stays as it is, so
      // the counts say what the device holds; resume() maps the others.
      logger().error("arena: undoing a resume: unmap of {} bytes failed: {}", bytes, e.what());
      continue;
    }
    mapped_ -= sp.count;
    created_ -= sp.count;
    const std::uint64_t handle = sp.handle;
    sp.handle = paused_handle;
    try {
      backend_.release_physical(physical_handle{handle}, bytes);
    } catch (const std::exception& e) {
      logger().error("arena: undoing a resume: release_physical of {} bytes failed: {}", bytes, e.what());
    }
  }
}

void granule_map::drop_copies() noexcept {
  for (const kept_copy& c : copies_) {
    try {
      backend_.free_host(c.host, c.bytes);
    } catch (const std::exception& e) {
      logger().error("arena: freeing a paused span's host copy failed: {}", e.what());
    }
  }
  copies_.clear();
}

void granule_map::grant_access_again() {
  for_each_mapped_run([&](std::uintptr_t addr, std::size_t bytes) {
    if (!backend_.set_access(reinterpret_cast<void*>(addr), bytes)) {
      throw backend_error(fmt::format("arena: granting peers access to [{:#x}, +{}) ran out of memory", addr, bytes),
                          2, "out_of_memory");
    }
  });
}

std::vector<granule_map::span_view> granule_map::spans_under(std::uintptr_t addr, std::size_t bytes) const {
  std::vector<span_view> out;
  if (bytes == 0 || addr < base_ || addr - base_ >= granules_.size() << shift_ ||
      bytes > (granules_.size() << shift_) - (addr - base_)) {
    return out;
  }
  for (std::size_t g = first(addr), last = last_of(addr, bytes); g <= last; ++g) {
    if (!mapped(g) || spans_[granules_[g].span].live == 0) return {};
    const span& s = spans_[granules_[g].span];
    if (out.empty() || out.back().handle.value != s.handle) {
      out.push_back({base_ + (std::size_t{s.first} << shift_), std::size_t{s.count} << shift_,
                     physical_handle{s.handle}});
    }
  }
  return out;
}

std::size_t granule_map::paused_bytes() const noexcept {
  std::size_t granules = 0;
  for (std::size_t s = 1; s < spans_.size(); ++s) {
    if (spans_[s].count != 0 && spans_[s].handle == paused_handle) granules += spans_[s].count;
  }
  return granules << shift_;
}

// From the spans, not the granules: a pool state is read on every
// torch.cuda.memory_stats() under enable(), and the range of an 80 GiB
// device is 80k granules (a scan of them took about 260 us a call).
std::size_t granule_map::mapped_runs() const noexcept {
  std::size_t runs = 0;  // a run starts at each mapped span whose granule before is not mapped
  for (std::size_t s = 1; s < spans_.size(); ++s) {
    const span& sp = spans_[s];
    if (maps(sp) && (sp.first == 0 || !mapped(sp.first - 1))) ++runs;
  }
  return runs;
}

std::vector<std::pair<std::uintptr_t, std::uintptr_t>> granule_map::mapped_run_list() const {
  std::vector<std::pair<std::uint32_t, std::uint32_t>> spans;  // granules [first, end)
  for (std::size_t s = 1; s < spans_.size(); ++s) {
    const span& sp = spans_[s];
    if (maps(sp)) spans.emplace_back(sp.first, sp.first + sp.count);
  }
  std::sort(spans.begin(), spans.end());
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> runs;
  for (const auto& [first, end] : spans) {
    const std::uintptr_t lo = base_ + (std::uintptr_t{first} << shift_);
    const std::uintptr_t hi = base_ + (std::uintptr_t{end} << shift_);
    if (!runs.empty() && runs.back().second == lo) {
      runs.back().second = hi;
    } else {
      runs.emplace_back(lo, hi);
    }
  }
  return runs;
}

void granule_map::index_runs() {
  runs_.clear();
  for (std::size_t i = 1; i < spans_.size(); ++i) {
    if (spans_[i].count != 0) runs_.push_back({spans_[i].first, spans_[i].first + spans_[i].count, 0});
  }
  std::sort(runs_.begin(), runs_.end(), [](const mapped_run& a, const mapped_run& b) { return a.first < b.first; });
  std::size_t out = 0, before = 0;
  for (std::size_t i = 0; i < runs_.size(); ++i) {
    if (out != 0 && runs_[out - 1].end == runs_[i].first) {
      runs_[out - 1].end = runs_[i].end;
      continue;
    }
    if (out != 0) before += runs_[out - 1].end - runs_[out - 1].first;
    runs_[out] = runs_[i];
    runs_[out++].before = before;
  }
  runs_.resize(out);
}

std::size_t granule_map::mapped_in(std::uintptr_t addr, std::size_t bytes) const noexcept {
  const std::size_t lo = first(addr), end = last_of(addr, bytes) + 1;
  // Runs [i, j) intersect [lo, end): mapped = their lengths, clipped at both ends.
  const auto i =
      std::upper_bound(runs_.begin(), runs_.end(), lo, [](std::size_t g, const mapped_run& r) { return g < r.end; });
  const auto j = std::lower_bound(i, runs_.end(), end, [](const mapped_run& r, std::size_t g) { return r.first < g; });
  if (i == j) return 0;
  const mapped_run& last = *(j - 1);
  std::size_t mapped = last.before + (last.end - last.first) - i->before;
  if (i->first < lo) mapped -= lo - i->first;
  if (last.end > end) mapped -= last.end - end;
  return mapped;
}

}  // namespace fragctl::arena_detail
