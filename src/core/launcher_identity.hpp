// Which rank of a distributed job this process is, as the program that
// started it says in the environment (docs/configuration.md, "Output
// paths"). Output paths name it ("{rank}", core/output_paths.hpp) and the
// report document records it (fragctl/stats_export.hpp).
//
// Each launcher sets three variables in every process it starts:
//
//   launcher                      rank                  local rank                  world size
//   torchrun (torch.distributed)  RANK                  LOCAL_RANK                  WORLD_SIZE
//   Open MPI (mpirun)             OMPI_COMM_WORLD_RANK  OMPI_COMM_WORLD_LOCAL_RANK  OMPI_COMM_WORLD_SIZE
//   Slurm (srun)                  SLURM_PROCID          SLURM_LOCALID               SLURM_NTASKS
//
// The launcher is the first of these, in this order, whose rank variable
// holds a non-negative integer, and all three figures come from it: a
// launcher started inside another's process inherits the outer one's
// variables (torchrun or mpirun in an sbatch script sees SLURM_PROCID=0 in
// every process), so the innermost launcher, which is listed first, wins.
// A figure the chosen launcher does not give is unknown; so is every one
// when no launcher's rank is set. The environment is read at each call.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace fragctl::detail {

/// The rank figures of one process, and its host.
struct launcher_identity {
  std::string_view launcher;               ///< "torchrun", "openmpi", "slurm"; empty when none was found
  std::optional<std::int64_t> rank;        ///< global rank
  std::optional<std::int64_t> local_rank;  ///< rank among the processes of its host
  std::optional<std::int64_t> world_size;  ///< processes in the job
  std::string host;                        ///< gethostname(), "unknown" when it fails; never holds '/'
};

/// An environment lookup: the value of a variable, nullopt when unset.
using environment_lookup = std::function<std::optional<std::string>(std::string_view name)>;

/// The identity `lookup` describes (tests pass their own environment); the
/// host is always this machine's. Thread-safe if `lookup` is.
[[nodiscard]] launcher_identity launcher_identity_from(const environment_lookup& lookup);

/// The identity this process's environment describes, read through
/// fragctl::environment_value (each variable is a row of
/// environment_variables()). Thread-safe as getenv is (not against a
/// concurrent setenv).
[[nodiscard]] launcher_identity process_launcher_identity();

/// Why `figure` ("rank", "local_rank" or "world_size") of `who` is unknown,
/// for messages: "no launcher set RANK, OMPI_COMM_WORLD_RANK or
/// SLURM_PROCID to a rank", or "torchrun set no LOCAL_RANK".
[[nodiscard]] std::string why_unknown(const launcher_identity& who, std::string_view figure);

}  // namespace fragctl::detail
