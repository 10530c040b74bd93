// allocator_stack: the configured adaptors around a policy chain
// (fragctl/allocator_stack.hpp).
#include "fragctl/allocator_stack.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "allocator_policies/graph_pool/graph_pool_policy.hpp"
#include "allocator_policies/registry.hpp"
#include "fmt/format.h"
#include "fragctl/adaptors.hpp"
#include "fragctl/device_memory.hpp"
#include "fragctl/error.hpp"
#include "fragctl/log.hpp"
#include "fragctl/process_hooks.hpp"
#include "fragctl/stats_export.hpp"

namespace fragctl {
namespace {

// What `path` names (an output's after expand_output_path), to tell two of
// them apart: an existing file's device and inode (hard links, links in its
// directories), else the absolute path; nullopt for an existing file that
// is not a regular one (a device or FIFO is written into, by every output
// that names it: /dev/null) and for a link (the writer follows one only to a
// device or FIFO and refuses the rest: core/atomic_file.hpp), so that an
// output the writer will not replace holds no file from another.
std::optional<std::string> file_named(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) return std::nullopt;
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) return std::nullopt;
    return fmt::format("inode {}:{}", st.st_dev, st.st_ino);
  }
  std::error_code ec;
  const std::filesystem::path absolute = std::filesystem::absolute(path, ec);
  if (ec) return path;
  const std::filesystem::path normal = std::filesystem::weakly_canonical(absolute, ec);
  return ec ? absolute.lexically_normal().string() : normal.string();
}

// Two outputs on one file: the one written last replaces the other (the
// report written at exit over the whole trace), and an output on the
// warmup profile (of a warmup policy) replaces that input once it is read.
// The report is kept, then the trace, then the Prometheus file; an output on
// the file of one kept before it, or of the profile, is dropped with an error
// naming both.
void drop_shared_outputs(config& cfg) {
  std::vector<std::pair<std::string_view, std::string>> kept;
  if (!cfg.warmup_profile.empty() && cfg.policy.find("warmup") != std::string::npos) {
    if (std::optional<std::string> file = file_named(cfg.warmup_profile)) kept.emplace_back("warmup_profile", *file);
  }
  for (const auto& [name, path] : {std::pair<std::string_view, std::string*>{"report", &cfg.report_path},
                                   {"trace", &cfg.trace_path},
                                   {"prometheus", &cfg.prometheus_path}}) {
    if (path->empty()) continue;
    std::optional<std::string> file = file_named(expand_output_path(*path));
    if (!file) continue;
    const auto same = std::find_if(kept.begin(), kept.end(), [&](const auto& k) { return k.second == *file; });
    if (same == kept.end()) {
      kept.emplace_back(name, std::move(*file));
      continue;
    }
    logger().error("{} \"{}\" names the file of {} too: not written, so that it does not replace {}; name "
                   "another file",
                   name, *path, same->first, same->first == "warmup_profile" ? "that input" : "that output");
    path->clear();
  }
}

}  // namespace

allocator_stack::allocator_stack(std::unique_ptr<device_backend> backend, const config& cfg)
    : cfg_(cfg), backend_(std::move(backend)) {
  if (!backend_) throw invalid_argument("allocator_stack: backend is null");
  if (!cfg_.log_level.empty() && !set_log_level(cfg_.log_level)) {
    throw invalid_argument(fmt::format(
        "FRAGCTL_LOG_LEVEL: unknown level \"{}\"; accepted: trace, debug, info, warn, error, critical, off",
        cfg_.log_level));
  }
  drop_shared_outputs(cfg_);
  std::unique_ptr<device_allocator> top = build_configured_policy(cfg_, *backend_);
  auto limiting = std::make_unique<limiting_adaptor>(std::move(top), cfg_.limit != 0 ? cfg_.limit : SIZE_MAX);
  limiting_ = limiting.get();
  top = std::make_unique<stream_use_adaptor>(std::move(limiting));
  if (cfg_.block_table) top = std::make_unique<block_table_adaptor>(std::move(top));
  auto statistics = std::make_unique<statistics_adaptor>(std::move(top));
  statistics_ = statistics.get();
  top = std::move(statistics);
  if (!cfg_.trace_path.empty()) top = std::make_unique<tracing_adaptor>(std::move(top), cfg_.trace_path);
  if (cfg_.thread_safe) top = std::make_unique<thread_safe_adaptor>(std::move(top));
  top_ = std::move(top);

  logger().debug("allocator stack: policy {} on {} device {}{}{}{}", cfg_.policy, backend_->name(),
                 backend_->device(), cfg_.limit != 0 ? fmt::format(", limit {} bytes", cfg_.limit) : "",
                 cfg_.trace_path.empty() ? "" : ", tracing to " + cfg_.trace_path,
                 cfg_.thread_safe ? ", thread-safe" : "");
  if (!cfg_.report_path.empty() || !cfg_.prometheus_path.empty()) {
    const stats_export_outputs outputs{cfg_.report_path, cfg_.prometheus_path,
                                       std::chrono::milliseconds(cfg_.report_interval_ms)};
    memory_map_source map;
    if (cfg_.report_map) map = [this] { return top_->memory_map(); };
    register_stats_export(
        this, outputs, [this] { return report_stats(); }, std::move(map));
  }
  // Last: nothing after it throws, so the destructor always leaves.
  join_device_memory_ledger(*backend_, keeps_graph_pool(), statistics_->stats().device_memory.outside_at_start);
}

