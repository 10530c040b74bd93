// libfragctl_jemalloc.so: Debian's static jemalloc (libjemalloc_pic.a) behind
// three exported names.
//
// Debian builds jemalloc without a symbol prefix, so its objects define
// malloc, free and operator new. Linked with --exclude-libs, every one of
// them is local to this library: the process keeps glibc's malloc, and this
// library's only users are the fragctl_jemalloc_* functions below, which the
// pinned host arena finds with dlsym (docs/checkpoint.md). The library needs
// static TLS (jemalloc's thread state is initial-exec), so it is linked into
// programs, not into libfragctl.so, which must stay loadable by dlopen.
#include <cstddef>

extern "C" {
void* mallocx(std::size_t size, int flags);
void dallocx(void* ptr, int flags);
int mallctl(const char* name, void* oldp, std::size_t* oldlenp, void* newp, std::size_t newlen);

// jemalloc reads this weak option string at start-up (MALLOC_CONF still
// overrides it): one automatic arena and no background threads, since only
// the pinned arenas are ever used here; and no retained growth, so that the
// extent hooks are asked for what an allocation needs (a 256 MiB buffer plus
// jemalloc's one-page pad) instead of the next size class of a geometric
// series (320 MiB for it).
__attribute__((visibility("hidden"))) const char* malloc_conf =
    "narenas:1,background_thread:false,retain:false";

__attribute__((visibility("default"))) void* fragctl_jemalloc_mallocx(std::size_t size, int flags) {
  return mallocx(size, flags);
}
__attribute__((visibility("default"))) void fragctl_jemalloc_dallocx(void* ptr, int flags) { dallocx(ptr, flags); }
__attribute__((visibility("default"))) int fragctl_jemalloc_mallctl(const char* name, void* oldp,
                                                                    std::size_t* oldlenp, void* newp,
                                                                    std::size_t newlen) {
  return mallctl(name, oldp, oldlenp, newp, newlen);
}
}
