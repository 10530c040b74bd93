// Whole-file writes that a concurrent reader never sees torn: the stats
// export's JSON document and its Prometheus text (a node exporter's textfile
// collector reads while we write).
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace fragctl::detail {

/// Writes `text` to `path` through a temporary file beside it and a rename,
/// so a reader sees the old file or the new one, never a torn one. The
/// temporary is created exclusively (O_EXCL, O_NOFOLLOW) under an
/// unpredictable name, so a file or symlink planted there is never written
/// through, and is removed on failure. An empty path is refused. Errors
/// (UnavailableError, InvalidArgumentError for the empty path) start with
/// `what` and name the path.
[[nodiscard]] absl::Status write_file_atomically(const std::string& path, std::string_view text, std::string_view what);

}  // namespace fragctl::detail
