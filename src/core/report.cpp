// The report registry and writer (fragctl/report.hpp).
//
// The registry is created on first use and never destroyed, so the exit hook,
// the SIGUSR1 writer thread and late destructors of static allocators never
// meet a destroyed registry. One mutex guards the entries and is held while a
// report is written; sources are called under it, which is what lets
// retire_report_source promise that a source is never called after it
// returns.
#include "fragctl/report.hpp"

#include <fcntl.h>
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

#include "core/stats_json.hpp"
#include "fmt/format.h"
#include "fragctl/log.hpp"
#include "util/strings.hpp"

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

absl::Status write_report_file(const std::string& path, const std::vector<allocator_stats>& allocators,
                               std::string_view reason) {
  const std::string text = report_to_json(allocators, reason) + "\n";
  const std::string temp = fmt::format("{}.tmp.{}", path, ::getpid());
  std::FILE* f = std::fopen(temp.c_str(), "w");
  if (f == nullptr) {
    return absl::UnavailableError(fmt::format("report: cannot create \"{}\": {}", temp, std::strerror(errno)));
  }
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed) {
    std::remove(temp.c_str());
    return absl::UnavailableError(fmt::format("report: cannot write \"{}\"", temp));
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(temp.c_str());
    return absl::UnavailableError(
        fmt::format("report: cannot rename \"{}\" to \"{}\": {}", temp, path, std::strerror(err)));
  }
  return absl::OkStatus();
}

namespace {

struct report_entry {
  const void* owner = nullptr;
  std::string path;
  stats_source source;                   // empty once retired
  std::optional<allocator_stats> final;  // set once retired
};

class report_registry {
 public:
  static report_registry& instance() {
    static report_registry* const registry = new report_registry();  // never destroyed, see top
    return *registry;
  }

  void add(const void* owner, std::string path, stats_source source) {
    std::call_once(hooks_installed_, [this] { install_hooks(); });
    const std::lock_guard lock(mutex_);
    logger().info("statistics report will be written to {}", path);
    entries_.push_back({owner, std::move(path), std::move(source), std::nullopt});
  }

  void retire(const void* owner) noexcept {
    const std::lock_guard lock(mutex_);
    for (report_entry& e : entries_) {
      if (e.owner != owner || !e.source) continue;
      e.final = snapshot(e);
      e.source = nullptr;
      e.owner = nullptr;
      write_locked(e.path, "destroy");
      return;
    }
  }

  // Writes each path that has a live allocator once. A path whose allocators
  // are all retired is left alone: its last write holds the final numbers.
  std::size_t write_all(std::string_view reason) noexcept {
    const std::lock_guard lock(mutex_);
    std::vector<std::string> paths;
    for (const report_entry& e : entries_) {
      if (!e.source) continue;
      if (std::find(paths.begin(), paths.end(), e.path) == paths.end()) paths.push_back(e.path);
    }
    std::size_t files = 0;
    for (const std::string& p : paths) files += write_locked(p, reason) ? 1 : 0;
    return files;
  }

  [[nodiscard]] std::uint64_t written() const noexcept { return written_.load(std::memory_order_acquire); }

 private:
  report_registry() = default;

  static std::optional<allocator_stats> snapshot(const report_entry& e) noexcept {
    if (!e.source) return e.final;
    try {
      return e.source();
    } catch (const std::exception& ex) {
      logger().error("report {}: reading statistics failed: {}", e.path, ex.what());
    } catch (...) {
      logger().error("report {}: reading statistics failed", e.path);
    }
    return std::nullopt;
  }

  bool write_locked(const std::string& path, std::string_view reason) noexcept {
    try {
      std::vector<allocator_stats> stats;
      for (const report_entry& e : entries_) {
        if (e.path != path) continue;
        if (auto s = snapshot(e)) stats.push_back(*std::move(s));
      }
      if (const absl::Status st = write_report_file(path, stats, reason); !st.ok()) {
        logger().error("{}", util::to_std(st.message()));
        return false;
      }
      written_.fetch_add(1, std::memory_order_release);
      return true;
    } catch (const std::exception& ex) {
      logger().error("report {}: {}", path, ex.what());
      return false;
    }
  }

  // Exit hook, SIGUSR1 handler and the thread that writes on its behalf.
  void install_hooks() {
    std::atexit([] { instance().write_all("exit"); });
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      logger().warn("report: no pipe for SIGUSR1 ({}); reports on signal are off", std::strerror(errno));
      return;
    }
    ::fcntl(fds[1], F_SETFL, ::fcntl(fds[1], F_GETFL) | O_NONBLOCK);
    signal_pipe_write_.store(fds[1], std::memory_order_release);
    std::thread([read_fd = fds[0]] {
      char buffer[64];
      for (;;) {
        const ssize_t n = ::read(read_fd, buffer, sizeof buffer);
        if (n > 0) {
          instance().write_all("signal");
        } else if (n == 0 || errno != EINTR) {
          return;
        }
      }
    }).detach();

    struct sigaction action {};
    action.sa_sigaction = &on_signal;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    if (::sigaction(SIGUSR1, &action, &previous_action_) != 0) {
      logger().warn("report: cannot install the SIGUSR1 handler ({})", std::strerror(errno));
    }
  }

  static void on_signal(int signo, siginfo_t* info, void* context) {
    const int saved_errno = errno;
    const int fd = signal_pipe_write_.load(std::memory_order_acquire);
    if (fd >= 0) {
      const char byte = 1;
      // A full pipe means a write is already pending: dropping the byte is right.
      [[maybe_unused]] const ssize_t sent = ::write(fd, &byte, 1);
    }
    errno = saved_errno;
    if ((previous_action_.sa_flags & SA_SIGINFO) != 0) {
      if (previous_action_.sa_sigaction != nullptr) previous_action_.sa_sigaction(signo, info, context);
    } else if (previous_action_.sa_handler != SIG_DFL && previous_action_.sa_handler != SIG_IGN &&
               previous_action_.sa_handler != nullptr) {
      previous_action_.sa_handler(signo);
    }
  }

  std::mutex mutex_;
  std::vector<report_entry> entries_;
  std::atomic<std::uint64_t> written_{0};
  std::once_flag hooks_installed_;
  static inline std::atomic<int> signal_pipe_write_{-1};
  static inline struct sigaction previous_action_ {};
};

}  // namespace

void register_report_source(const void* owner, std::string path, stats_source source) {
  report_registry::instance().add(owner, std::move(path), std::move(source));
}

void retire_report_source(const void* owner) noexcept { report_registry::instance().retire(owner); }

std::size_t write_reports(std::string_view reason) noexcept {
  return report_registry::instance().write_all(reason);
}

std::uint64_t reports_written() noexcept { return report_registry::instance().written(); }

}  // namespace fragctl
