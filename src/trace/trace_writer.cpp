// Writing fragctl CSV, plain or gzip (zlib's "T" mode writes plain files).
// The file is opened as every output is (core/atomic_file.hpp): written under
// a temporary name beside the path and put there only once whole, so a
// convert killed or out of disk leaves what the path held before, and nothing
// but a regular file is ever replaced. It ends with an `end` row counting its
// rows (docs/traces.md), so a reader tells a whole file from a cut one; a
// trace that was read cut is written cut (the promise of an end row, and
// none), so that converting it does not make it read as whole.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/atomic_file.hpp"
#include "fmt/format.h"
#include "fragctl/adaptors.hpp"
#include "fragctl/trace.hpp"
#include "util/strings.hpp"
#include "zlib.h"

namespace fragctl {

absl::Status write_trace_csv(const trace& t, const std::string& path) {
  const bool compress = path.size() > 3 && util::lower(path.substr(path.size() - 3)) == ".gz";
  absl::StatusOr<detail::output_file> out = detail::output_file::open(path, "trace");
  if (!out.ok()) return out.status();
  errno = 0;
  const int fd = ::fcntl(out->fd(), F_DUPFD_CLOEXEC, 0);  // zlib closes what it is given
  gzFile file = fd < 0 ? nullptr : gzdopen(fd, compress ? "wb6" : "wbT");
  if (file == nullptr) {
    if (fd >= 0) ::close(fd);
    return absl::UnavailableError(
        fmt::format("{}: cannot open for writing: {}", path, errno != 0 ? std::strerror(errno) : "out of memory"));
  }

  fmt::memory_buffer buffer;
  bool ok = true;
  const auto flush = [&] {
    if (buffer.size() == 0) return;
    ok = ok && gzwrite(file, buffer.data(), static_cast<unsigned>(buffer.size())) ==
                   static_cast<int>(buffer.size());
    buffer.clear();
  };
  const bool cut = t.completeness == trace_completeness::cut;
  fmt::format_to(std::back_inserter(buffer), "action,addr,size,stream,time_us\n");
  if (cut) fmt::format_to(std::back_inserter(buffer), "{}\n", trace_end_row_promise);
  for (const trace_event& e : t.events) {
    fmt::format_to(std::back_inserter(buffer), "{},{},{},{},{}\n",
                   e.kind == trace_event::action::alloc ? "alloc" : "free_requested", e.addr,
                   e.size, e.stream, e.time_us);
    if (buffer.size() >= (1u << 20)) flush();
  }
  if (!cut) {
    fmt::format_to(std::back_inserter(buffer), "end,0,{},0,{}\n", t.events.size(),
                   t.events.empty() ? 0 : t.events.back().time_us);
  }
  flush();
  int code = Z_OK;
  const std::string error = ok ? std::string() : gzerror(file, &code);
  const int closed = gzclose(file);
  if (!ok || closed != Z_OK)
    return absl::DataLossError(fmt::format("{}: cannot write: {}", path,
                                           ok ? std::string(std::strerror(errno)) : error));
  if (absl::Status s = out->close(); !s.ok()) return s;
  return out->publish();
}

}  // namespace fragctl
