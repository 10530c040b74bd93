// The environment variables: one table row per variable gives its name, what
// it takes, its help, and (for those config_from_environment applies) how it
// sets the config and where its default lives. The misspelling warning, the
// docs (docs/configuration.md, tested) and `fragctl --help` read the same
// rows; every getenv of fragctl goes through environment_value.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <mutex>

#include "fmt/format.h"
#include "fragctl/config.hpp"
#include "fragctl/error.hpp"
#include "fragctl/log.hpp"
#include "util/config_table.hpp"
#include "util/pytorch_conf.hpp"
#include "util/strings.hpp"

namespace fragctl {

namespace {

using applier = std::function<absl::Status(config&, std::string_view)>;

struct environment_row {
  environment_variable info;  ///< default_value left empty: `shown` or `option` fills it
  applier apply;              ///< null for a variable read outside config_from_environment
  /// Its value in a config, for a variable that sets a field no option has.
  std::function<std::string(const config&)> shown{};
  /// The FRAGCTL_CONF key it overrides: its default is the option's ("0 (off)").
  std::string_view option{};
};

constexpr std::string_view by_config = "config_from_environment";
constexpr std::string_view by_launcher = "output paths and the report (launcher of a distributed job)";

// A variable that sets FRAGCTL_CONF option `key` (and overrides it): the
// option's parser and its default, as config_options() shows it.
environment_row same_as_option(std::string_view name, std::string_view value, std::string_view key,
                               std::string_view help) {
  return {{name, value, {}, help, by_config},
          [key](config& c, std::string_view v) { return util::set_option(c, key, v); },
          nullptr,
          key};
}

environment_row read_elsewhere(std::string_view name, std::string_view value, std::string_view help,
                               std::string_view reader) {
  return {{name, value, {}, help, reader}, nullptr};
}

std::vector<environment_row> make_rows() {
  return {
      {{"FRAGCTL_POLICY",
        "policy expression",
        {},
        "which allocator policy; unset: arena where the backend has virtual memory, else caching",
        by_config},
       [](config& c, std::string_view v) {
         c.policy = std::string(util::trim(v));
         return absl::OkStatus();
       },
       [](const config& c) { return c.policy; }},
      {{"FRAGCTL_BACKEND", "cuda, hip, sim or auto", {}, "which device backend", by_config},
       [](config& c, std::string_view v) -> absl::Status {
         auto kind = parse_backend_kind(v);
         if (!kind.ok()) return kind.status();
         c.backend = *kind;
         return absl::OkStatus();
       },
       [](const config& c) { return std::string(backend_kind_name(c.backend)); }},
      {{"PYTORCH_CUDA_ALLOC_CONF",
        "PyTorch's key:value,...",
        {},
        "read only when FRAGCTL_CONF is unset: its keys with a fragctl meaning are applied",
        by_config},
       [](config& c, std::string_view v) -> absl::Status {
         if (environment_value("FRAGCTL_CONF").has_value()) return absl::OkStatus();
         auto pytorch = util::apply_pytorch_conf(v, c);
         if (!pytorch.ok()) return pytorch.status();
         // Once per process: every allocator reads the environment. A warning
         // only where fragctl applied a key of PyTorch's (its behaviour then
         // follows another program's variable); where it took none (`fragctl
         // run` sets backend:cudaMallocAsync for every job), a line at info.
         static std::atomic<bool> announced{false};
         if (!announced.exchange(true)) {
           logger().log(pytorch->mapped_any ? spdlog::level::warn : spdlog::level::info,
                        "FRAGCTL_CONF unset, read PYTORCH_CUDA_ALLOC_CONF: {}", pytorch->summary);
         }
         c = std::move(pytorch->applied);
         return absl::OkStatus();
       }},
      {{"FRAGCTL_CONF", "key:value,key:value", {}, "every other option (docs/configuration.md)", by_config},
       [](config& c, std::string_view v) -> absl::Status {
         auto parsed = parse_config(v, c);
         if (!parsed.ok()) return parsed.status();
         c = std::move(*parsed);
         return absl::OkStatus();
       }},
      same_as_option("FRAGCTL_REPORT", "file path", "report", "write the JSON statistics report there at exit"),
      same_as_option("FRAGCTL_TRACE", "file path", "trace", "record every allocate and free as trace CSV"),
      same_as_option("FRAGCTL_REPORT_INTERVAL", "duration", "report_interval",
                     "also rewrite the report and Prometheus files this often"),
      same_as_option("FRAGCTL_PROMETHEUS", "file path", "prometheus", "write the statistics as Prometheus text"),
      {{"FRAGCTL_LOG_LEVEL",
        "trace, debug, info, warn, error, critical or off",
        {},
        "level of the [fragctl] log lines on stderr (the logger reads it when the library loads)",
        by_config},
       [](config& c, std::string_view v) {
         c.log_level = std::string(v);
         return absl::OkStatus();
       },
       [](const config& c) { return c.log_level.empty() ? std::string(default_log_level) : c.log_level; }},
      read_elsewhere("FRAGCTL_NCCL_LIBRARY", "file path",
                     "zero3: the NCCL or RCCL library to dlopen instead of the default names", "zero3 NCCL loader"),
      read_elsewhere("FRAGCTL_NCCL_UNIQUE_ID", "hex",
                     "zero3: the NCCL unique id of a multi-process job (nccl_options::unique_id_env)",
                     "zero3 NCCL communicator"),
      read_elsewhere("FRAGCTL_PRELOAD_LIBRARY", "file path",
                     "fragctl run: the LD_PRELOAD library to use instead of the one installed beside the command",
                     "fragctl run"),
      read_elsewhere("LD_PRELOAD", "file paths",
                     "fragctl run: the user's own preloads, kept after fragctl's libraries", "fragctl run"),
      read_elsewhere("FRAGCTL_LIBRARY", "file path", "Python: the libfragctl.so to load (nothing else is tried)",
                     "Python package"),
      read_elsewhere("FRAGCTL_TORCH_ROUTE", "auto, native or pluggable",
                     "Python: how fragctl.torch.enable installs the allocator", "Python package"),
      read_elsewhere("FRAGCTL_TORCH_BUILD_DIR", "directory",
                     "Python: where the PyTorch allocator extension is built and cached", "Python package"),
      // Set by the launcher of a distributed job (core/launcher_identity.hpp):
      // the "{rank}" placeholders of output paths and the report's rank.
      read_elsewhere("RANK", "integer", "torchrun: this process's rank ({rank} in output paths)", by_launcher),
      read_elsewhere("LOCAL_RANK", "integer", "torchrun: its rank on this host ({local_rank})", by_launcher),
      read_elsewhere("WORLD_SIZE", "integer", "torchrun: processes in the job ({world_size})", by_launcher),
      read_elsewhere("OMPI_COMM_WORLD_RANK", "integer", "Open MPI: this process's rank, when RANK is unset",
                     by_launcher),
      read_elsewhere("OMPI_COMM_WORLD_LOCAL_RANK", "integer", "Open MPI: its rank on this host", by_launcher),
      read_elsewhere("OMPI_COMM_WORLD_SIZE", "integer", "Open MPI: processes in the job", by_launcher),
      read_elsewhere("SLURM_PROCID", "integer",
                     "Slurm: this process's rank, when RANK and OMPI_COMM_WORLD_RANK are unset", by_launcher),
      read_elsewhere("SLURM_LOCALID", "integer", "Slurm: its rank on this host", by_launcher),
      read_elsewhere("SLURM_NTASKS", "integer", "Slurm: processes in the job", by_launcher),
  };
}

const std::vector<environment_row>& rows() {
  static const std::vector<environment_row> table = make_rows();
  return table;
}

const environment_row* find_row(std::string_view name) {
  for (const auto& r : rows())
    if (r.info.name == name) return &r;
  return nullptr;
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

/// Warns once per process about each FRAGCTL_* variable of the environment
/// that is not a row but within three edits of one (a typo such as
/// FRAGCTL_POLICYS), naming that one. Other FRAGCTL_* names belong to the
/// project's scripts and tests and are left alone.
void warn_misspelt_environment_variables() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      const std::string_view entry(*e);
      const std::string_view name = entry.substr(0, entry.find('='));
      if (!name.starts_with("FRAGCTL_") || find_row(name) != nullptr) continue;
      std::string_view closest;
      std::size_t best = 4;
      for (const environment_row& r : rows()) {
        if (const std::size_t d = edit_distance(name, r.info.name); d < best) {
          best = d;
          closest = r.info.name;
        }
      }
      if (!closest.empty())
        logger().warn("{} is not a fragctl variable and is ignored; did you mean {}?", name, closest);
    }
  });
}

}  // namespace

