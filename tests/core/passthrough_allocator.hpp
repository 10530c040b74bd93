// A test-only policy with arithmetic simple enough to predict every counter:
// each block is one backend allocation of the request rounded up to 512
// bytes, returned to the backend at once on free (no cache). Misuse is judged
// from a map of live blocks. Works over any backend.
#pragma once

#include <cstddef>
#include <map>
#include <string>

#include "fragctl/backend.hpp"
#include "fragctl/device_allocator.hpp"
#include "fragctl/error.hpp"

namespace fragctl::testing {

class passthrough_allocator final : public device_allocator {
 public:
  explicit passthrough_allocator(device_backend& backend, std::string name = "passthrough")
      : backend_(backend), name_(std::move(name)) {}
  ~passthrough_allocator() override {
    for (const auto& [ptr, bytes] : live_) backend_.free(ptr, round_up(bytes, min_alignment));
  }

  [[nodiscard]] std::size_t live_blocks() const noexcept { return live_.size(); }

 private:
  void* do_allocate(std::size_t bytes, stream_t) override {
    const std::size_t size = round_up(bytes, min_alignment);
    void* ptr = backend_.allocate(size);
    if (ptr == nullptr) {
      oom_details d;
      d.requested = bytes;
      d.reserved = reserved_;
      throw out_of_memory(d, name_.c_str());
    }
    live_[ptr] = bytes;
    reserved_ += size;
    return ptr;
  }

  free_result do_deallocate(void* ptr, std::size_t bytes, stream_t) noexcept override {
    const auto it = live_.find(ptr);
    if (it == live_.end()) return {free_status::not_owned, 0};
    const std::size_t recorded = it->second;
    const std::size_t size = round_up(recorded, min_alignment);
    backend_.free(ptr, size);
    reserved_ -= size;
    live_.erase(it);
    return {recorded == bytes ? free_status::ok : free_status::size_mismatch, recorded};
  }

  std::size_t do_allocation_size(std::size_t bytes) const noexcept override {
    return round_up(bytes, min_alignment);
  }
  pool_state do_state() const override {
    pool_state s;
    s.reserved = reserved_;
    s.allocated = reserved_;
    s.segments = live_.size();
    s.retries = 0;
    return s;
  }
  void do_release_cached() override {}
  device_backend& do_backend() const noexcept override { return backend_; }
  std::string_view do_name() const noexcept override { return name_; }

  device_backend& backend_;
  std::string name_;
  std::map<void*, std::size_t> live_;
  std::size_t reserved_ = 0;
};

}  // namespace fragctl::testing
