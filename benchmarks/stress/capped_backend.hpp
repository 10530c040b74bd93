// A backend of fixed capacity over a real one: what "a smaller GPU" means to
// an allocator. Every call goes to the wrapped backend; raw allocations and
// physical handles that would take the bytes held above the cap fail as out
// of memory (nullptr / nullopt, as the contract says), and get_memory_info
// reports the cap as the device's total. The cap is on *reserved* bytes
// (what the allocator holds from the device), the ones a real device runs
// out of, unlike the limiting adaptor's cap on requested bytes.
//
// The same wrapper over `sim` and over `cuda` caps the same bytes, so the
// stress benchmark finds a cap on the simulator and times it on the GPU.
// Thread-safe as the wrapped backend is; the cap check and the allocation
// are not one atomic step, so concurrent allocations may overshoot the cap
// by one request (the stress benchmark is single-threaded).
#pragma once

#include <cstddef>
#include <memory>

#include "fragctl/backend.hpp"

namespace fragctl::bench {

class capped_backend final : public device_backend {
 public:
  /// Wraps `inner` with a cap of `cap` bytes (0: no cap, the inner's own).
  capped_backend(std::unique_ptr<device_backend> inner, std::size_t cap);

  [[nodiscard]] std::string_view name() const noexcept override { return inner_->name(); }
  [[nodiscard]] int device() const noexcept override { return inner_->device(); }
  [[nodiscard]] bool supports_virtual_memory() const noexcept override {
    return inner_->supports_virtual_memory();
  }
  [[nodiscard]] std::size_t granularity() const noexcept override { return inner_->granularity(); }
  [[nodiscard]] std::size_t cap() const noexcept { return cap_; }
  [[nodiscard]] device_backend& inner() const noexcept { return *inner_; }

 private:
  [[nodiscard]] bool fits(std::size_t bytes) const noexcept;

  void* do_allocate(std::size_t bytes) override;
  void do_free(void* ptr, std::size_t bytes) override;
  void* do_reserve_address(std::size_t bytes, std::size_t alignment) override;
  void do_release_address(void* base, std::size_t bytes) override;
  std::optional<physical_handle> do_create_physical(std::size_t bytes) override;
  void do_release_physical(physical_handle handle, std::size_t bytes) override;
  bool do_map(void* va, std::size_t bytes, physical_handle handle) override;
  bool do_set_access(void* va, std::size_t bytes) override;
  void do_unmap(void* va, std::size_t bytes) override;
  event_t do_create_event() override;
  void do_destroy_event(event_t event) override;
  void do_record_event(event_t event, stream_t stream) override;
  bool do_query_event(event_t event) override;
  void do_synchronize_event(event_t event) override;
  void do_synchronize_stream(stream_t stream) override;
  void do_wait_event(stream_t stream, event_t event) override;
  stream_t do_create_stream() override;
  void do_destroy_stream(stream_t stream) override;
  memory_info do_get_memory_info() override;
  void* do_allocate_host(std::size_t bytes) override;
  void do_free_host(void* ptr, std::size_t bytes) override;
  void do_memcpy_async(void* dst, const void* src, std::size_t bytes, stream_t stream) override;

  std::unique_ptr<device_backend> inner_;
  std::size_t cap_;
};

}  // namespace fragctl::bench
