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
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "core/memory_map_json.hpp"
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

namespace {

// Writes `text` to `path` through `<path>.tmp.<pid>` and a rename, so a reader
// sees the old file or the new one, never a torn one.
absl::Status write_atomically(const std::string& path, const std::string& text, std::string_view what) {
  const std::string temp = fmt::format("{}.tmp.{}", path, ::getpid());
  std::FILE* f = std::fopen(temp.c_str(), "w");
  if (f == nullptr) {
    return absl::UnavailableError(fmt::format("{}: cannot create \"{}\": {}", what, temp, std::strerror(errno)));
  }
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed) {
    std::remove(temp.c_str());
    return absl::UnavailableError(fmt::format("{}: cannot write \"{}\"", what, temp));
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(temp.c_str());
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

std::string prometheus_text(const std::vector<allocator_stats>& allocators) {
  // Each to_prometheus text is a sequence of families, each "# HELP" and
  // "# TYPE" lines followed by samples; families are merged by name in the
  // order they first appear.
  struct family {
    std::string header;
    std::string samples;
  };
  std::vector<std::string> order;
  std::map<std::string, family> families;
  for (const allocator_stats& s : allocators) {
    const std::string text = to_prometheus(s);
    std::string current;
    for (const std::string_view line : util::split(text, '\n')) {
      if (line.empty()) continue;
      if (line.starts_with("# HELP ") || line.starts_with("# TYPE ")) {
        const std::string_view rest = line.substr(7);
        current = std::string(rest.substr(0, rest.find(' ')));
        auto [it, added] = families.try_emplace(current);
        if (added) order.push_back(current);
        if (it->second.header.find(line) == std::string::npos) it->second.header += fmt::format("{}\n", line);
        continue;
      }
      families[current].samples += fmt::format("{}\n", line);
    }
  }
  std::string out;
  for (const std::string& name : order) out += families[name].header + families[name].samples;
  return out;
}

absl::Status write_prometheus_file(const std::string& path, const std::vector<allocator_stats>& allocators) {
  return write_atomically(path, prometheus_text(allocators), "prometheus");
}

namespace {

struct report_entry {
  const void* owner = nullptr;
  report_outputs outputs;
  stats_source source;              // empty once retired
  memory_map_source map_source;     // empty once retired, or never given
  std::optional<report_item> final;  // set once retired
};

class report_registry {
 public:
  static report_registry& instance() {
    static report_registry* const registry = new report_registry();  // never destroyed, see top
    return *registry;
  }

  void add(const void* owner, report_outputs outputs, stats_source source, memory_map_source map_source) {
    std::call_once(hooks_installed_, [this] { install_hooks(); });
    if (!outputs.prometheus_path.empty() && outputs.interval.count() == 0) {
      outputs.interval = default_prometheus_interval;
    }
    const std::lock_guard lock(mutex_);
    if (!outputs.json_path.empty()) logger().info("statistics report will be written to {}", outputs.json_path);
    if (!outputs.prometheus_path.empty()) {
      logger().info("Prometheus metrics will be written to {}", outputs.prometheus_path);
    }
    if (outputs.interval.count() > 0) {
      if (interval_.count() == 0 || outputs.interval < interval_) interval_ = outputs.interval;
      if (!interval_thread_started_) {
        interval_thread_started_ = true;
        std::thread([] { instance().run_intervals(); }).detach();
      }
    }
    entries_.push_back({owner, std::move(outputs), std::move(source), std::move(map_source), std::nullopt});
  }

  void retire(const void* owner) noexcept {
    const std::lock_guard lock(mutex_);
    for (report_entry& e : entries_) {
      if (e.owner != owner || !e.source) continue;
      e.final = item_of(e, /*with_map=*/true);
      e.source = nullptr;
      e.map_source = nullptr;
      e.owner = nullptr;
      write_locked(paths{e.outputs.json_path}, paths{e.outputs.prometheus_path}, "destroy");
      return;
    }
  }

  // Writes each file that has a live allocator once. A file whose allocators
  // are all retired is left alone: its last write holds the final numbers.
  std::size_t write_all(std::string_view reason) noexcept {
    const std::lock_guard lock(mutex_);
    paths json;
    paths prometheus;
    for (const report_entry& e : entries_) {
      if (!e.source) continue;
      add_unique(json, e.outputs.json_path);
      add_unique(prometheus, e.outputs.prometheus_path);
    }
    return write_locked(json, prometheus, reason);
  }

  [[nodiscard]] std::uint64_t written() const noexcept { return written_.load(std::memory_order_acquire); }

 private:
  using paths = std::vector<std::string>;

  report_registry() = default;

  static void add_unique(paths& list, const std::string& path) {
    if (!path.empty() && std::find(list.begin(), list.end(), path) == list.end()) list.push_back(path);
  }

  static std::optional<report_item> item_of(const report_entry& e, bool with_map) noexcept {
    if (!e.source) return e.final;
    const std::string& name = e.outputs.json_path.empty() ? e.outputs.prometheus_path : e.outputs.json_path;
    try {
      report_item item{e.source(), std::nullopt};
      if (with_map && e.map_source) item.map = e.map_source();
      return item;
    } catch (const std::exception& ex) {
      logger().error("report {}: reading statistics failed: {}", name, ex.what());
    } catch (...) {
      logger().error("report {}: reading statistics failed", name);
    }
    return std::nullopt;
  }

  // Writes the JSON reports at `json` and the Prometheus files at
  // `prometheus`, reading each allocator once. Returns the files written.
  std::size_t write_locked(const paths& json, const paths& prometheus, std::string_view reason) noexcept {
    std::size_t files = 0;
    try {
      const auto wanted = [](const paths& list, const std::string& p) {
        return !p.empty() && std::find(list.begin(), list.end(), p) != list.end();
      };
      std::vector<std::optional<report_item>> items(entries_.size());
      for (std::size_t i = 0; i < entries_.size(); ++i) {
        const report_entry& e = entries_[i];
        const bool for_json = wanted(json, e.outputs.json_path);
        if (for_json || wanted(prometheus, e.outputs.prometheus_path)) items[i] = item_of(e, for_json);
      }
      for (const std::string& path : json) {
        std::vector<report_item> document;
        for (std::size_t i = 0; i < entries_.size(); ++i)
          if (entries_[i].outputs.json_path == path && items[i]) document.push_back(*items[i]);
        files += finish(write_atomically(path, document_json(document, reason) + "\n", "report"));
      }
      for (const std::string& path : prometheus) {
        std::vector<allocator_stats> stats;
        for (std::size_t i = 0; i < entries_.size(); ++i)
          if (entries_[i].outputs.prometheus_path == path && items[i]) stats.push_back(items[i]->stats);
        files += finish(write_prometheus_file(path, stats));
      }
    } catch (const std::exception& ex) {
      logger().error("report: {}", ex.what());
    }
    return files;
  }

  std::size_t finish(const absl::Status& st) noexcept {
    if (!st.ok()) {
      logger().error("{}", util::to_std(st.message()));
      return 0;
    }
    written_.fetch_add(1, std::memory_order_release);
    return 1;
  }

  // The interval thread: sleeps for the current interval, then rewrites.
  // A shorter interval registered meanwhile applies from the next sleep.
  [[noreturn]] void run_intervals() noexcept {
    for (;;) {
      std::chrono::milliseconds period{0};
      {
        const std::lock_guard lock(mutex_);
        period = interval_;
      }
      std::this_thread::sleep_for(period);
      write_all("interval");
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
  std::chrono::milliseconds interval_{0};
  bool interval_thread_started_ = false;
  std::atomic<std::uint64_t> written_{0};
  std::once_flag hooks_installed_;
  static inline std::atomic<int> signal_pipe_write_{-1};
  static inline struct sigaction previous_action_ {};
};

}  // namespace

void register_report_source(const void* owner, std::string path, stats_source source) {
  report_registry::instance().add(owner, report_outputs{std::move(path), {}, {}}, std::move(source), {});
}

void register_report_source(const void* owner, const report_outputs& outputs, stats_source source,
                            memory_map_source map_source) {
  report_registry::instance().add(owner, outputs, std::move(source), std::move(map_source));
}

void retire_report_source(const void* owner) noexcept { report_registry::instance().retire(owner); }

std::size_t write_reports(std::string_view reason) noexcept {
  return report_registry::instance().write_all(reason);
}

std::uint64_t reports_written() noexcept { return report_registry::instance().written(); }

}  // namespace fragctl
