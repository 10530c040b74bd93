#include "driver_support.hpp"

#include <algorithm>
#include <stdexcept>
#include <thread>

#include "fmt/format.h"
#include "util/strings.hpp"

namespace zero3_driver {

std::string arguments::text(const std::string& key, const std::string& fallback) const {
  auto it = values.find(key);
  return it == values.end() ? fallback : it->second;
}

std::size_t arguments::number(const std::string& key, std::size_t fallback) const {
  auto it = values.find(key);
  if (it == values.end()) return fallback;
  std::uint64_t n = 0;
  if (!fragctl::util::parse_u64(it->second, n)) {
    throw std::invalid_argument(fmt::format("--{}: \"{}\" is not a number", key, it->second));
  }
  return static_cast<std::size_t>(n);
}

arguments parse_arguments(int argc, char** argv) {
  arguments a;
  for (int i = 1; i < argc; ++i) {
    const std::string key = argv[i];
    if (!key.starts_with("--") || i + 1 >= argc) throw std::invalid_argument(fmt::format("expected --key value at \"{}\"", key));
    a.values[key.substr(2)] = argv[++i];
  }
  return a;
}

std::vector<fragctl::zero3::block_spec> llama_blocks(const model_shape& s) {
  using fragctl::zero3::block_spec;
  const std::size_t kv = s.hidden / s.heads * s.kv_heads;
  std::vector<block_spec> blocks;
  blocks.push_back({"embed", {{"embed_tokens", s.vocab * s.hidden, 2, true}}});
  for (std::size_t i = 0; i < s.layers; ++i) {
    blocks.push_back({fmt::format("layers.{}", i),
                      {{"input_layernorm", s.hidden, 2, true},
                       {"q_proj", s.hidden * s.hidden, 2, true},
                       {"k_proj", s.hidden * kv, 2, true},
                       {"v_proj", s.hidden * kv, 2, true},
                       {"o_proj", s.hidden * s.hidden, 2, true},
                       {"post_attention_layernorm", s.hidden, 2, true},
                       {"gate_proj", s.hidden * s.intermediate, 2, true},
                       {"up_proj", s.hidden * s.intermediate, 2, true},
                       {"down_proj", s.intermediate * s.hidden, 2, true}}});
  }
  blocks.push_back({"head", {{"norm", s.hidden, 2, true}, {"lm_head", s.vocab * s.hidden, 2, true}}});
  return blocks;
}

namespace {
std::uint64_t splitmix(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

std::uint64_t parameter_word(std::size_t block, std::size_t word) noexcept {
  return splitmix((static_cast<std::uint64_t>(block) + 1) * 0x100000001b3ULL ^ (static_cast<std::uint64_t>(word) << 8));
}

std::uint64_t persistent_word(std::size_t word) noexcept { return splitmix(0xfeedULL ^ (static_cast<std::uint64_t>(word) << 8)); }

void parallel_for(std::size_t n, unsigned threads, const std::function<void(std::size_t, std::size_t)>& body) {
  const std::size_t parts = std::max<std::size_t>(1, std::min<std::size_t>(threads, n / 4096 + 1));
  if (parts == 1) {
    body(0, n);
    return;
  }
  std::vector<std::thread> pool;
  const std::size_t step = (n + parts - 1) / parts;
  for (std::size_t p = 0; p < parts; ++p) {
    const std::size_t begin = std::min(n, p * step);
    const std::size_t end = std::min(n, begin + step);
    pool.emplace_back([&body, begin, end] { body(begin, end); });
  }
  for (std::thread& t : pool) t.join();
}

device_io::device_io(fragctl::device_backend& backend, std::size_t staging_bytes, unsigned threads)
    : backend_(backend), bytes_(staging_bytes), staging_(backend.allocate_host(staging_bytes)), threads_(threads) {
  if (staging_ == nullptr) throw std::runtime_error("cannot allocate the pinned staging buffer");
}

device_io::~device_io() { backend_.free_host(staging_, bytes_); }

void device_io::upload(void* dst, std::size_t bytes, fragctl::stream_t stream,
                       const std::function<void(void*, std::size_t, std::size_t)>& fill) {
  for (std::size_t done = 0; done < bytes;) {
    const std::size_t n = std::min(bytes_, bytes - done);
    fill(staging_, done, n);
    backend_.memcpy_async(static_cast<unsigned char*>(dst) + done, staging_, n, stream);
    backend_.synchronize_stream(stream);
    done += n;
  }
}

void device_io::download(const void* src, std::size_t bytes, fragctl::stream_t stream,
                         const std::function<void(const void*, std::size_t, std::size_t)>& visit) {
  for (std::size_t done = 0; done < bytes;) {
    const std::size_t n = std::min(bytes_, bytes - done);
    backend_.memcpy_async(staging_, static_cast<const unsigned char*>(src) + done, n, stream);
    backend_.synchronize_stream(stream);
    visit(staging_, done, n);
    done += n;
  }
}

}  // namespace zero3_driver
