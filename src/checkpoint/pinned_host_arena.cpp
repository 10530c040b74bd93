// pinned_host_arena: picks a provider and keeps the live-byte gauge; the
// size-class provider (the fallback where no jemalloc can be found).
#include "fragctl/checkpoint/pinned_host_arena.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "checkpoint/host_providers.hpp"
#include "fragctl/error.hpp"
#include "fragctl/log.hpp"

namespace fragctl::checkpoint {

std::string_view to_string(host_provider provider) noexcept {
  switch (provider) {
    case host_provider::automatic: return "automatic";
    case host_provider::jemalloc: return "jemalloc";
    case host_provider::size_classes: return "size_classes";
  }
  return "unknown";
}

std::size_t host_size_class(std::size_t bytes) noexcept {
  constexpr std::size_t smallest = 4096;
  if (bytes <= smallest) return smallest;
  const auto k = static_cast<unsigned>(std::bit_width(bytes)) - 1;
  return round_up(bytes, std::size_t{1} << (k - 3));
}

namespace {

class size_class_provider final : public pinned_host_arena::impl {
 public:
  explicit size_class_provider(device_backend& backend) : backend_(backend) {}
  ~size_class_provider() override {
    const std::lock_guard lock(mu_);
    for (const auto& [ptr, bytes] : blocks_) {
      try {
        backend_.free_host(ptr, bytes);
      } catch (const std::exception& e) {
        logger().warn("pinned host arena: unpinning {} bytes failed: {}", bytes, e.what());
      }
    }
  }

  void* allocate(std::size_t bytes) override {
    const std::size_t cls = host_size_class(bytes);
    const std::lock_guard lock(mu_);
    if (auto it = idle_.find(cls); it != idle_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      return p;
    }
    blocks_.reserve(blocks_.size() + 1);
    void* p = backend_.allocate_host(cls);
    if (p == nullptr) return nullptr;
    blocks_.emplace_back(p, cls);
    pinned_bytes_ += cls;
    ++pin_calls_;
    return p;
  }

  void deallocate(void* ptr, std::size_t bytes) noexcept override {
    const std::lock_guard lock(mu_);
    try {
      idle_[host_size_class(bytes)].push_back(ptr);
    } catch (const std::bad_alloc&) {
      logger().error("pinned host arena: out of host memory caching a {}-byte block; it stays pinned", bytes);
    }
  }

  [[nodiscard]] host_provider provider() const noexcept override { return host_provider::size_classes; }
  [[nodiscard]] std::string_view source() const noexcept override { return ""; }
  [[nodiscard]] host_arena_stats pinning() const override {
    const std::lock_guard lock(mu_);
    host_arena_stats s;
    s.pinned_bytes = pinned_bytes_;
    s.pin_calls = pin_calls_;
    return s;
  }

 private:
  device_backend& backend_;
  // std::mutex: ThreadSanitizer sees it (Debian's absl::Mutex is not instrumented).
  mutable std::mutex mu_;
  absl::flat_hash_map<std::size_t, std::vector<void*>> idle_;
  std::vector<std::pair<void*, std::size_t>> blocks_;
  std::size_t pinned_bytes_ = 0;
  std::uint64_t pin_calls_ = 0;
};

}  // namespace

std::unique_ptr<pinned_host_arena::impl> make_size_class_provider(device_backend& backend) {
  return std::make_unique<size_class_provider>(backend);
}

std::string_view jemalloc_available() {
  const jemalloc_api* api = find_jemalloc();
  return api == nullptr ? std::string_view{} : api->source;
}

pinned_host_arena::pinned_host_arena(device_backend& backend, host_provider provider) {
  const jemalloc_api* api = provider == host_provider::size_classes ? nullptr : find_jemalloc();
  if (api != nullptr) {
    impl_ = make_jemalloc_provider(backend, *api);
  } else if (provider == host_provider::jemalloc) {
    throw backend_error(
        "pinned host arena: no jemalloc in this process (link or preload libfragctl_jemalloc.so, "
        "see docs/checkpoint.md)",
        0, "not_supported");
  } else {
    impl_ = make_size_class_provider(backend);
  }
  logger().debug("pinned host arena: provider {}{}{}", to_string(impl_->provider()),
                 impl_->source().empty() ? "" : " from ", impl_->source());
}

pinned_host_arena::~pinned_host_arena() {
  if (const std::size_t live = impl_->live.load(std::memory_order_relaxed); live != 0) {
    logger().warn("pinned host arena: destroyed with {} bytes still handed out", live);
  }
}

void* pinned_host_arena::allocate(std::size_t bytes) {
  if (bytes == 0) throw invalid_argument("pinned host arena: allocate of zero bytes");
  void* p = impl_->allocate(bytes);
  if (p == nullptr) {
    oom_details d;
    d.requested = bytes;
    d.reserved = impl_->pinning().pinned_bytes;
    throw out_of_memory(d, "pinned_host_arena");
  }
  const std::size_t now = impl_->live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  std::size_t peak = impl_->peak.load(std::memory_order_relaxed);
  while (now > peak && !impl_->peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
  impl_->allocations.fetch_add(1, std::memory_order_relaxed);
  return p;
}

void pinned_host_arena::deallocate(void* ptr, std::size_t bytes) noexcept {
  if (ptr == nullptr) return;
  impl_->deallocate(ptr, bytes);
  impl_->live.fetch_sub(bytes, std::memory_order_relaxed);
  impl_->frees.fetch_add(1, std::memory_order_relaxed);
}

host_provider pinned_host_arena::provider() const noexcept { return impl_->provider(); }

std::string_view pinned_host_arena::jemalloc_source() const noexcept { return impl_->source(); }

host_arena_stats pinned_host_arena::stats() const {
  host_arena_stats s = impl_->pinning();
  s.live_bytes = impl_->live.load(std::memory_order_relaxed);
  s.peak_live_bytes = impl_->peak.load(std::memory_order_relaxed);
  s.allocations = impl_->allocations.load(std::memory_order_relaxed);
  s.frees = impl_->frees.load(std::memory_order_relaxed);
  return s;
}

}  // namespace fragctl::checkpoint
