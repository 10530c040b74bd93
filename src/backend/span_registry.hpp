// The spans of physical memory a backend has made usable, and who watches
// them (device_backend::watch_spans, for_each_span).
//
// A span is one raw allocation or one mapped handle. A mapped handle becomes
// usable when a set_access covering it succeeds (until then it is only
// recorded); a set_access over a run of handles announces each handle on its
// own, so no reported range ever crosses two handles. An unmap announces
// every usable span it takes before the driver call, and puts them back
// (announcing them again) when that call throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "fragctl/backend.hpp"

namespace fragctl {

class span_registry {
 public:
  struct span {
    std::uintptr_t address = 0;
    std::size_t bytes = 0;
  };

  void watch(device_backend::span_observer observer, void* context);
  /// A raw allocation (usable at once) or a mapped handle (usable once granted).
  void added(void* address, std::size_t bytes, bool usable);
  /// set_access succeeded on [address, address + bytes).
  void granted(void* address, std::size_t bytes);
  /// [address, address + bytes) is about to be unmapped or freed: announces
  /// and forgets every span in it; returns the usable ones (for restore).
  std::vector<span> removing(void* address, std::size_t bytes);
  /// The unmap or free of `spans` failed: they are usable again.
  void restore(const std::vector<span>& spans);
  void for_each(const std::function<void(void*, std::size_t)>& f) const;
  /// Runs `call` (the unmap or free of [address, address + bytes)) between
  /// removing() and, should it throw, restore().
  template <class Call>
  void taking(void* address, std::size_t bytes, Call&& call) {
    const std::vector<span> taken = removing(address, bytes);
    try {
      call();
    } catch (...) {
      restore(taken);
      throw;
    }
  }

 private:
  struct entry {
    std::size_t bytes = 0;
    bool usable = false;
  };
  void announce(device_backend::span_event event, const std::vector<span>& spans) const;

  mutable std::mutex mutex_;
  std::map<std::uintptr_t, entry> spans_;
  device_backend::span_observer observer_ = nullptr;
  void* context_ = nullptr;
};

}  // namespace fragctl
