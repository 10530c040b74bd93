// forwarding_adaptor: every call passed to the upstream unchanged.
#include <string>

#include "fmt/format.h"
#include "fragctl/adaptors.hpp"
#include "fragctl/error.hpp"

namespace fragctl {

forwarding_adaptor::forwarding_adaptor(std::unique_ptr<device_allocator> upstream, std::string_view adaptor)
    : upstream_(std::move(upstream)) {
  if (!upstream_) throw invalid_argument(fmt::format("{}: upstream is null", adaptor));
  const auto* below = dynamic_cast<const forwarding_adaptor*>(upstream_.get());
  sizer_ = below != nullptr ? below->sizer_ : upstream_.get();
}

void* forwarding_adaptor::do_allocate(std::size_t bytes, stream_t stream) { return upstream_->allocate(bytes, stream); }
free_result forwarding_adaptor::do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept {
  return upstream_->try_deallocate(ptr, bytes, stream);
}
std::size_t forwarding_adaptor::do_allocation_size(std::size_t bytes) const noexcept {
  return sizer_->allocation_size(bytes);
}
pool_state forwarding_adaptor::do_state() const { return upstream_->state(); }
void forwarding_adaptor::do_release_cached() { upstream_->release_cached(); }
device_backend& forwarding_adaptor::do_backend() const noexcept { return upstream_->backend(); }
std::string_view forwarding_adaptor::do_name() const noexcept { return upstream_->name(); }
memory_snapshot forwarding_adaptor::do_memory_map() const { return upstream_->memory_map(); }
void forwarding_adaptor::do_record_stream(void* ptr, stream_t stream) { upstream_->record_stream(ptr, stream); }
bool forwarding_adaptor::do_pause(pause_keep keep) { return upstream_->pause(keep); }
bool forwarding_adaptor::do_resume() { return upstream_->resume(); }
bool forwarding_adaptor::do_paused() const { return upstream_->paused(); }
std::optional<block_record> forwarding_adaptor::do_block_info(void* ptr) const { return upstream_->block_info(ptr); }
void forwarding_adaptor::do_enable_peer_access(int peer) { upstream_->enable_peer_access(peer); }
shared_memory forwarding_adaptor::do_share(void* ptr, std::size_t bytes) const { return upstream_->share(ptr, bytes); }
std::optional<free_result> forwarding_adaptor::do_check_free(void* ptr, std::size_t bytes) const {
  return upstream_->check_free(ptr, bytes);
}
void forwarding_adaptor::do_stream_ending(stream_t stream) { forget_stream(*upstream_, stream); }

}  // namespace fragctl
