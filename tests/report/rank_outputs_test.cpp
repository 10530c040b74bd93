// One output per rank (issue 31, deliverable 2; docs/configuration.md,
// "Output paths"): "{rank}", "{local_rank}", "{world_size}", "{pid}" and
// "{host}" in FRAGCTL_REPORT, FRAGCTL_PROMETHEUS and FRAGCTL_TRACE come from
// the launcher's environment (torchrun, Open MPI, Slurm), a missing figure
// has a stated fallback, and the report document records the rank and the
// device's memory beside the allocator's.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/launcher_identity.hpp"
#include "core/output_paths.hpp"
#include "fmt/format.h"
#include "fragctl/allocator_stack.hpp"
#include "fragctl/process_hooks.hpp"
#include "fragctl/sim_backend.hpp"
#include "fragctl/stats_export.hpp"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "support/log_capture.hpp"
#include "support/test_support.hpp"

namespace fragctl {
namespace {

namespace fs = std::filesystem;
using detail::expand_placeholders;
using detail::launcher_identity;
using detail::launcher_identity_from;
using fragctl::testing::read_file;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr const char* launcher_variables[] = {"RANK",
                                              "LOCAL_RANK",
                                              "WORLD_SIZE",
                                              "OMPI_COMM_WORLD_RANK",
                                              "OMPI_COMM_WORLD_LOCAL_RANK",
                                              "OMPI_COMM_WORLD_SIZE",
                                              "SLURM_PROCID",
                                              "SLURM_LOCALID",
                                              "SLURM_NTASKS"};

// Sets `values` in the process environment, every other launcher variable
// unset (the test may itself run under Slurm), and restores all of them.
class launcher_environment {
 public:
  explicit launcher_environment(const std::map<std::string, std::string>& values) {
    for (const char* name : launcher_variables) {
      if (const char* old = std::getenv(name)) saved_.emplace_back(name, old);
      ::unsetenv(name);
    }
    for (const auto& [name, value] : values) ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~launcher_environment() {
    for (const char* name : launcher_variables) ::unsetenv(name);
    for (const auto& [name, value] : saved_) ::setenv(name.c_str(), value.c_str(), 1);
  }
  launcher_environment(const launcher_environment&) = delete;
  launcher_environment& operator=(const launcher_environment&) = delete;

 private:
  std::vector<std::pair<std::string, std::string>> saved_;
};

launcher_identity identity_of(const std::map<std::string, std::string>& env) {
  return launcher_identity_from([&env](std::string_view name) -> std::optional<std::string> {
    const auto it = env.find(std::string(name));
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}

std::string expand(std::string_view path, const launcher_identity& who, bool* per_process = nullptr) {
  bool unique = false;
  std::string out = expand_placeholders(path, who, unique);
  if (per_process != nullptr) *per_process = unique;
  return out;
}

std::string pid() { return fmt::format("{}", ::getpid()); }

std::string host() {
  char name[256] = {};
  EXPECT_EQ(::gethostname(name, sizeof name - 1), 0);
  return name;
}

fs::path fresh_dir(std::string_view name) { return testing::fresh_dir("rank_outputs", name); }

nlohmann::json read_json(const fs::path& path) {
  const std::string text = read_file(path);
  EXPECT_FALSE(text.empty()) << path << " was not written";
  return nlohmann::json::parse(text, nullptr, false);
}

// --- Each launcher's variables ------------------------------------------------

TEST(rank_outputs, torchrun_variables_fill_rank_local_rank_and_world_size) {
  const launcher_identity who = identity_of({{"RANK", "5"}, {"LOCAL_RANK", "1"}, {"WORLD_SIZE", "8"}});
  EXPECT_EQ(who.launcher, "torchrun");
  bool per_process = true;
  EXPECT_EQ(expand("/j/run.{rank}.{local_rank}.of{world_size}.json", who, &per_process), "/j/run.5.1.of8.json");
  EXPECT_FALSE(per_process) << "a rank names a process of the job, not this pid: the path is still claimed";
}

TEST(rank_outputs, open_mpi_variables_fill_rank_local_rank_and_world_size) {
  const launcher_identity who =
      identity_of({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
  EXPECT_EQ(who.launcher, "openmpi");
  EXPECT_EQ(expand("r{rank}-l{local_rank}-w{world_size}", who), "r3-l0-w4");
}

TEST(rank_outputs, slurm_variables_fill_rank_local_rank_and_world_size) {
  const launcher_identity who = identity_of({{"SLURM_PROCID", "12"}, {"SLURM_LOCALID", "4"}, {"SLURM_NTASKS", "16"}});
  EXPECT_EQ(who.launcher, "slurm");
  EXPECT_EQ(expand("r{rank}-l{local_rank}-w{world_size}", who), "r12-l4-w16");
}

// torchrun or mpirun inside an sbatch script: every process inherits the
// batch step's SLURM_PROCID=0; the inner launcher's figures are the ranks.
TEST(rank_outputs, the_innermost_launcher_wins_over_the_slurm_step_it_runs_in) {
  const std::map<std::string, std::string> slurm_step{
      {"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}, {"SLURM_NTASKS", "1"}};
  auto torchrun = slurm_step;
  torchrun.insert({{"RANK", "6"}, {"LOCAL_RANK", "2"}, {"WORLD_SIZE", "8"}});
  EXPECT_EQ(expand("{rank}/{local_rank}/{world_size}", identity_of(torchrun)), "6/2/8");
  auto mpirun = slurm_step;
  mpirun.insert({{"OMPI_COMM_WORLD_RANK", "7"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "8"}});
  EXPECT_EQ(identity_of(mpirun).launcher, "openmpi");
  EXPECT_EQ(expand("{rank}/{local_rank}/{world_size}", identity_of(mpirun)), "7/3/8");
}

TEST(rank_outputs, pid_host_and_percent_p_name_this_process) {
  bool per_process = false;
  EXPECT_EQ(expand("/j/{host}.{pid}.json", identity_of({}), &per_process), fmt::format("/j/{}.{}.json", host(), pid()));
  EXPECT_TRUE(per_process);
  EXPECT_EQ(expand("a%%b.%p.{rank}", identity_of({{"RANK", "2"}}), &per_process), fmt::format("a%b.{}.2", pid()));
  EXPECT_TRUE(per_process);
  EXPECT_EQ(expand("/j/{host}.json", identity_of({}), &per_process), fmt::format("/j/{}.json", host()));
  EXPECT_FALSE(per_process) << "a host name is shared by the ranks on it";
}

// --- Missing figures ----------------------------------------------------------

TEST(rank_outputs, a_missing_rank_becomes_the_pid_with_one_warning_per_path) {
  const testing::log_capture log;
  bool per_process = false;
  const launcher_identity none = identity_of({{"RANK", "not-a-number"}, {"LOCAL_RANK", "0"}});
  EXPECT_EQ(none.launcher, "");
  EXPECT_EQ(expand("/j/missing.{rank}.json", none, &per_process), fmt::format("/j/missing.{}.json", pid()));
  EXPECT_TRUE(per_process) << "the pid names this process alone: no claim, no .<pid> suffix";
  EXPECT_EQ(expand("/j/missing.{rank}.json", none), fmt::format("/j/missing.{}.json", pid()));
  EXPECT_EQ(testing::occurrences(log.text(),
                                 "/j/missing.{rank}.json: {rank} has no value (no launcher set RANK, "
                                 "OMPI_COMM_WORLD_RANK or SLURM_PROCID to a rank); the process id " +
                                     pid() + " stands in for it"),
            1u)
      << log.text();
}

TEST(rank_outputs, a_missing_local_rank_becomes_the_pid_and_a_missing_world_size_unknown) {
  const testing::log_capture log;
  bool per_process = false;
  // A rank set by hand, without the launcher's other two.
  const launcher_identity who = identity_of({{"RANK", "1"}});
  EXPECT_EQ(expand("/j/partial.{rank}.{local_rank}.{world_size}", who, &per_process),
            fmt::format("/j/partial.1.{}.unknown", pid()));
  EXPECT_TRUE(per_process);
  EXPECT_THAT(log.text(), HasSubstr("{local_rank} has no value (torchrun set no LOCAL_RANK); the process id " + pid() +
                                    " stands in for it"));
  EXPECT_THAT(log.text(), HasSubstr("{world_size} has no value (torchrun set no WORLD_SIZE); written as \"unknown\""));
}

TEST(rank_outputs, other_brace_text_is_kept_and_a_misspelt_placeholder_warned_about) {
  const testing::log_capture log;
  const launcher_identity who = identity_of({{"RANK", "0"}});
  EXPECT_EQ(expand("/j/{rnak}.{rank}.json", who), "/j/{rnak}.0.json");
  EXPECT_EQ(expand("/j/{a b}/{/{}.json", who), "/j/{a b}/{/{}.json");
  EXPECT_THAT(log.text(), HasSubstr("/j/{rnak}.{rank}.json: {rnak} is not a placeholder ({rank}, {local_rank}, "
                                    "{world_size}, {pid}, {host}); it is kept as written"));
  EXPECT_THAT(log.text(), Not(HasSubstr("{a b} is not")));
}

// --- Through the environment, as a launcher sets it --------------------------

TEST(rank_outputs, expand_output_path_reads_the_process_environment) {
  const launcher_environment env({{"SLURM_PROCID", "9"}, {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS", "10"}});
  EXPECT_EQ(expand_output_path("/nonexistent/fragctl/x.{rank}.{local_rank}.{world_size}.json"),
            "/nonexistent/fragctl/x.9.1.10.json");
}

// Each output kind goes through the one rule: a report, a Prometheus file and
// a trace of rank 3 of a torchrun job land at their ".3." names, and the
// report records the rank, the launcher and the host.
TEST(rank_outputs, report_prometheus_and_trace_paths_name_the_rank) {
  const fs::path dir = fresh_dir("kinds");
  const launcher_environment env({{"RANK", "3"}, {"LOCAL_RANK", "1"}, {"WORLD_SIZE", "4"}});
  config cfg;
  cfg.policy = "caching";
  cfg.report_path = (dir / "run.{rank}.json").string();
  cfg.prometheus_path = (dir / "run.{rank}.prom").string();
  cfg.trace_path = (dir / "run.{rank}.csv").string();
  {
    auto stack =
        std::make_unique<allocator_stack>(std::make_unique<sim_backend>(sim_options{.capacity = 1 * GiB}), cfg);
    stack->allocator().deallocate(stack->allocator().allocate(3 * MiB), 3 * MiB);
  }
  for (const char* name : {"run.3.json", "run.3.prom", "run.3.csv"})
    EXPECT_TRUE(fs::exists(dir / name)) << name << " missing";
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find('{'), std::string::npos) << e.path() << ": a literal brace";
  const nlohmann::json report = read_json(dir / "run.3.json");
  EXPECT_EQ(report["rank"], 3);
  EXPECT_EQ(report["local_rank"], 1);
  EXPECT_EQ(report["world_size"], 4);
  EXPECT_EQ(report["launcher"], "torchrun");
  EXPECT_EQ(report["host"], host());
}

TEST(rank_outputs, a_report_without_a_launcher_records_null_figures) {
  const launcher_environment env({});
  const nlohmann::json doc = nlohmann::json::parse(stats_export_to_json({}, "request"));
  EXPECT_TRUE(doc["rank"].is_null());
  EXPECT_TRUE(doc["local_rank"].is_null());
  EXPECT_TRUE(doc["world_size"].is_null());
  EXPECT_TRUE(doc["launcher"].is_null());
  EXPECT_EQ(doc["host"], host());
}

// The report file carries the device's free and total memory, asked of the
// backend when it is written, beside the allocator's reserved bytes: on sim
// the device holds nothing else, so used = reserved.
TEST(rank_outputs, the_report_file_records_the_device_memory_beside_the_allocators) {
  const fs::path dir = fresh_dir("device_memory");
  config cfg;
  cfg.policy = "caching";
  cfg.report_path = (dir / "r.json").string();
  auto stack = std::make_unique<allocator_stack>(std::make_unique<sim_backend>(sim_options{.capacity = 1 * GiB}), cfg);
  void* p = stack->allocator().allocate(30 * MiB);
  ASSERT_EQ(flush_process_outputs("request"), 1u);
  const nlohmann::json a = read_json(dir / "r.json")["allocators"][0];
  ASSERT_TRUE(a.contains("device_memory")) << a.dump();
  const std::size_t reserved = a["reserved_bytes"]["current"].get<std::size_t>();
  EXPECT_GE(reserved, 30 * MiB);
  EXPECT_EQ(a["device_memory"]["total"].get<std::size_t>(), 1 * GiB);
  EXPECT_EQ(a["device_memory"]["free"].get<std::size_t>(), 1 * GiB - reserved);
  EXPECT_EQ(a["device_memory"]["outside_at_start"].get<std::size_t>(), 0u);
  // Read back: the statistics keep it; statistics taken for anything else do not ask the device.
  const auto back = stats_export_from_json(read_file(dir / "r.json"));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->front().device_memory.measured);
  EXPECT_EQ(back->front().device_memory.total, 1 * GiB);
  EXPECT_FALSE(stack->stats().device_memory.measured);
  EXPECT_THAT(to_json(stack->stats()), Not(HasSubstr("device_memory")));
  stack->allocator().deallocate(p, 30 * MiB);
}

}  // namespace
}  // namespace fragctl
