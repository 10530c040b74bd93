// The launcher's rank figures (core/launcher_identity.hpp).
#include "core/launcher_identity.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <climits>

#include "fmt/format.h"
#include "fragctl/config.hpp"
#include "util/strings.hpp"

namespace fragctl::detail {
namespace {

struct launcher_variables {
  std::string_view launcher;
  std::string_view rank;
  std::string_view local_rank;
  std::string_view world_size;
};

// Innermost launcher first (see the header).
constexpr std::array<launcher_variables, 3> launchers{{
    {"torchrun", "RANK", "LOCAL_RANK", "WORLD_SIZE"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"},
    {"slurm", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"},
}};

// A non-negative integer, or nullopt (unset, empty, or not a count).
std::optional<std::int64_t> count_of(const environment_lookup& lookup, std::string_view name) {
  const std::optional<std::string> value = lookup(name);
  if (!value) return std::nullopt;
  std::int64_t n = -1;
  if (!util::parse_i64(util::trim(*value), n) || n < 0) return std::nullopt;
  return n;
}

std::string this_host() {
  std::array<char, HOST_NAME_MAX + 1> name{};
  if (::gethostname(name.data(), name.size()) != 0) return "unknown";
  name.back() = '\0';
  std::string host(name.data());
  if (host.empty()) return "unknown";
  std::replace(host.begin(), host.end(), '/', '_');  // it becomes part of a path
  return host;
}

}  // namespace

launcher_identity launcher_identity_from(const environment_lookup& lookup) {
  launcher_identity id;
  id.host = this_host();
  for (const launcher_variables& l : launchers) {
    id.rank = count_of(lookup, l.rank);
    if (!id.rank) continue;
    id.launcher = l.launcher;
    id.local_rank = count_of(lookup, l.local_rank);
    id.world_size = count_of(lookup, l.world_size);
    break;
  }
  return id;
}

launcher_identity process_launcher_identity() {
  return launcher_identity_from([](std::string_view name) -> std::optional<std::string> {
    const std::optional<std::string_view> value = environment_value(name);
    if (!value) return std::nullopt;
    return std::string(*value);
  });
}

std::string why_unknown(const launcher_identity& who, std::string_view figure) {
  for (const launcher_variables& l : launchers) {
    if (l.launcher != who.launcher) continue;
    const std::string_view name = figure == "rank" ? l.rank : figure == "local_rank" ? l.local_rank : l.world_size;
    return fmt::format("{} set no {}", l.launcher, name);
  }
  std::string names;
  for (std::size_t i = 0; i < launchers.size(); ++i)
    names += fmt::format("{}{}", i == 0 ? "" : i + 1 == launchers.size() ? " or " : ", ", launchers[i].rank);
  return fmt::format("no launcher set {} to a rank", names);
}

}  // namespace fragctl::detail
