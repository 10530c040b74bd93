// The report document and its atomic file writes (fragctl/report.hpp); the
// registry of live allocators is report_registry.cpp, the Prometheus text of
// several allocators stats_prometheus.cpp.
#include "fragctl/report.hpp"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "core/memory_map_json.hpp"
#include "core/stats_json.hpp"
#include "fmt/format.h"
#include "fragctl/log.hpp"

namespace fragctl {

std::string report_to_json(const std::vector<allocator_stats>& allocators, std::string_view reason) {
  nlohmann::json list = nlohmann::json::array();
  for (const allocator_stats& s : allocators) list.push_back(detail::stats_to_json_value(s));
  const nlohmann::json doc{
      {"schema_version", stats_schema_version},
      {"reason", std::string(reason)},
      {"pid", static_cast<std::int64_t>(::getpid())},
      {"time_unix_s", static_cast<std::int64_t>(std::time(nullptr))},
      {"allocators", std::move(list)},
  };
  return doc.dump(2);
}

absl::StatusOr<std::vector<allocator_stats>> report_from_json(std::string_view text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("report JSON: not valid JSON");
  std::vector<allocator_stats> out;
  if (!j.is_object() || !j.contains("allocators")) {
    auto one = detail::stats_from_json_value(j, "report JSON");
    if (!one.ok()) return one.status();
    out.push_back(*std::move(one));
    return out;
  }
  const nlohmann::json& list = j["allocators"];
  if (!list.is_array()) return absl::InvalidArgumentError("report JSON: \"allocators\" is not an array");
  for (std::size_t i = 0; i < list.size(); ++i) {
    auto one = detail::stats_from_json_value(list[i], fmt::format("report JSON: allocators[{}]", i));
    if (!one.ok()) return one.status();
    out.push_back(*std::move(one));
  }
  return out;
}

namespace {

// A temporary file beside `path`, created exclusively (O_EXCL, O_NOFOLLOW)
// under an unpredictable name, so a file or symlink planted there is never
// written through. Returns its descriptor and fills `temp`, or -1 with errno.
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

// Writes `text` to `path` through a temporary file beside it and a rename, so
// a reader sees the old file or the new one, never a torn one. An empty path
// is refused: there is nothing to rename to.
absl::Status write_atomically(const std::string& path, const std::string& text, std::string_view what) {
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

// One allocator of a report document: its statistics and, if taken, its map.
using report_item = allocator_report;

std::string document_json(const std::vector<report_item>& items, std::string_view reason) {
  nlohmann::json list = nlohmann::json::array();
  for (const report_item& item : items) {
    nlohmann::json one = detail::stats_to_json_value(item.stats);
    if (item.map) one["memory_map"] = detail::memory_snapshot_to_json_value(*item.map, report_map_max_blocks);
    list.push_back(std::move(one));
  }
  const nlohmann::json doc{
      {"schema_version", stats_schema_version},
      {"reason", std::string(reason)},
      {"pid", static_cast<std::int64_t>(::getpid())},
      {"time_unix_s", static_cast<std::int64_t>(std::time(nullptr))},
      {"allocators", std::move(list)},
  };
  return doc.dump(2);
}

}  // namespace

absl::Status write_report_file(const std::string& path, const std::vector<allocator_stats>& allocators,
                               std::string_view reason) {
  return write_atomically(path, report_to_json(allocators, reason) + "\n", "report");
}

absl::Status write_report_file(const std::string& path, const std::vector<allocator_report>& allocators,
                               std::string_view reason) {
  return write_atomically(path, document_json(allocators, reason) + "\n", "report");
}

absl::Status write_prometheus_file(const std::string& path, const std::vector<allocator_stats>& allocators) {
  return write_atomically(path, prometheus_text(allocators), "prometheus");
}

}  // namespace fragctl
