// The jemalloc provider of pinned_host_arena: a dedicated arena whose extent
// hooks pin pages through the backend.
//
// Theory. jemalloc asks its extent hooks for extents (in libfragctl_jemalloc,
// built without retained growth, the size an allocation needs; in a process's
// jemalloc, a geometric series capped here at 64 MiB beyond it) and carves
// them with split. With `dalloc` left null it never hands an extent back, and
// with both decay times at -1 it never purges one, so after warm-up every
// allocation is served from extents pinned earlier: no allocate_host in
// steady state. Merge is refused across extents pinned by different calls, so
// no buffer spans two pinned allocations (a DMA engine sees each as its own
// registration). On destruction the arena is destroyed first (jemalloc
// forgets every extent, its metadata included, which also lives in pinned
// pages), then every pinned extent is unpinned.
//
// Finding jemalloc, in order: libfragctl_jemalloc.so already in the global
// scope (the program links or preloads it); the same library opened now (it
// needs 2.6 KiB of static TLS, which a late dlopen usually cannot get); a
// jemalloc 5 that already serves the process (LD_PRELOAD=libjemalloc.so.2).
// docs/checkpoint.md explains why libfragctl.so itself never contains one.
#include <dlfcn.h>

#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>

#include "absl/container/btree_map.h"
#include "checkpoint/host_providers.hpp"
#include "fmt/format.h"
#include "fragctl/error.hpp"
#include "fragctl/log.hpp"

#if FRAGCTL_HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

namespace fragctl::checkpoint {

#if FRAGCTL_HAVE_JEMALLOC

namespace {

template <class F>
bool resolve(void* handle, const char* name, F& out) {
  void* sym = dlsym(handle, name);
  out = reinterpret_cast<F>(sym);
  return sym != nullptr;
}

/// Fills `api` from `handle` with names prefixed by `prefix`; checks that it
/// is jemalloc 5 (extent hooks as this file knows them).
bool load(void* handle, const char* prefix, std::string_view source, jemalloc_api& api) {
  const std::string p(prefix);
  if (!resolve(handle, (p + "mallocx").c_str(), api.mallocx) ||
      !resolve(handle, (p + "dallocx").c_str(), api.dallocx) ||
      !resolve(handle, (p + "mallctl").c_str(), api.mallctl)) {
    return false;
  }
  const char* version = nullptr;
  std::size_t len = sizeof(version);
  if (api.mallctl("version", &version, &len, nullptr, 0) != 0 || version == nullptr ||
      std::strncmp(version, "5.", 2) != 0) {
    logger().info("pinned host arena: {} jemalloc is version {}, not 5.x; not used", source,
                  version == nullptr ? "unknown" : version);
    return false;
  }
  api.source = source;
  return true;
}

jemalloc_api discover() {
  jemalloc_api api;
  if (load(RTLD_DEFAULT, "fragctl_jemalloc_", "libfragctl_jemalloc", api)) return api;

  std::string why;
  Dl_info self{};
  std::vector<std::string> candidates;
  if (dladdr(reinterpret_cast<void*>(&discover), &self) != 0 && self.dli_fname != nullptr) {
    candidates.push_back(
        (std::filesystem::path(self.dli_fname).parent_path() / "libfragctl_jemalloc.so").string());
  }
  candidates.emplace_back("libfragctl_jemalloc.so");
  for (const std::string& name : candidates) {
    if (void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL); h != nullptr) {
      if (load(h, "fragctl_jemalloc_", "libfragctl_jemalloc", api)) return api;
    } else {
      why = dlerror();
    }
  }
  // A jemalloc that already serves the process: preloaded, linked, or static.
  if (void* h = dlopen("libjemalloc.so.2", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD); h != nullptr) {
    if (load(h, "", "process", api)) return api;
  }
  if (load(RTLD_DEFAULT, "", "process", api)) return api;
  logger().info("pinned host arena: no jemalloc ({}); pinned buffers come from size classes",
                why.empty() ? "libfragctl_jemalloc.so not found" : why);
  return {};
}

class jemalloc_provider final : public pinned_host_arena::impl {
 public:
  jemalloc_provider(device_backend& backend, const jemalloc_api& api) : backend_(backend), api_(api) {
    hooks_.owner = this;
    hooks_.table = extent_hooks_t{&alloc_hook, nullptr,      &destroy_hook, &commit_hook, &decommit_hook,
                                  nullptr,     nullptr,      &split_hook,   &merge_hook};
    extent_hooks_t* table = &hooks_.table;
    std::size_t len = sizeof(arena_);
    if (const int rc = api_.mallctl("arenas.create", &arena_, &len, &table, sizeof(table)); rc != 0) {
      throw backend_error(fmt::format("pinned host arena: jemalloc arenas.create failed ({})", rc), rc,
                          "arenas.create");
    }
    // Never purge: pinned pages are the point of the arena.
    for (const char* knob : {"dirty_decay_ms", "muzzy_decay_ms"}) {
      ssize_t never = -1;
      const std::string name = fmt::format("arena.{}.{}", arena_, knob);
      if (api_.mallctl(name.c_str(), nullptr, nullptr, &never, sizeof(never)) != 0) {
        logger().warn("pinned host arena: cannot set {}", name);
      }
    }
    // A jemalloc that retains (the process's; libfragctl_jemalloc turns it
    // off) grows its extents geometrically: 7.6 GiB pinned for 5.5 GiB of
    // 256 MiB buffers. Cap the growth at 64 MiB beyond a request.
    bool retain = false;
    std::size_t len_retain = sizeof(retain);
    if (api_.mallctl("opt.retain", &retain, &len_retain, nullptr, 0) == 0 && retain) {
      std::size_t grow_limit = 64 * MiB;
      const std::string limit_name = fmt::format("arena.{}.retain_grow_limit", arena_);
      if (api_.mallctl(limit_name.c_str(), nullptr, nullptr, &grow_limit, sizeof(grow_limit)) != 0) {
        logger().warn("pinned host arena: cannot set {}", limit_name);
      }
    }
    flags_ = static_cast<int>(MALLOCX_ARENA(arena_)) | MALLOCX_TCACHE_NONE;
  }

