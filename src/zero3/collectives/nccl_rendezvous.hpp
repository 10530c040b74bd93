// The unique id an NCCL / RCCL communicator is created with, agreed on by
// every rank (nccl_rendezvous.cpp). Internal to src/zero3.
#pragma once

#include "fragctl/zero3/communicator.hpp"
#include "zero3/collectives/nccl_library.hpp"

namespace fragctl::zero3 {

/// The unique id for `o.rank` of `o.size`: from $`o.unique_id_env` when set
/// (hex); else with a unique_id_file, rank 0 creates one and writes it there
/// atomically and the others wait for the file up to `o.timeout`; else, for
/// one rank, a fresh id. Throws invalid_argument (a bad id, no way to get
/// one, a file rank 0 cannot write), backend_error (ncclGetUniqueId), and
/// collective_error (timed out) when the file does not appear in time.
[[nodiscard]] nccl::unique_id_t obtain_unique_id(const nccl::library& lib, const nccl_options& o);

}  // namespace fragctl::zero3
