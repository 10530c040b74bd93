// The one way fragctl opens a file it writes (docs/reliability.md, "Output
// paths"): reports, Prometheus files, traces, `fragctl convert`, the HTML page
// and the SVG map all go through output_file, so no output of any kind can
// replace anything but a regular file or follow a link it did not create.
//
// What is at the path decides how it is written:
//
//  - nothing, or a regular file: a temporary beside it, created exclusively
//    (O_CREAT|O_EXCL|O_NOFOLLOW) under an unpredictable name
//    ".<name>.tmp.<pid>.<16 hex digits>", is written and then renamed over the
//    path. The rename replaces only what the path held when it was checked:
//    nothing (renameat2 RENAME_NOREPLACE) or a regular file (RENAME_EXCHANGE,
//    then the old file is checked and removed, or put back if it is not a
//    regular file). A reader sees the old file or the new one, never a torn
//    one. A regular file this user may not write is refused (the rename needs
//    only the directory's permission); one replaced keeps its permission bits
//    and, when root writes it, its owner.
//  - a character device, or a FIFO of root or of this user: written into, in
//    place (/dev/null, a terminal, a named pipe with a reader). Nothing is
//    renamed. A FIFO without a reader is refused rather than waited for.
//  - a symbolic link: never replaced. It is followed only when root or this
//    user owns it and it ends at a character device or FIFO, which is then
//    written into (/dev/stdout -> /proc/self/fd/1 -> a terminal or a pipe); a
//    link to a regular file, to nothing or to anything else is refused: name
//    the file itself.
//  - a directory, a block device, a socket, a FIFO of another user, or a link
//    of another user: refused, naming what is there.
//
// Temporaries of processes that died mid-write (SIGKILL) are removed when a
// process next writes the same path (its first write of it):
// ".<name>.tmp.<pid>.<hex>" files of this user whose process no longer exists
// and that are older than a minute.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fragctl::detail {

/// Which file an output_file wrote, to tell later whether the path still
/// holds it.
struct file_identity {
  dev_t device = 0;
  ino_t inode = 0;
  friend bool operator==(const file_identity&, const file_identity&) = default;
};

/// A file being written under the rule above. Move-only; not thread-safe.
/// Destroyed without publish(), it removes its temporary: the path keeps
/// what it held.
class output_file {
 public:
  /// Holds no file (fd() is -1).
  output_file() = default;
  /// Opens `path` for writing. Errors start with `what` ("report", "trace",
  /// ...) and name the path: InvalidArgumentError for an empty path,
  /// FailedPreconditionError for what the rule above refuses (saying what is
  /// there), UnavailableError for a failed system call (with its reason).
  [[nodiscard]] static absl::StatusOr<output_file> open(const std::string& path, std::string_view what);

  /// Opens `path` to add to what an earlier output_file wrote there (the
  /// second allocator of a process on one trace path): succeeds only if the
  /// path still holds the regular file `earlier` identifies (opened
  /// O_APPEND|O_NOFOLLOW); otherwise NotFoundError, and the caller opens a
  /// new file. Written in place: publish() has nothing to do.
  [[nodiscard]] static absl::StatusOr<output_file> reopen(const std::string& path, const file_identity& earlier,
                                                          std::string_view what);

  output_file(output_file&& other) noexcept;
  output_file& operator=(output_file&& other) noexcept;
  output_file(const output_file&) = delete;
  output_file& operator=(const output_file&) = delete;
  ~output_file();

  /// The descriptor to write to (the temporary, or the device itself); -1
  /// after close().
  [[nodiscard]] int fd() const noexcept { return fd_; }
  /// True when the path is written in place (a device or FIFO, or a reopened
  /// file): publish() has nothing to rename.
  [[nodiscard]] bool in_place() const noexcept { return temporary_.empty(); }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  [[nodiscard]] file_identity identity() const noexcept { return identity_; }

  /// Writes all of `bytes` (retrying short writes and EINTR).
  [[nodiscard]] absl::Status write(std::string_view bytes);
  /// Closes the descriptor, reporting what close() reports (a network file
  /// system's delayed write error).
  [[nodiscard]] absl::Status close();
  /// Puts the temporary at the path (the file stays open if not closed):
  /// replaces nothing but a regular file, as the top of this header says.
  /// Nothing to do in place. Call once.
  [[nodiscard]] absl::Status publish();

 private:
  void abandon() noexcept;
  absl::Status published() noexcept;

  std::string what_;
  std::string path_;
  std::string temporary_;  // empty in place, or once published
  int fd_ = -1;
  file_identity identity_;
};

/// Writes `text` to `path` as one output_file: open, write, close, publish.
[[nodiscard]] absl::Status write_file_atomically(const std::string& path, std::string_view text, std::string_view what);

}  // namespace fragctl::detail
