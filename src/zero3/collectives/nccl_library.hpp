// The NCCL / RCCL entry points fragctl calls, loaded with dlopen. RCCL exports
// NCCL's names. Prototypes are declared here with plain types (no nccl.h at
// build time); the values of the enums are NCCL's stable ABI.
#pragma once

#include <cstddef>
#include <string>

#include "fragctl/zero3/communicator.hpp"

namespace fragctl::zero3::nccl {

using result_t = int;  // ncclResult_t
inline constexpr result_t success = 0;
inline constexpr result_t in_progress = 7;

// ncclDataType_t
inline constexpr int type_uint8 = 1;
inline constexpr int type_float16 = 6;
inline constexpr int type_float32 = 7;
inline constexpr int type_bfloat16 = 9;
// ncclRedOp_t
inline constexpr int op_sum = 0;

[[nodiscard]] int type_of(data_type t) noexcept;

/// ncclUniqueId, passed by value as NCCL does.
struct unique_id_t {
  char internal[128];
};

/// ncclConfig_t as NCCL 2.17 defined it. NCCL reads `size` bytes of a config
/// and takes defaults for fields newer than `version`, so this prefix is
/// accepted by every later NCCL and by RCCL.
struct config_v21700 {
  std::size_t size = sizeof(config_v21700);
  unsigned int magic = 0xcafebeefU;
  unsigned int version = 21700;  // NCCL_VERSION(2, 17, 0)
  int blocking = 0;               // non-blocking: every wait is ours, with a deadline
  int cga_cluster_size = -2147483647 - 1;  // NCCL_CONFIG_UNDEF_INT
  int min_ctas = -2147483647 - 1;
  int max_ctas = -2147483647 - 1;
  const char* net_name = nullptr;
};

using comm_t = void*;

struct library {
  std::string path;
  std::string name;  // "nccl" or "rccl"
  int version = 0;

  result_t (*get_version)(int*) = nullptr;
  result_t (*get_unique_id)(unique_id_t*) = nullptr;
  result_t (*comm_init_rank_config)(comm_t*, int, unique_id_t, int, config_v21700*) = nullptr;
  result_t (*all_gather)(const void*, void*, std::size_t, int, comm_t, void*) = nullptr;
  result_t (*reduce_scatter)(const void*, void*, std::size_t, int, int, comm_t, void*) = nullptr;
  result_t (*comm_abort)(comm_t) = nullptr;
  result_t (*comm_destroy)(comm_t) = nullptr;
  result_t (*comm_finalize)(comm_t) = nullptr;  // NCCL >= 2.14; may be missing
  result_t (*comm_get_async_error)(comm_t, result_t*) = nullptr;
  result_t (*group_start)() = nullptr;
  result_t (*group_end)() = nullptr;
  const char* (*get_error_string)(result_t) = nullptr;
  const char* (*get_last_error)(comm_t) = nullptr;  // may be missing

  /// "ncclInvalidUsage: <last error>" for messages.
  [[nodiscard]] std::string describe(result_t r, comm_t comm) const;
};

/// Loads the library `options` names (the process keeps it loaded). Throws
/// backend_error naming the library or the missing symbol.
[[nodiscard]] const library& load(const nccl_options& options);

}  // namespace fragctl::zero3::nccl
