// fragctl run: starts a program with libfragctl_preload.so preloaded and
// fragctl's environment set, the first way to try fragctl (docs/integration.md).
//
// The program is a child of this process, not an exec of it, so that the
// report's path can be printed when it ends. Everything else behaves as if
// the program had been started directly: signals sent to `fragctl run` reach
// it, its exit status is ours, and a program killed by a signal makes this
// process die of the same signal. Children it starts (torchrun's workers)
// inherit the environment, so each gets the shim.
#include <glob.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "command.hpp"
#include "core/output_paths.hpp"
#include "fmt/format.h"
#include "fragctl/config.hpp"
#include "fragctl/policy.hpp"
#include "util/pytorch_conf.hpp"
#include "util/strings.hpp"

namespace fragctl::cli {
namespace {

namespace fs = std::filesystem;

constexpr const char* shim_name = "libfragctl_preload.so";
constexpr const char* jemalloc_name = "libfragctl_jemalloc.so";
constexpr const char* torch_backend = "backend:cudaMallocAsync";

/// The preload library: --preload, else FRAGCTL_PRELOAD_LIBRARY, else beside
/// this program as the wheel and `cmake --install` lay it out (bin/../lib),
/// or as the build tree does (tools/../).
fs::path find_shim(const arguments& args) {
  if (const auto chosen = args.get("preload")) {
    if (chosen->empty()) throw usage_error("--preload: expected a library path, got an empty one");
    return fs::absolute(*chosen);
  }
  if (const auto env = environment_value("FRAGCTL_PRELOAD_LIBRARY"); env && !env->empty())
    return fs::absolute(std::string(*env));
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  std::vector<fs::path> looked;
  if (!ec) {
    const fs::path dir = self.parent_path();
    for (const fs::path& candidate : {dir / ".." / "lib" / shim_name, dir / ".." / shim_name, dir / shim_name}) {
      if (fs::is_regular_file(candidate, ec)) return fs::weakly_canonical(candidate, ec);
      looked.push_back(candidate.lexically_normal());
    }
  }
  std::string where;
  for (const fs::path& p : looked) where += "\n  " + p.string();
  throw std::runtime_error(fmt::format("{} not found; looked in:{}\nName it with --preload PATH or "
                                       "FRAGCTL_PRELOAD_LIBRARY (fragctl.preload_library() in Python gives the wheel's)",
                                       shim_name, where));
}

void set(const char* name, const std::string& value) { ::setenv(name, value.c_str(), 1); }

std::optional<std::string> environment_string(std::string_view name) {
  const auto v = environment_value(name);
  return v ? std::optional<std::string>(*v) : std::nullopt;
}

std::string env_or(std::string_view name, std::string fallback) {
  return environment_string(name).value_or(std::move(fallback));
}

bool says_async_backend(std::string_view conf) {
  return conf.find("backend:cudaMallocAsync") != std::string_view::npos;
}

/// A user's PYTORCH_CUDA_ALLOC_CONF under the shim, item by item (`backend`
/// left out: the shim needs cudaMallocAsync).
struct pytorch_conf_parts {
  std::string fragctl;  ///< what fragctl applies (max_split_size_mb, expandable_segments)
  std::string torch;    ///< what stays PyTorch's: its pinned host memory's keys, and keys fragctl does not know
  std::string dropped;  ///< keys of PyTorch's own device allocator, which the shim replaces
};

pytorch_conf_parts split_pytorch_conf(std::string_view conf) {
  pytorch_conf_parts parts;
  const auto append = [](std::string& to, std::string_view item) {
    if (!to.empty()) to.append(",");
    to.append(item);
  };
  for (const std::string_view item : util::pytorch_conf_items(conf)) {
    const std::size_t colon = item.find(':');
    const std::string_view key = util::trim(item.substr(0, colon));
    if (key == "backend") continue;
    switch (util::owner_of_pytorch_key(key)) {
      case util::pytorch_key_owner::fragctl: append(parts.fragctl, item); break;  // a bad value is refused below
      case util::pytorch_key_owner::pytorch: append(parts.torch, item); break;  // PyTorch judges a key neither knows
      case util::pytorch_key_owner::device_allocator: append(parts.dropped, item); break;
    }
  }
  return parts;
}

/// Sets the child's environment from the options, checking the policy and
/// the options first, so that a typo stops here rather than in every worker;
/// returns the report path the program will write.
std::string prepare_environment(const arguments& args, const fs::path& shim) {
  // The option, or else the variable the program would read: a bad value
  // of either stops here (before, a bad FRAGCTL_POLICY failed every
  // allocation of the program, which ran on).
  const auto policy = args.get("policy");
  if (const std::optional<std::string> value = policy ? policy : environment_string("FRAGCTL_POLICY")) {
    if (const absl::Status s = validate_policy(*value); !s.ok())
      throw usage_error(fmt::format("{}: {}", policy ? "--policy" : "FRAGCTL_POLICY", std::string(s.message())));
    set("FRAGCTL_POLICY", *value);
  }
  const auto backend = args.get("backend");
  if (const std::optional<std::string> value = backend ? backend : environment_string("FRAGCTL_BACKEND")) {
    if (auto kind = parse_backend_kind(*value); !kind.ok())
      throw usage_error(
          fmt::format("{}: {}", backend ? "--backend" : "FRAGCTL_BACKEND", std::string(kind.status().message())));
    set("FRAGCTL_BACKEND", *value);
  }
  // PyTorch reaches the shim through cudaMallocAsync. A user's own
  // PYTORCH_CUDA_ALLOC_CONF is shared out: the keys fragctl applies
  // (max_split_size_mb, expandable_segments) move to FRAGCTL_CONF unless
  // fragctl's options are given; PyTorch keeps its pinned host memory's keys
  // and any fragctl does not know; the keys of PyTorch's own device
  // allocator, which the shim replaces, are left out, saying so.
  const std::string pytorch_conf = env_or("PYTORCH_CUDA_ALLOC_CONF", "");
  std::string conf = args.get("conf").value_or(env_or("FRAGCTL_CONF", ""));
  std::string conf_source = args.has("conf") ? "--conf" : "FRAGCTL_CONF";
  std::string shared_out;  // said once the options are checked
  if (!says_async_backend(pytorch_conf)) {
    const pytorch_conf_parts parts = split_pytorch_conf(pytorch_conf);
    const std::string torch =
        parts.torch.empty() ? std::string(torch_backend) : fmt::format("{},{}", torch_backend, parts.torch);
    const bool options_given = args.has("conf") || environment_value("FRAGCTL_CONF").has_value();
    if (!parts.fragctl.empty() && !options_given) {
      conf = parts.fragctl;
      conf_source = "PYTORCH_CUDA_ALLOC_CONF (which fragctl run applies as FRAGCTL_CONF)";
    }
    if (!util::trim(pytorch_conf).empty()) {
      std::string takes = "nothing";
      if (!parts.fragctl.empty())
        takes = options_given ? fmt::format("nothing ({} is given; {} not applied)", conf_source, parts.fragctl)
                              : fmt::format("{} (as FRAGCTL_CONF)", parts.fragctl);
      shared_out = util::printable(fmt::format(
          "PYTORCH_CUDA_ALLOC_CONF={} is applied: fragctl takes {}; PyTorch gets {}{}", pytorch_conf, takes, torch,
          parts.dropped.empty()
              ? ""
              : fmt::format("; left out: {} (PyTorch's own device allocator's, which fragctl replaces here)",
                            parts.dropped)));
    }
    set("PYTORCH_CUDA_ALLOC_CONF", torch);
  }
  config conf_cfg;  // the options' files: outputs and the warmup profile
  if (!conf.empty()) {
    auto parsed = parse_config(conf);
    if (!parsed.ok()) {
      std::string message(parsed.status().message());
      if (message.rfind("FRAGCTL_CONF: ", 0) == 0) message.erase(0, std::string_view("FRAGCTL_CONF: ").size());
      throw usage_error(fmt::format("{}: {}", conf_source, message));
    }
    conf_cfg = *std::move(parsed);
    set("FRAGCTL_CONF", conf);
  }
  if (!shared_out.empty()) std::fprintf(stderr, "fragctl run: %s\n", shared_out.c_str());
  for (const auto& [option, variable] : {std::pair{"report", "FRAGCTL_REPORT"}, {"prometheus", "FRAGCTL_PROMETHEUS"},
                                         {"trace", "FRAGCTL_TRACE"}}) {
    if (const auto path = args.get(option)) {
      if (path->empty()) throw usage_error(fmt::format("--{}: expected a file path, got an empty one", option));
      set(variable, fs::absolute(*path).string());
    }
  }
  if (!environment_value("FRAGCTL_REPORT") && conf_cfg.report_path.empty())
    set("FRAGCTL_REPORT", (fs::current_path() / fmt::format("fragctl.{}.report.json", ::getpid())).string());
  // The variables win over the options' keys (docs/configuration.md), so
  // each output is the variable's file, else the key's.
  const std::string report = env_or("FRAGCTL_REPORT", conf_cfg.report_path);
  refuse_shared_outputs(
      {{"the report (--report, FRAGCTL_REPORT, report:)", report},
       {"the Prometheus file (--prometheus, FRAGCTL_PROMETHEUS, prometheus:)",
        env_or("FRAGCTL_PROMETHEUS", conf_cfg.prometheus_path)},
       {"the trace (--trace, FRAGCTL_TRACE, trace:)", env_or("FRAGCTL_TRACE", conf_cfg.trace_path)}},
      {{"the warmup profile (warmup_profile:)", conf_cfg.warmup_profile}});
  // The pinned host tier's jemalloc needs 2.6 KiB of static TLS, which only
  // a library loaded at start-up gets (docs/packaging.md): preloaded beside
  // the shim, a Python program's offload store uses it.
  std::string ours = shim.string();
  std::error_code ec;
  if (const fs::path jemalloc = shim.parent_path() / jemalloc_name; fs::is_regular_file(jemalloc, ec))
    ours.append(":").append(jemalloc.string());
  if (const std::string preload = env_or("LD_PRELOAD", ""); !preload.empty()) ours.append(":").append(preload);
  set("LD_PRELOAD", ours);
  return report;
}

pid_t child = -1;

/// Passes a signal on to the program. One the terminal sent (Ctrl-C,
/// Ctrl-\) reached the program's process group already: not sent twice.
void forward(int sig, siginfo_t* info, void*) {
  if (child > 0 && (info == nullptr || info->si_code <= 0)) ::kill(child, sig);
}

constexpr int forwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGWINCH, SIGCONT};

/// Files the program wrote under the report path `path` since `since`: every
/// expansion of its placeholders (output_path_glob: "%p", "{rank}", ... in
/// any directory of it too) and the per-process names the library chooses
/// when several processes share one ("<path>.<pid>", "<path>.<pid>.<suffix>";
/// docs/integration.md), never a temporary.
std::vector<fs::path> written(const fs::path& path, fs::file_time_type since) {
  std::vector<fs::path> found;
  const std::string pattern = detail::output_path_glob(path.string());
  for (const std::string& p : {pattern, pattern + ".*"}) {
    glob_t matches{};
    if (::glob(p.c_str(), GLOB_NOSORT, nullptr, &matches) == 0) {
      for (std::size_t i = 0; i < matches.gl_pathc; ++i) {
        const fs::path file = matches.gl_pathv[i];
        std::error_code ec;
        if (file.filename().string().find(".tmp.") != std::string::npos || !fs::is_regular_file(file, ec)) continue;
        if (fs::last_write_time(file, ec) >= since && !ec) found.push_back(file);
      }
    }
    ::globfree(&matches);
  }
  std::sort(found.begin(), found.end());
  found.erase(std::unique(found.begin(), found.end()), found.end());
  return found;
}

}  // namespace