const std::vector<environment_variable>& environment_variables() {
  static const std::vector<environment_variable> infos = [] {
    const config defaults;
    std::vector<environment_variable> v;
    for (const environment_row& r : rows()) {
      environment_variable info = r.info;
      if (r.shown) info.default_value = r.shown(defaults);
      for (const option_info& o : config_options())
        if (o.key == r.option) info.default_value = o.default_value;
      v.push_back(std::move(info));
    }
    return v;
  }();
  return infos;
}

std::optional<std::string_view> environment_value(std::string_view name) {
  const environment_row* r = find_row(name);
  if (r == nullptr) throw invalid_argument(fmt::format("{} is not a row of environment_variables()", name));
  // The row's name is a string literal, so it is NUL-terminated.
  const char* value = std::getenv(r->info.name.data());
  if (value == nullptr) return std::nullopt;
  return std::string_view(value);
}

absl::StatusOr<config> config_from_environment() {
  warn_misspelt_environment_variables();
  config c;
  for (const environment_row& r : rows()) {
    if (!r.apply) continue;
    const std::string_view value = environment_value(r.info.name).value_or("");
    if (value.empty()) continue;
    if (absl::Status s = r.apply(c, value); !s.ok()) {
      const std::string_view message = util::to_std(s.message());
      if (message.starts_with(r.info.name)) return s;
      return absl::InvalidArgumentError(fmt::format("{}: {}", r.info.name, message));
    }
  }
  return c;
}

}  // namespace fragctl
