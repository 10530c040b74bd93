// The stats export registry (fragctl/stats_export.hpp): which allocators
// write which files, and when.
//
// The registry is created on first use and never destroyed, so the exit hook,
// the signal writer thread and late destructors of static allocators never
// meet a destroyed registry. One mutex guards the entries and is held while a
// file is written; sources are called under it, which is what lets
// retire_stats_export promise that a source is never called after it
// returns. Lock order: the process hooks' lock, this mutex, the allocators'
// locks (a source takes its allocator's; at fork each allocator takes its
// own as a client of the hooks, after this one: process_hooks.hpp).
#include <algorithm>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "core/atomic_file.hpp"
#include "core/output_paths.hpp"
#include "fragctl/log.hpp"
#include "fragctl/process_hooks.hpp"
#include "fragctl/stats_export.hpp"
#include "util/strings.hpp"

namespace fragctl {
namespace {

struct registration {
  const void* owner = nullptr;
  stats_export_outputs outputs;
  stats_source source;                      // empty once retired
  memory_map_source map_source;             // empty once retired, or never given
  std::optional<stats_export_entry> final;  // set once retired
  std::vector<detail::output_claim> claims;  // its paths', held until retired
  // The device memory of the last read that could measure it: at exit the
  // CUDA runtime may be gone before the exit hook writes (docs/reports.md).
  mutable std::optional<allocator_stats::device_memory_figures> last_device_memory;
};

class stats_export_registry final : public process_client {
 public:
  static stats_export_registry& instance() {
    static stats_export_registry* const registry = new stats_export_registry();  // never destroyed, see top
    return *registry;
  }

  void add(const void* owner, stats_export_outputs outputs, stats_source source, memory_map_source map_source) {
    if (outputs.json_path.empty() && outputs.prometheus_path.empty()) return;
    add_process_client(*this, process_layer_stats_export);
    if (!outputs.prometheus_path.empty() && outputs.interval.count() == 0) {
      outputs.interval = default_prometheus_interval;
    }
    const std::lock_guard guard(mutex_);
    // The paths are claimed for this process until the allocator is retired
    // (core/output_paths.hpp).
    std::vector<detail::output_claim> claims;
    if (!outputs.json_path.empty()) {
      logger().info("statistics report will be written to {}", claims.emplace_back(outputs.json_path).file());
    }
    if (!outputs.prometheus_path.empty()) {
      logger().info("Prometheus metrics will be written to {}", claims.emplace_back(outputs.prometheus_path).file());
    }
    if (outputs.interval.count() > 0) {
      if (interval_.count() == 0 || outputs.interval < interval_) interval_ = outputs.interval;
      if (!interval_thread_started_) {
        interval_thread_started_ = true;
        std::thread([] { instance().run_intervals(); }).detach();
      }
    }
    entries_.push_back({owner, std::move(outputs), std::move(source), std::move(map_source), std::nullopt,
                        std::move(claims), std::nullopt});
  }

  void retire(const void* owner) noexcept {
    const std::lock_guard guard(mutex_);
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      registration& e = *it;
      if (e.owner != owner || !e.source) continue;
      e.final = item_of(e, /*with_map=*/true);
      e.source = nullptr;
      e.map_source = nullptr;
      e.owner = nullptr;
      paths json;
      paths prometheus;
      add_unique(json, e.outputs.json_path);
      add_unique(prometheus, e.outputs.prometheus_path);
      std::vector<detail::output_claim> claims = std::move(e.claims);
      forget_old_retired(e.outputs);  // `e` is the newest retired entry: kept
      write_locked(json, prometheus, "destroy");
      return;  // `claims` released: another allocator or process may claim the paths now
    }
  }

  // Writes each file that has a live allocator once. A file whose allocators
  // are all retired is left alone: its last write holds the final numbers.
  // On the writer thread after freeze(), the mutex is its own already.
  std::size_t write_all(std::string_view reason) noexcept {
    std::unique_lock guard(mutex_, std::defer_lock);
    if (!outputs_frozen_by_this_thread()) guard.lock();
    paths json;
    paths prometheus;
    for (const registration& e : entries_) {
      if (!e.source) continue;
      add_unique(json, e.outputs.json_path);
      add_unique(prometheus, e.outputs.prometheus_path);
    }
    return write_locked(json, prometheus, reason);
  }

  std::size_t flush(std::string_view reason) noexcept override { return write_all(reason); }

  void fork_prepare() noexcept override { mutex_.lock(); }
  void fork_parent() noexcept override { mutex_.unlock(); }
  // No allocator is registered or retired, no interval write starts, until
  // the process ends.
  void freeze() noexcept override { mutex_.lock(); }