const command_spec& run_spec() {
  static const command_spec spec = {
      "run",
      "[--] COMMAND [ARGS...]",
      "Run COMMAND with fragctl's LD_PRELOAD library and print where its reports went.",
      "COMMAND runs with libfragctl_preload.so preloaded (its children too: torchrun's workers;\n"
      "libfragctl_jemalloc.so too, for the offload store's pinned host tier),\n"
      "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync so that PyTorch's allocations reach it,\n"
      "and FRAGCTL_* set from the options. A PYTORCH_CUDA_ALLOC_CONF of the user's own is shared\n"
      "out: fragctl applies max_split_size_mb and expandable_segments (as FRAGCTL_CONF), PyTorch\n"
      "keeps its pinned_* keys, and its device allocator's other keys are left out (one line says\n"
      "which). Without --report, the report goes to fragctl.<pid>.report.json here (<pid> this\n"
      "command's; other processes add .<their pid>). Signals reach COMMAND; fragctl run exits as\n"
      "COMMAND did.\n"
      "Options end at COMMAND: `fragctl run python train.py --lr 1` passes --lr to train.py.\n"
      "Example: fragctl run --policy arena --report train.json -- torchrun --nproc-per-node 2 train.py\n",
      {{"policy", "P", "allocation policy (FRAGCTL_POLICY): arena, caching, buckets:arena, ..."},
       {"conf", "K:V,...", "options (FRAGCTL_CONF), checked before COMMAND starts"},
       {"backend", "B", "device backend (FRAGCTL_BACKEND): cuda, hip, sim or auto"},
       {"report", "FILE", "JSON report at exit (FRAGCTL_REPORT)"},
       {"prometheus", "FILE", "Prometheus text at exit (FRAGCTL_PROMETHEUS)"},
       {"trace", "FILE", "record a trace (FRAGCTL_TRACE)"},
       {"preload", "PATH", "the preload library (default: the one installed beside this command)"}},
      true};
  return spec;
}

