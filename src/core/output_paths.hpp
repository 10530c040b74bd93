// Which file an output goes to, and the claims that keep one writing process
// per path (docs/reports.md, "When reports are written"; the public rule is
// expand_output_path in fragctl/process_hooks.hpp).
//
// A claim is a Unix socket bound to an abstract name made from the file's
// absolute path: the kernel drops it when the process ends, however it ends,
// and it creates no file. An owner of an output (a report registration, a
// trace file) holds an output_claim while it may write; the last holder of a
// path releases the claim, closing its socket, so a process that names a
// thousand paths in turn holds no more descriptors than it has live outputs.
//
// A path another running process has claimed is written as "<path>.<pid>"
// when that process is this user's (ranks of one job), said once in a
// warning. When it belongs to another user, or its user cannot be told
// (sock_diag unavailable), the name gets an unpredictable suffix as well,
// "<path>.<pid>.<16 hex digits>": anyone can bind an abstract name, and a
// predictable fallback would let another user choose where this process
// writes. The abstract namespace is per network namespace: processes in
// separate ones (containers sharing a volume) do not see each other's claims.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "core/launcher_identity.hpp"

namespace fragctl::detail {

/// A reference on the claim of one output path. Thread-safe to create and
/// destroy; move-only.
class output_claim {
 public:
  output_claim() = default;
  /// Expands `path` (expand_output_path's placeholder and forked-child rules)
  /// and, for a path that does not name this process alone (no "%p" or
  /// "{pid}", no pid standing in for a rank) in a process that is not a forked child, takes
  /// a reference on its claim, binding it on the first (the first call
  /// installs the process hooks, so that a forked child lets go of it).
  explicit output_claim(std::string_view path);
  output_claim(output_claim&& other) noexcept;
  output_claim& operator=(output_claim&& other) noexcept;
  output_claim(const output_claim&) = delete;
  output_claim& operator=(const output_claim&) = delete;
  /// Drops the reference; the last one releases the claim.
  ~output_claim();

  /// The file this process writes for the path.
  [[nodiscard]] const std::string& file() const noexcept { return file_; }

 private:
  void release() noexcept;

  std::string claimed_;  // the expanded path whose claim this references; empty if none
  std::string file_;
};

/// `path` with its placeholders replaced (docs/configuration.md, "Output
/// paths"): "%p" and "{pid}" by the pid, "%%" by "%", "{rank}",
/// "{local_rank}" and "{world_size}" by the launcher's figures of `who`
/// (core/launcher_identity.hpp), "{host}" by its host. A rank or local rank
/// `who` lacks becomes the pid, a world size "unknown", each said in one
/// warning per path; other brace text is kept as written (a `{word}` with
/// one warning per path). `per_process` tells whether the result names this
/// process alone (it holds the pid): such a path is not claimed. Thread-safe.
[[nodiscard]] std::string expand_placeholders(std::string_view path, const launcher_identity& who, bool& per_process);

/// The same with this process's launcher identity, read from the
/// environment only when `path` holds a "{".
[[nodiscard]] std::string expand_placeholders(std::string_view path, bool& per_process);

/// A glob(3) pattern that every expansion of `path` matches, in any process:
/// each placeholder ("%p" and the brace ones) a "*", "%%" a "%", glob's own
/// special characters escaped (`fragctl run` finds its program's reports so).
[[nodiscard]] std::string output_path_glob(std::string_view path);

/// The file written for `expanded` (an expanded path that does not name this process alone) while this process
/// holds its claim; `expanded` itself when it holds none.
[[nodiscard]] std::string claimed_file(const std::string& expanded);

/// The abstract socket name that claims `path` (tests bind it to play
/// another process).
[[nodiscard]] std::string output_claim_name(const std::string& path);

/// Claims this process holds (tests).
[[nodiscard]] std::size_t output_claims_held() noexcept;

/// The process hooks' fork handlers (fragctl/process_hooks.hpp): the parent
/// keeps its claims; the child lets go of its copies, so that it never holds
/// a path for a process that ended, and references it inherited release
/// nothing.
void output_claims_fork_prepare() noexcept;
void output_claims_fork_parent() noexcept;
void output_claims_fork_child() noexcept;

}  // namespace fragctl::detail
