// Support for the ZeRO-3 driver: the Llama-like model, deterministic
// contents, host<->device transfers through a pinned staging buffer, and a
// small parallel loop for checking gigabytes on the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "fragctl/backend.hpp"
#include "fragctl/zero3/layout.hpp"

namespace zero3_driver {

/// Command-line options: "--key value" pairs.
struct arguments {
  std::map<std::string, std::string> values;
  [[nodiscard]] std::string text(const std::string& key, const std::string& fallback) const;
  [[nodiscard]] std::size_t number(const std::string& key, std::size_t fallback) const;
};
[[nodiscard]] arguments parse_arguments(int argc, char** argv);

/// A Llama-like decoder: embedding, `layers` blocks (two norms, q/k/v/o with
/// grouped kv heads, gate/up/down), final norm and head; bf16 throughout.
struct model_shape {
  std::size_t layers = 24, hidden = 2048, intermediate = 5632, vocab = 32000, heads = 16, kv_heads = 4;
};
[[nodiscard]] std::vector<fragctl::zero3::block_spec> llama_blocks(const model_shape& shape);

/// Word `word` (8 bytes) of block `block`'s gathered buffer, padding included.
[[nodiscard]] std::uint64_t parameter_word(std::size_t block, std::size_t word) noexcept;
/// Word `word` of the persistent parameter buffer.
[[nodiscard]] std::uint64_t persistent_word(std::size_t word) noexcept;

/// Runs body(begin, end) over [0, n) on up to `threads` threads.
void parallel_for(std::size_t n, unsigned threads, const std::function<void(std::size_t, std::size_t)>& body);

/// Moves bytes between host code and device memory through one pinned buffer.
class device_io {
 public:
  device_io(fragctl::device_backend& backend, std::size_t staging_bytes, unsigned threads);
  ~device_io();
  device_io(const device_io&) = delete;
  device_io& operator=(const device_io&) = delete;

  /// Fills [dst, dst + bytes) with fill(host, offset, n) chunk by chunk
  /// (chunks are multiples of 8 bytes except the last); synchronous.
  void upload(void* dst, std::size_t bytes, fragctl::stream_t stream,
              const std::function<void(void*, std::size_t, std::size_t)>& fill);
  /// Copies [src, src + bytes) to the host chunk by chunk after the work
  /// queued on `stream`, calling visit(host, offset, n); synchronous.
  void download(const void* src, std::size_t bytes, fragctl::stream_t stream,
                const std::function<void(const void*, std::size_t, std::size_t)>& visit);
  [[nodiscard]] unsigned threads() const noexcept { return threads_; }

 private:
  fragctl::device_backend& backend_;
  std::size_t bytes_;
  void* staging_;
  unsigned threads_;
};

}  // namespace zero3_driver
