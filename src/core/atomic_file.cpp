// Atomic whole-file writes (core/atomic_file.hpp).
#include "core/atomic_file.hpp"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "fmt/format.h"

namespace fragctl::detail {
namespace {

// A temporary file beside `path`, created exclusively under an unpredictable
// name. Returns its descriptor and fills `temp`, or -1 with errno.
int create_temporary(const std::string& path, std::string& temp) {
  const std::size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  for (int attempt = 0; attempt < 16; ++attempt) {
    std::uint64_t nonce = 0;
    if (::getrandom(&nonce, sizeof nonce, 0) != static_cast<ssize_t>(sizeof nonce)) {
      nonce = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
              (static_cast<std::uint64_t>(::getpid()) << 32) ^ static_cast<std::uint64_t>(attempt);
    }
    temp = fmt::format("{}.{}.tmp.{:016x}", dir, base, nonce);
    const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  return -1;
}

bool write_all_bytes(int fd, std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    text.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

}  // namespace

absl::Status write_file_atomically(const std::string& path, std::string_view text, std::string_view what) {
  if (path.empty()) return absl::InvalidArgumentError(fmt::format("{}: no path given", what));
  std::string temp;
  const int fd = create_temporary(path, temp);
  if (fd < 0) {
    return absl::UnavailableError(
        fmt::format("{}: cannot create a temporary file beside \"{}\": {}", what, path, std::strerror(errno)));
  }
  const bool written = write_all_bytes(fd, text);
  const bool closed = ::close(fd) == 0;
  if (!written || !closed) {
    ::unlink(temp.c_str());
    return absl::UnavailableError(fmt::format("{}: cannot write \"{}\"", what, temp));
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    return absl::UnavailableError(
        fmt::format("{}: cannot rename \"{}\" to \"{}\": {}", what, temp, path, std::strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace fragctl::detail
