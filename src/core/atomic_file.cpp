// Opening, writing and publishing an output file (core/atomic_file.hpp).
#include "core/atomic_file.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <utility>

#include "fmt/format.h"

namespace fragctl::detail {
namespace {

// How old a dead process's temporary must be before another write removes
// it: a process in another pid namespace (a container sharing the
// directory) looks dead from here, and may still be writing it.
constexpr std::time_t stale_after_s = 60;

const char* kind_of(mode_t mode) noexcept {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "a special file";
}

// Root's and this user's links and FIFOs are trusted; another user's may have
// been planted in a shared directory.
bool trusted_owner(const struct stat& st) noexcept { return st.st_uid == 0 || st.st_uid == ::geteuid(); }

absl::Status refused(std::string_view what, const std::string& path, std::string_view is, std::string_view why) {
  return absl::FailedPreconditionError(fmt::format("{}: \"{}\" is {}; {}", what, path, is, why));
}

absl::Status failed(std::string_view what, std::string_view doing, const std::string& path, int err) {
  return absl::UnavailableError(fmt::format("{}: cannot {} \"{}\": {}", what, doing, path, std::strerror(err)));
}

constexpr std::string_view what_is_written =
    "not written (fragctl replaces only a regular file, and writes into a character device or a FIFO)";

void split(const std::string& path, std::string& dir, std::string& base) {
  const std::size_t slash = path.rfind('/');
  dir = slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
  base = slash == std::string::npos ? path : path.substr(slash + 1);
}

// The pid in a temporary's name "<prefix><pid>.<16 hex digits>", or 0.
pid_t temporary_owner(std::string_view name, std::string_view prefix) noexcept {
  if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) return 0;
  name.remove_prefix(prefix.size());
  const std::size_t dot = name.find('.');
  if (dot == 0 || dot == std::string_view::npos || dot > 9 || name.size() - dot - 1 != 16) return 0;
  pid_t pid = 0;
  for (const char c : name.substr(0, dot)) {
    if (c < '0' || c > '9') return 0;
    pid = pid * 10 + (c - '0');
  }
  for (const char c : name.substr(dot + 1))
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return 0;
  return pid;
}

// True at this process's first write of `path`, which sweeps its directory
// for stale temporaries; later writes (a Prometheus file every interval, a
// fuzzer's scratch file) skip the directory read. A small lock-free table of
// path hashes: nothing to lock at fork, and a collision only sweeps again.
bool first_write_of(std::string_view path) noexcept {
  static std::array<std::atomic<std::uint64_t>, 64> swept{};
  std::uint64_t h = 14695981039346656037ull;
  for (const char c : path) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  h |= 1;  // 0 marks an empty slot
  return swept[h % swept.size()].exchange(h, std::memory_order_relaxed) != h;
}

// The part of a temporary's name that stands for `base`: `base` itself, or,
// where the temporary's name would pass the file system's 255-byte limit
// (a valid name of 240 bytes could not be written), its first 183 bytes, "~"
// and a hash of the whole, 200 bytes. The same for every writer of `base`,
// so the stale-temporary sweep finds them.
std::string temporary_stem(const std::string& base) {
  constexpr std::size_t longest = 200;  // + ".", ".tmp.", a pid, ".", 16 hex digits: at most 240
  if (base.size() <= longest) return base;
  std::uint64_t h = 14695981039346656037ull;
  for (const char c : base) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return fmt::format("{}~{:016x}", base.substr(0, longest - 17), h);
}

// Removes the temporaries of `base` in `dir` that a process of this user left
// when it died mid-write. Best effort: a failure changes nothing.
void remove_stale_temporaries(const std::string& dir, const std::string& base) noexcept {
  DIR* d = ::opendir(dir.empty() ? "." : dir.c_str());
  if (d == nullptr) return;
  const std::string prefix = fmt::format(".{}.tmp.", temporary_stem(base));
  const std::time_t now = std::time(nullptr);
  while (const dirent* entry = ::readdir(d)) {
    const pid_t pid = temporary_owner(entry->d_name, prefix);
    if (pid <= 0 || pid == ::getpid()) continue;
    struct stat st {};
    if (::fstatat(::dirfd(d), entry->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || now - st.st_mtime < stale_after_s) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;
    ::unlinkat(::dirfd(d), entry->d_name, 0);
  }
  ::closedir(d);
}

std::uint64_t nonce(int attempt) noexcept {
  std::uint64_t n = 0;
  if (::getrandom(&n, sizeof n, 0) == static_cast<ssize_t>(sizeof n)) return n;
  return static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
         (static_cast<std::uint64_t>(::getpid()) << 32) ^ static_cast<std::uint64_t>(attempt);
}

file_identity identity_of(const struct stat& st) noexcept { return {st.st_dev, st.st_ino}; }

}  // namespace

absl::StatusOr<output_file> output_file::open(const std::string& path, std::string_view what) {
  if (path.empty()) return absl::InvalidArgumentError(fmt::format("{}: no path given", what));
  output_file out;
  out.what_ = std::string(what);
  out.path_ = path;

  struct stat st {};
  bool follow = false;
  bool exists = true;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) return failed(what, "examine", path, errno);
    st.st_mode = S_IFREG;  // nothing there: created as a regular file
    exists = false;
  } else if (S_ISREG(st.st_mode)) {
    // Replaced by a rename, which needs only the directory's write
    // permission: a file this user may not write (another user's, or one
    // made read-only) is refused as a shell's redirection refuses it.
    if (::faccessat(AT_FDCWD, path.c_str(), W_OK, AT_EACCESS) != 0)
      return refused(what, path, fmt::format("a regular file this user may not write ({})", std::strerror(errno)),
                     "not replaced");
  } else if (S_ISLNK(st.st_mode)) {
    if (!trusted_owner(st))
      return refused(what, path, fmt::format("a symbolic link of another user (uid {})", st.st_uid),
                     "not followed, not replaced, not written");
    struct stat target {};
    if (::stat(path.c_str(), &target) != 0)
      return refused(what, path, fmt::format("a symbolic link to nothing ({})", std::strerror(errno)),
                     "not followed, not replaced, not written");
    if (!S_ISCHR(target.st_mode) && !S_ISFIFO(target.st_mode))
      return refused(what, path, fmt::format("a symbolic link to {}", kind_of(target.st_mode)),
                     "a link is followed only to a character device or a FIFO and never replaced: name the file "
                     "itself");
    st = target;
    follow = true;
  } else if (S_ISFIFO(st.st_mode) && !trusted_owner(st)) {
    return refused(what, path, fmt::format("a FIFO of another user (uid {})", st.st_uid), "not written");
  } else if (!S_ISREG(st.st_mode) && !S_ISCHR(st.st_mode) && !S_ISFIFO(st.st_mode)) {
    return refused(what, path, kind_of(st.st_mode), what_is_written);
  }

  if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) {
    // In place. O_NONBLOCK: a FIFO without a reader is refused (ENXIO), not
    // waited for at exit; writes block as usual once it is cleared.
    const int flags = O_WRONLY | O_NOCTTY | O_NONBLOCK | O_CLOEXEC | (follow ? 0 : O_NOFOLLOW);
    out.fd_ = ::open(path.c_str(), flags);
    if (out.fd_ < 0) {
      if (errno == ENXIO && S_ISFIFO(st.st_mode))
        return refused(what, path, "a FIFO without a reader", "not written (nothing waits for one)");
      return failed(what, "open", path, errno);
    }
    struct stat opened {};
    if (::fstat(out.fd_, &opened) != 0 || identity_of(opened) != identity_of(st) ||
        (opened.st_mode & S_IFMT) != (st.st_mode & S_IFMT))
      return refused(what, path, "a file that changed while it was opened", "not written");
    ::fcntl(out.fd_, F_SETFL, ::fcntl(out.fd_, F_GETFL) & ~O_NONBLOCK);
    out.identity_ = identity_of(opened);
    return out;
  }

  std::string dir;
  std::string base;
  split(path, dir, base);
  if (first_write_of(path)) remove_stale_temporaries(dir, base);
  const std::string stem = temporary_stem(base);
  for (int attempt = 0; attempt < 16 && out.fd_ < 0; ++attempt) {
    out.temporary_ = fmt::format("{}.{}.tmp.{}.{:016x}", dir, stem, ::getpid(), nonce(attempt));
    out.fd_ = ::open(out.temporary_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (out.fd_ < 0 && errno != EEXIST) break;
  }
  if (out.fd_ < 0) {
    const int err = errno;
    out.temporary_.clear();
    return absl::UnavailableError(
        fmt::format("{}: cannot create a temporary file beside \"{}\": {}", what, path, std::strerror(err)));
  }
  if (exists) {
    // The file replaced keeps its permissions (a report made 0600 stays
    // private) and, for root, its owner, as a redirection into it would.
    // Best effort: the write goes on where either cannot be set.
    (void)::fchmod(out.fd_, st.st_mode & 0777);
    if (::geteuid() == 0) (void)::fchown(out.fd_, st.st_uid, st.st_gid);
  }
  struct stat created {};
  if (::fstat(out.fd_, &created) == 0) out.identity_ = identity_of(created);
  return out;
}