int run_run(const arguments& args) {
  if (args.positional.empty()) throw usage_error("expected a COMMAND to run\nRun 'fragctl run --help' for its options.");
  const fs::path shim = find_shim(args);
  if (!fs::is_regular_file(shim)) throw std::runtime_error(fmt::format("{}: no such file", shim.string()));
  const std::string report_path = prepare_environment(args, shim);
  // Absolute, so that its directory can be read (a relative FRAGCTL_REPORT's is "").
  std::error_code ec;
  const fs::path report = fs::absolute(report_path, ec);
  const auto started = fs::file_time_type::clock::now() - std::chrono::seconds(1);

  std::vector<char*> argv;
  for (const std::string& a : args.positional) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  struct sigaction pass {};
  pass.sa_sigaction = forward;
  pass.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&pass.sa_mask);
  for (int sig : forwarded) ::sigaction(sig, &pass, nullptr);

  std::fflush(nullptr);
  child = ::fork();
  if (child < 0) throw std::runtime_error(fmt::format("fork: {}", std::strerror(errno)));
  if (child == 0) {
    struct sigaction original {};
    original.sa_handler = SIG_DFL;
    for (int sig : forwarded) ::sigaction(sig, &original, nullptr);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "fragctl run: %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(errno == ENOENT ? 127 : 126);
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) throw std::runtime_error(fmt::format("waitpid: {}", std::strerror(errno)));
  }
  child = -1;
  const std::vector<fs::path> reports = written(report, started);
  for (const fs::path& r : reports) std::fprintf(stderr, "fragctl run: report %s\n", util::printable(r.string()).c_str());
  if (reports.empty())
    std::fprintf(stderr,
                 "fragctl run: no report at %s: the program allocated nothing through fragctl, or the report could "
                 "not be written there (its [fragctl] lines above say why)\n",
                 util::printable(report.string()).c_str());
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    std::fflush(nullptr);
    ::signal(sig, SIG_DFL);
    sigset_t only{};
    sigemptyset(&only);
    sigaddset(&only, sig);
    ::sigprocmask(SIG_UNBLOCK, &only, nullptr);
    ::raise(sig);
    return 128 + sig;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

}  // namespace fragctl::cli
