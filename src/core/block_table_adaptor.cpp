// block_table_adaptor: the live-block table (fragctl/adaptors.hpp).
#include "absl/container/flat_hash_map.h"
#include "fragctl/adaptors.hpp"

namespace fragctl {

struct block_table_adaptor::table {
  absl::flat_hash_map<void*, block_record> live;
};

block_table_adaptor::block_table_adaptor(std::unique_ptr<device_allocator> upstream)
    : forwarding_adaptor(std::move(upstream), "block_table_adaptor"), table_(std::make_unique<table>()) {}

block_table_adaptor::~block_table_adaptor() = default;

std::size_t block_table_adaptor::size() const noexcept { return table_->live.size(); }

void* block_table_adaptor::do_allocate(std::size_t bytes, stream_t stream) {
  void* ptr = upstream().allocate(bytes, stream);
  if (ptr == nullptr) return ptr;
  try {
    table_->live[ptr] = block_record{bytes, stream};
  } catch (...) {
    (void)upstream().try_deallocate(ptr, bytes, stream);  // strong guarantee
    throw;
  }
  return ptr;
}

free_result block_table_adaptor::do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept {
  const free_result result = upstream().try_deallocate(ptr, bytes, stream);
  if (result.status != free_status::not_owned) table_->live.erase(ptr);
  return result;
}

std::optional<block_record> block_table_adaptor::do_block_info(void* ptr) const {
  const auto it = table_->live.find(ptr);
  if (it == table_->live.end()) return std::nullopt;
  return it->second;
}

void block_table_adaptor::do_stream_ending(stream_t stream) {
  // A free that names a block's stream from the table must not name the
  // ended handle. The upstream first: it may fail, this cannot.
  forget_stream(upstream(), stream);
  for (auto& [ptr, record] : table_->live) {
    if (record.stream == stream) record.stream = nullptr;
  }
}

}  // namespace fragctl