absl::StatusOr<output_file> output_file::reopen(const std::string& path, const file_identity& earlier,
                                                std::string_view what) {
  output_file out;
  out.what_ = std::string(what);
  out.path_ = path;
  out.fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  struct stat st {};
  if (out.fd_ < 0 || ::fstat(out.fd_, &st) != 0 || !S_ISREG(st.st_mode) || identity_of(st) != earlier)
    return absl::NotFoundError(fmt::format("{}: \"{}\" no longer holds the file written before", what, path));
  ::fcntl(out.fd_, F_SETFL, ::fcntl(out.fd_, F_GETFL) & ~O_NONBLOCK);
  out.identity_ = earlier;
  return out;
}

output_file::output_file(output_file&& other) noexcept
    : what_(std::move(other.what_)),
      path_(std::move(other.path_)),
      temporary_(std::exchange(other.temporary_, {})),
      fd_(std::exchange(other.fd_, -1)),
      identity_(other.identity_) {}

output_file& output_file::operator=(output_file&& other) noexcept {
  if (this != &other) {
    abandon();
    what_ = std::move(other.what_);
    path_ = std::move(other.path_);
    temporary_ = std::exchange(other.temporary_, {});
    fd_ = std::exchange(other.fd_, -1);
    identity_ = other.identity_;
  }
  return *this;
}

