// Issue 27: pickle memo expansion peaked at 231 MiB for a 1 KB file while
// docs/reliability.md promises 16 times the file plus 64 MiB. This program
// counts every byte the heap hands out (a replaced global operator new) and
// checks read_pickle's peak against that bound for hostile pickles that
// expand through the memo into each kind of JSON value.
#include <malloc.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>

#include "fragctl/trace.hpp"
#include "trace/pickle_reader.hpp"

namespace {

std::atomic<std::size_t> live{0};
std::atomic<std::size_t> peak{0};

void* counted(std::size_t bytes) {
  void* p = std::malloc(bytes == 0 ? 1 : bytes);
  if (p == nullptr) throw std::bad_alloc();
  const std::size_t now = live.fetch_add(malloc_usable_size(p)) + malloc_usable_size(p);
  std::size_t seen = peak.load();
  while (now > seen && !peak.compare_exchange_weak(seen, now)) {
  }
  return p;
}

void uncounted(void* p) noexcept {
  if (p == nullptr) return;
  live.fetch_sub(malloc_usable_size(p));
  std::free(p);
}

}  // namespace

void* operator new(std::size_t bytes) { return counted(bytes); }
void* operator new[](std::size_t bytes) { return counted(bytes); }
void operator delete(void* p) noexcept { uncounted(p); }
void operator delete[](void* p) noexcept { uncounted(p); }
void operator delete(void* p, std::size_t) noexcept { uncounted(p); }
void operator delete[](void* p, std::size_t) noexcept { uncounted(p); }
void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept {
  try {
    return counted(bytes);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new[](std::size_t bytes, const std::nothrow_t& tag) noexcept { return operator new(bytes, tag); }
void operator delete(void* p, const std::nothrow_t&) noexcept { uncounted(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { uncounted(p); }

namespace {

using fragctl::trace_detail::read_pickle;

/// The most heap read_pickle(content) holds at once beyond what was held
/// before, and whether it read the pickle.
struct measured {
  std::size_t peak_bytes = 0;
  bool ok = false;
  std::string error;
};

measured measure(const std::string& content) {
  measured m;
  const std::size_t before = live.load();
  peak.store(before);
  {
    auto read = read_pickle(content, "evil.pickle");
    m.ok = read.ok();
    if (!read.ok()) m.error = std::string(read.status().message());
  }
  m.peak_bytes = peak.load() - before;
  return m;
}

std::size_t bound(const std::string& content) { return 16 * content.size() + (std::size_t{64} << 20); }

// Memo index i as a BINGET operand (one byte: i < 256).
std::string get(int i) { return std::string("h") + static_cast<char>(i); }
std::string put(int i) { return std::string("q") + static_cast<char>(i); }

// `steps` levels of C[i+1] = container(C[i], C[i]) over `leaf`, each level
// memoized: 2^steps leaves from a few bytes per level. `open` and `close`
// build one level from the two references (list, tuple, dict with keys).
std::string doubling(const std::string& leaf, int steps, const std::string& open, const std::string& middle,
                     const std::string& close) {
  std::string p = "\x80\x02" + leaf + put(0);
  for (int i = 0; i < steps; ++i) p += open + get(i) + middle + get(i) + close + put(i + 1);
  return p + ".";
}

std::string short_text(const char* s) {
  std::string t = "X";
  const std::size_t n = std::char_traits<char>::length(s);
  for (int i = 0; i < 4; ++i) t += static_cast<char>((n >> (8 * i)) & 0xff);
  return t + s;
}

TEST(PickleMemory, MemoExpansionStaysWithinSixteenTimesTheFilePlus64MiB) {
  const std::string cases[] = {
      // [L, L] of None, of a 32-byte string, of 1.
      doubling("N", 60, "(", "", "l"),
      doubling(short_text("0123456789abcdef0123456789abcdef"), 60, "(", "", "l"),
      doubling("K\x01", 60, "(", "", "t"),
      // {"a": D, "b": D}: a map node per entry, the dearest JSON value.
      doubling("}", 60, "(" + short_text("a"), short_text("b"), "d"),
      // Keys longer than the short-string buffer.
      doubling("}", 60, "(" + short_text("a-key-longer-than-sixteen-bytes"),
               short_text("b-key-longer-than-sixteen-bytes"), "d"),
  };
  for (const std::string& content : cases) {
    const measured m = measure(content);
    EXPECT_FALSE(m.ok) << "2^60 values were read";
    EXPECT_NE(m.error.find("expands beyond"), std::string::npos) << m.error;
    EXPECT_LE(m.peak_bytes, bound(content))
        << "peak " << m.peak_bytes << " bytes for " << content.size() << " bytes of pickle: " << m.error;
  }
}

TEST(PickleMemory, ARealSnapshotStillReads) {
  // The control: a snapshot-shaped pickle of 20,000 events (keys shared
  // through the memo, as pickle.dump writes them) reads within the bound.
  std::string p = "\x80\x02}" + put(0) + short_text("device_traces") + put(1) + "](";
  p += "]" + put(2) + "(";
  const char* keys[] = {"action", "addr", "size", "stream", "time_us"};
  for (int e = 0; e < 20000; ++e) {
    p += "}(";
    for (int k = 0; k < 5; ++k) {
      if (e == 0) {
        p += short_text(keys[k]) + put(3 + k);
      } else {
        p += get(3 + k);
      }
      if (k == 0) {
        p += e == 0 ? short_text("alloc") + put(8) : get(8);
      } else {
        p += "J";
        for (int i = 0; i < 4; ++i) p += static_cast<char>(((e * 512 + k) >> (8 * i)) & 0xff);
      }
    }
    p += "u";
  }
  p += "ee";  // APPENDS into the device list, then into device_traces
  p += "s.";  // SETITEM
  const measured m = measure(p);
  EXPECT_TRUE(m.ok) << m.error;
  EXPECT_LE(m.peak_bytes, bound(p));
  std::printf("snapshot: %zu bytes of pickle, peak %zu bytes (%.1f x)\n", p.size(), m.peak_bytes,
              static_cast<double>(m.peak_bytes) / static_cast<double>(p.size()));
}

}  // namespace