  ~jemalloc_provider() override {
    const std::string name = fmt::format("arena.{}.destroy", arena_);
    if (api_.mallctl(name.c_str(), nullptr, nullptr, nullptr, 0) != 0) {
      // Without the destroy jemalloc may still touch the extents: keep them pinned.
      logger().error("pinned host arena: {} failed; its pinned memory is not released", name);
      return;
    }
    const std::lock_guard lock(mu_);
    for (const auto& [start, c] : chunks_) {
      try {
        backend_.free_host(c.pinned, c.pinned_bytes);
      } catch (const std::exception& e) {
        logger().warn("pinned host arena: unpinning {} bytes failed: {}", c.pinned_bytes, e.what());
      }
    }
  }

  void* allocate(std::size_t bytes) override {
    // Page-aligned from 16 KiB: jemalloc would otherwise start large buffers
    // at a random cache line of their first page (cache-oblivious layout).
    constexpr std::size_t large = 16 * KiB;
    return api_.mallocx(bytes, bytes >= large ? flags_ | static_cast<int>(MALLOCX_LG_ALIGN(12)) : flags_);
  }
  void deallocate(void* ptr, std::size_t /*bytes*/) noexcept override {
    api_.dallocx(ptr, MALLOCX_TCACHE_NONE);
  }
  [[nodiscard]] host_provider provider() const noexcept override { return host_provider::jemalloc; }
  [[nodiscard]] std::string_view source() const noexcept override { return api_.source; }
  [[nodiscard]] host_arena_stats pinning() const override {
    const std::lock_guard lock(mu_);
    host_arena_stats s;
    s.pinned_bytes = pinned_bytes_;
    s.pin_calls = pin_calls_;
    return s;
  }

 private:
  struct chunk {
    std::size_t bytes = 0;         ///< usable bytes from the chunk's key
    void* pinned = nullptr;        ///< what allocate_host returned
    std::size_t pinned_bytes = 0;  ///< what was asked of it
  };
  // jemalloc passes back the table pointer it was given: the table is the
  // first member, so the hooks find their provider from it.
  struct hook_block {
    extent_hooks_t table;
    jemalloc_provider* owner = nullptr;
  };
  static jemalloc_provider& owner_of(extent_hooks_t* table) noexcept {
    return *reinterpret_cast<hook_block*>(table)->owner;
  }