output_file::~output_file() { abandon(); }

void output_file::abandon() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temporary_.empty()) ::unlink(temporary_.c_str());
  temporary_.clear();
}

absl::Status output_file::write(std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd_, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return failed(what_, "write", in_place() ? path_ : temporary_, n < 0 ? errno : ENOSPC);
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return absl::OkStatus();
}

absl::Status output_file::close() {
  const int fd = std::exchange(fd_, -1);
  if (fd >= 0 && ::close(fd) != 0 && errno != EINTR)
    return failed(what_, "write", in_place() ? path_ : temporary_, errno);
  return absl::OkStatus();
}

absl::Status output_file::publish() {
  if (temporary_.empty()) return absl::OkStatus();
  const char* const from = temporary_.c_str();
  const char* const to = path_.c_str();
  for (int attempt = 0; attempt < 8; ++attempt) {
    struct stat st {};
    if (::lstat(to, &st) != 0) {
      if (errno != ENOENT) return failed(what_, "examine", path_, errno);
      if (::renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) == 0) return published();
      if (errno == EEXIST) continue;  // something appeared: look again
    } else {
      if (!S_ISREG(st.st_mode))
        return refused(what_, path_, fmt::format("{} now", kind_of(st.st_mode)), what_is_written);
      if (::renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_EXCHANGE) == 0) {
        // The old file now has the temporary's name: it must be the regular
        // file seen above, or it goes back where it was.
        struct stat old {};
        if (::lstat(from, &old) == 0 && !S_ISREG(old.st_mode)) {
          ::renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_EXCHANGE);
          return refused(what_, path_, fmt::format("{} now", kind_of(old.st_mode)), what_is_written);
        }
        ::unlink(from);
        return published();
      }
      if (errno == ENOENT) continue;  // gone meanwhile: look again
    }
    // A file system without renameat2's flags (EINVAL): a plain rename, after
    // the check above.
    if (errno != EINVAL && errno != ENOSYS) return failed(what_, "rename the temporary file to", path_, errno);
    if (::rename(from, to) != 0) return failed(what_, "rename the temporary file to", path_, errno);
    return published();
  }
  return absl::UnavailableError(
      fmt::format("{}: \"{}\" kept changing while the temporary file was renamed to it; not written", what_, path_));
}

absl::Status output_file::published() noexcept {
  temporary_.clear();
  return absl::OkStatus();
}

absl::Status write_file_atomically(const std::string& path, std::string_view text, std::string_view what) {
  absl::StatusOr<output_file> out = output_file::open(path, what);
  if (!out.ok()) return out.status();
  if (absl::Status s = out->write(text); !s.ok()) return s;
  if (absl::Status s = out->close(); !s.ok()) return s;
  return out->publish();
}

}  // namespace fragctl::detail
