#include "backend/span_registry.hpp"

#include <utility>

namespace fragctl {

void span_registry::watch(device_backend::span_observer observer, void* context) {
  const std::lock_guard lock(mutex_);
  observer_ = observer;
  context_ = context;
}

void span_registry::announce(device_backend::span_event event, const std::vector<span>& spans) const {
  device_backend::span_observer observer = nullptr;
  void* context = nullptr;
  {
    const std::lock_guard lock(mutex_);
    observer = observer_;
    context = context_;
  }
  if (observer == nullptr) return;
  for (const span& s : spans) observer(event, reinterpret_cast<void*>(s.address), s.bytes, context);
}

void span_registry::added(void* address, std::size_t bytes, bool usable) {
  {
    const std::lock_guard lock(mutex_);
    spans_[reinterpret_cast<std::uintptr_t>(address)] = entry{bytes, usable};
  }
  if (usable) announce(device_backend::span_event::mapped, {span{reinterpret_cast<std::uintptr_t>(address), bytes}});
}

void span_registry::granted(void* address, std::size_t bytes) {
  const auto lo = reinterpret_cast<std::uintptr_t>(address);
  std::vector<span> now_usable;
  {
    const std::lock_guard lock(mutex_);
    for (auto it = spans_.lower_bound(lo); it != spans_.end() && it->first < lo + bytes; ++it) {
      if (it->second.usable) continue;
      it->second.usable = true;
      now_usable.push_back({it->first, it->second.bytes});
    }
  }
  announce(device_backend::span_event::mapped, now_usable);
}

std::vector<span_registry::span> span_registry::removing(void* address, std::size_t bytes) {
  const auto lo = reinterpret_cast<std::uintptr_t>(address);
  std::vector<span> usable;
  {
    const std::lock_guard lock(mutex_);
    auto it = spans_.lower_bound(lo);
    while (it != spans_.end() && it->first < lo + bytes) {
      if (it->second.usable) usable.push_back({it->first, it->second.bytes});
      it = spans_.erase(it);
    }
  }
  announce(device_backend::span_event::unmapping, usable);
  return usable;
}

void span_registry::restore(const std::vector<span>& spans) {
  {
    const std::lock_guard lock(mutex_);
    for (const span& s : spans) spans_[s.address] = entry{s.bytes, true};
  }
  announce(device_backend::span_event::mapped, spans);
}

void span_registry::for_each(const std::function<void(void*, std::size_t)>& f) const {
  std::vector<span> usable;
  {
    const std::lock_guard lock(mutex_);
    for (const auto& [address, e] : spans_) {
      if (e.usable) usable.push_back({address, e.bytes});
    }
  }
  for (const span& s : usable) f(reinterpret_cast<void*>(s.address), s.bytes);
}

}  // namespace fragctl