allocator_stack::~allocator_stack() {
  if (!cfg_.report_path.empty() || !cfg_.prometheus_path.empty()) retire_stats_export(this);
  leave_device_memory_ledger(*backend_);
  top_.reset();  // before the streams it may still use as it ends
  for (const stream_t s : streams_) {
    try {
      backend_->destroy_stream(s);
    } catch (const std::exception& e) {
      logger().warn("allocator stack: destroying stream {} failed: {}", s, e.what());
    }
  }
}

stream_t allocator_stack::create_stream() {
  const stream_t s = backend_->create_stream();
  try {
    streams_.push_back(s);
  } catch (...) {
    backend_->destroy_stream(s);
    throw;
  }
  return s;
}

namespace {

// The policy under the stack's adaptors.
device_allocator& policy_of(device_allocator& top) {
  device_allocator* a = &top;
  while (auto* adaptor = dynamic_cast<forwarding_adaptor*>(a)) a = &adaptor->upstream();
  return *a;
}

}  // namespace

bool allocator_stack::keeps_graph_pool() const noexcept {
  return dynamic_cast<graph_pool_policy*>(&policy_of(*top_)) != nullptr;
}

bool allocator_stack::keeps_block_table() const noexcept { return cfg_.block_table || keeps_graph_pool(); }

bool allocator_stack::graph_pool_reclaim(void* ptr) {
  auto* pool = dynamic_cast<graph_pool_policy*>(&policy_of(*top_));
  if (pool == nullptr) {
    throw invalid_argument(fmt::format("graph_pool_reclaim: policy {} is not a graph_pool", cfg_.policy));
  }
  // The claim and the allocation it steers, with no other call between them.
  auto reclaim = [&](device_allocator& a) {
    const std::optional<block_record> kept = pool->claim(ptr);
    if (!kept) return false;
    void* got = a.allocate(kept->bytes, kept->stream);
    if (got != ptr) {
      a.deallocate(got, kept->bytes, kept->stream);
      throw error(fmt::format("graph_pool_reclaim: the pool handed out {} instead of {}", got, ptr));
    }
    return true;
  };
  if (auto* locked = dynamic_cast<thread_safe_adaptor*>(top_.get())) return locked->exclusive(reclaim);
  return reclaim(*top_);
}

void allocator_stack::set_limit(std::size_t bytes) noexcept { limiting_->set_limit(bytes != 0 ? bytes : SIZE_MAX); }

std::size_t allocator_stack::limit() const noexcept {
  const std::size_t limit = limiting_->limit();
  return limit == SIZE_MAX ? 0 : limit;
}

void allocator_stack::reset_peaks() noexcept { statistics_->reset_peaks(); }

allocator_stats allocator_stack::stats() const {
  // Through the top so that the pool state is read under the stack's lock.
  allocator_stats s = statistics_->stats(top_->state());
  s.allocator = cfg_.policy;
  return s;
}

allocator_stats allocator_stack::report_stats() const {
  allocator_stats s = stats();
  try {
    const memory_info info = backend_->get_memory_info();
    s.device_memory.measured = true;
    s.device_memory.free = info.free;
    s.device_memory.total = info.total;
    s.device_memory.split =
        device_memory_split_of(*backend_, s.reserved.current, info.free, info.total, s.device_memory.outside_at_start);
  } catch (const std::exception& e) {  // a runtime already unloading at exit: the report goes without
    logger().debug("report: no device memory information ({})", e.what());
  }
  return s;
}

stats_export_entry allocator_stack::export_entry() const {
  stats_export_entry r{report_stats(), std::nullopt};
  if (cfg_.report_map) r.map = top_->memory_map();
  return r;
}

std::unique_ptr<allocator_stack> make_allocator(const config& cfg) {
  return std::make_unique<allocator_stack>(make_backend(cfg), cfg);
}

}  // namespace fragctl