  // The child forgets its parent's allocators: their reports are the
  // parent's to write. Its own threads are gone, so the interval thread
  // starts again with the child's first interval registration.
  void fork_child() noexcept override {
    entries_.clear();
    interval_ = std::chrono::milliseconds{0};
    interval_thread_started_ = false;
    mutex_.unlock();
  }

 private:
  using paths = std::vector<std::string>;

  stats_export_registry() = default;

  static void add_unique(paths& list, const std::string& path) {
    if (!path.empty() && std::find(list.begin(), list.end(), path) == list.end()) list.push_back(path);
  }

  // Keeps the final statistics of the newest stats_export_retired_kept retired
  // allocators of `outputs`' files; older ones are dropped.
  void forget_old_retired(const stats_export_outputs outputs) noexcept {
    std::size_t kept = 0;
    for (std::size_t i = entries_.size(); i-- > 0;) {
      const registration& e = entries_[i];
      if (e.source || e.outputs.json_path != outputs.json_path || e.outputs.prometheus_path != outputs.prometheus_path)
        continue;
      if (++kept > stats_export_retired_kept) entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }

  static std::optional<stats_export_entry> item_of(const registration& e, bool with_map) noexcept {
    if (!e.source) return e.final;
    const std::string& name = e.outputs.json_path.empty() ? e.outputs.prometheus_path : e.outputs.json_path;
    try {
      stats_export_entry item{e.source(), std::nullopt};
      if (with_map && e.map_source) item.map = e.map_source();
      if (item.stats.device_memory.measured) {
        e.last_device_memory = item.stats.device_memory;
      } else if (e.last_device_memory) {
        item.stats.device_memory = *e.last_device_memory;
      }
      return item;
    } catch (const std::exception& ex) {
      logger().error("report {}: reading statistics failed: {}", name, ex.what());
    } catch (...) {
      logger().error("report {}: reading statistics failed", name);
    }
    return std::nullopt;
  }

  // Writes the JSON reports at `json` and the Prometheus files at
  // `prometheus` (paths as registered, expanded here), reading each allocator
  // once. Returns the files written.
  std::size_t write_locked(const paths& json, const paths& prometheus, std::string_view reason) noexcept {
    std::size_t files = 0;
    try {
      const auto wanted = [](const paths& list, const std::string& p) {
        return !p.empty() && std::find(list.begin(), list.end(), p) != list.end();
      };
      std::vector<std::optional<stats_export_entry>> items(entries_.size());
      for (std::size_t i = 0; i < entries_.size(); ++i) {
        const registration& e = entries_[i];
        const bool for_json = wanted(json, e.outputs.json_path);
        if (for_json || wanted(prometheus, e.outputs.prometheus_path)) items[i] = item_of(e, for_json);
      }
      for (const std::string& path : json) {
        std::vector<stats_export_entry> document;
        for (std::size_t i = 0; i < entries_.size(); ++i)
          if (entries_[i].outputs.json_path == path && items[i]) document.push_back(*items[i]);
        files += finish(write_stats_export_file(expand_output_path(path), document, reason));
      }
      for (const std::string& path : prometheus) {
        std::vector<allocator_stats> stats;
        for (std::size_t i = 0; i < entries_.size(); ++i)
          if (entries_[i].outputs.prometheus_path == path && items[i]) stats.push_back(items[i]->stats);
        files += finish(detail::write_file_atomically(expand_output_path(path), prometheus_text(stats), "prometheus"));
      }
    } catch (const std::exception& ex) {
      logger().error("report: {}", ex.what());
    }
    return files;
  }

  std::size_t finish(const absl::Status& st) noexcept {
    if (!st.ok()) {
      logger().error("{}", util::to_std(st.message()));
      note_output_failure(util::to_std(st.message()));
      return 0;
    }
    return 1;
  }

  // The interval thread: sleeps for the current interval, then rewrites.
  // A shorter interval registered meanwhile applies from the next sleep.
  [[noreturn]] void run_intervals() noexcept {
    for (;;) {
      std::chrono::milliseconds period{0};
      {
        const std::lock_guard guard(mutex_);
        period = interval_;
      }
      std::this_thread::sleep_for(period);
      write_all("interval");
    }
  }

  std::mutex mutex_;
  std::vector<registration> entries_;
  std::chrono::milliseconds interval_{0};
  bool interval_thread_started_ = false;
};

}  // namespace

void register_stats_export(const void* owner, const stats_export_outputs& outputs, stats_source source,
                           memory_map_source map_source) {
  stats_export_registry::instance().add(owner, outputs, std::move(source), std::move(map_source));
}

void retire_stats_export(const void* owner) noexcept { stats_export_registry::instance().retire(owner); }

}  // namespace fragctl