  void* pin(void* new_addr, std::size_t size, std::size_t alignment, bool* zero, bool* commit) noexcept;
  [[nodiscard]] bool same_chunk(const void* a, const void* end) const noexcept;

  static void* alloc_hook(extent_hooks_t* table, void* new_addr, std::size_t size, std::size_t alignment,
                          bool* zero, bool* commit, unsigned /*arena*/) {
    return owner_of(table).pin(new_addr, size, alignment, zero, commit);
  }
  static void destroy_hook(extent_hooks_t*, void*, std::size_t, bool, unsigned) {}
  static bool commit_hook(extent_hooks_t*, void*, std::size_t, std::size_t, std::size_t, unsigned) {
    return false;  // pinned pages are always committed
  }
  static bool decommit_hook(extent_hooks_t*, void*, std::size_t, std::size_t, std::size_t, unsigned) {
    return true;  // and cannot be decommitted
  }
  static bool split_hook(extent_hooks_t*, void*, std::size_t, std::size_t, std::size_t, bool, unsigned) {
    return false;
  }
  static bool merge_hook(extent_hooks_t* table, void* a, std::size_t, void* b, std::size_t size_b, bool,
                         unsigned) {
    return !owner_of(table).same_chunk(a, static_cast<char*>(b) + size_b);
  }

  device_backend& backend_;
  const jemalloc_api api_;
  hook_block hooks_{};
  unsigned arena_ = 0;
  int flags_ = 0;
  // std::mutex: ThreadSanitizer sees it (Debian's absl::Mutex is not instrumented).
  mutable std::mutex mu_;
  absl::btree_map<std::uintptr_t, chunk> chunks_;
  std::size_t pinned_bytes_ = 0;
  std::uint64_t pin_calls_ = 0;
};

void* jemalloc_provider::pin(void* new_addr, std::size_t size, std::size_t alignment, bool* zero,
                             bool* commit) noexcept {
  if (new_addr != nullptr) return nullptr;  // no placement at a given address
  constexpr std::size_t page = 4096;
  const std::size_t extra = alignment > page ? alignment : 0;
  try {
    void* pinned = backend_.allocate_host(size + extra);
    if (pinned == nullptr) return nullptr;
    const std::uintptr_t start = round_up(reinterpret_cast<std::uintptr_t>(pinned), std::max(alignment, page));
    if (start + size > reinterpret_cast<std::uintptr_t>(pinned) + size + extra) {
      backend_.free_host(pinned, size + extra);  // the backend gave less than page alignment
      return nullptr;
    }
    void* p = reinterpret_cast<void*>(start);
    if (*zero) std::memset(p, 0, size);
    *commit = true;
    const std::lock_guard lock(mu_);
    chunks_.emplace(start, chunk{size, pinned, size + extra});
    pinned_bytes_ += size + extra;
    ++pin_calls_;
    return p;
  } catch (const std::exception& e) {
    logger().error("pinned host arena: pinning {} bytes failed: {}", size, e.what());
    return nullptr;
  }
}

bool jemalloc_provider::same_chunk(const void* a, const void* end) const noexcept {
  const auto lo = reinterpret_cast<std::uintptr_t>(a);
  const auto hi = reinterpret_cast<std::uintptr_t>(end);
  const std::lock_guard lock(mu_);
  auto it = chunks_.upper_bound(lo);
  if (it == chunks_.begin()) return false;
  --it;
  return it->first <= lo && hi <= it->first + it->second.bytes;
}

}  // namespace

const jemalloc_api* find_jemalloc() {
  static const jemalloc_api api = discover();
  return api.mallocx == nullptr ? nullptr : &api;
}

std::unique_ptr<pinned_host_arena::impl> make_jemalloc_provider(device_backend& backend,
                                                                const jemalloc_api& api) {
  return std::make_unique<jemalloc_provider>(backend, api);
}

#else  // built without jemalloc.h

const jemalloc_api* find_jemalloc() { return nullptr; }

std::unique_ptr<pinned_host_arena::impl> make_jemalloc_provider(device_backend&, const jemalloc_api&) {
  throw backend_error("pinned host arena: fragctl was built without jemalloc", 0, "not_supported");
}

#endif

}  // namespace fragctl::checkpoint
