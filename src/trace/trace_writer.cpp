// Writing fragctl CSV, plain or gzip (zlib's "T" mode writes plain files).
#include <cerrno>
#include <cstring>

#include "fmt/format.h"
#include "fragctl/trace.hpp"
#include "util/strings.hpp"
#include "zlib.h"

namespace fragctl {

absl::Status write_trace_csv(const trace& t, const std::string& path) {
  const bool compress = path.size() > 3 && util::lower(path.substr(path.size() - 3)) == ".gz";
  errno = 0;
  gzFile file = gzopen(path.c_str(), compress ? "wb6" : "wbT");
  if (file == nullptr)
    return absl::PermissionDeniedError(fmt::format(
        "{}: cannot open for writing: {}", path, errno != 0 ? std::strerror(errno) : "out of memory"));

  fmt::memory_buffer buffer;
  bool ok = true;
  const auto flush = [&] {
    if (buffer.size() == 0) return;
    ok = ok && gzwrite(file, buffer.data(), static_cast<unsigned>(buffer.size())) ==
                   static_cast<int>(buffer.size());
    buffer.clear();
  };
  fmt::format_to(std::back_inserter(buffer), "action,addr,size,stream,time_us\n");
  for (const trace_event& e : t.events) {
    fmt::format_to(std::back_inserter(buffer), "{},{},{},{},{}\n",
                   e.kind == trace_event::action::alloc ? "alloc" : "free_requested", e.addr,
                   e.size, e.stream, e.time_us);
    if (buffer.size() >= (1u << 20)) flush();
  }
  flush();
  int code = Z_OK;
  const std::string error = ok ? std::string() : gzerror(file, &code);
  const int closed = gzclose(file);
  if (!ok || closed != Z_OK)
    return absl::DataLossError(fmt::format("{}: cannot write: {}", path,
                                           ok ? std::string(std::strerror(errno)) : error));
  return absl::OkStatus();
}

}  // namespace fragctl
