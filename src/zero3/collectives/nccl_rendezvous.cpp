// How the ranks of an NCCL / RCCL communicator agree on its unique id: from
// an environment variable, or through a file rank 0 writes atomically
// (write, then rename) and the others poll until it appears or the timeout
// passes; one rank alone asks NCCL for one. Also make_unique_id, for a
// launcher that hands the id out itself.
#include "zero3/collectives/nccl_rendezvous.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "core/atomic_file.hpp"
#include "fmt/format.h"
#include "fragctl/error.hpp"
#include "util/strings.hpp"

namespace fragctl::zero3 {

namespace {

using clock = std::chrono::steady_clock;

/// The id rank 0 wrote (256 hex digits), or nullopt while the file is absent or incomplete.
std::optional<std::string> read_id_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  if (text.size() != 256) return std::nullopt;  // still being written (rename makes that rare)
  return text;
}

}  // namespace

nccl::unique_id_t obtain_unique_id(const nccl::library& lib, const nccl_options& o) {
  nccl::unique_id_t raw{};
  const auto from_hex = [&](const std::string& hex, const std::string& where) {
    auto id = unique_id_from_hex(hex);
    if (!id.ok()) {
      throw invalid_argument(
          fmt::format("zero3 rank {}: unique id in {}: {}", o.rank, where, util::to_std(id.status().message())));
    }
    std::copy(id->begin(), id->end(), reinterpret_cast<unsigned char*>(raw.internal));
  };
  if (const char* env = o.unique_id_env.empty() ? nullptr : std::getenv(o.unique_id_env.c_str());
      env != nullptr && env[0] != '\0') {
    from_hex(env, o.unique_id_env);
    return raw;
  }
  if (o.unique_id_file.empty()) {
    if (o.size == 1) {
      if (const nccl::result_t r = lib.get_unique_id(&raw); r != nccl::success) {
        throw backend_error(fmt::format("ncclGetUniqueId: {}", lib.describe(r, nullptr)), r, "ncclResult_t");
      }
      return raw;
    }
    throw invalid_argument(
        fmt::format("zero3 rank {}: no unique id: set {} or nccl_options::unique_id_file", o.rank, o.unique_id_env));
  }
  if (o.rank == 0) {
    if (const nccl::result_t r = lib.get_unique_id(&raw); r != nccl::success) {
      throw backend_error(fmt::format("ncclGetUniqueId: {}", lib.describe(r, nullptr)), r, "ncclResult_t");
    }
    unique_id id{};
    std::copy(raw.internal, raw.internal + 128, reinterpret_cast<char*>(id.data()));
    // As every output (core/atomic_file.hpp): a temporary created exclusively,
    // renamed over nothing or a regular file; no planted link is followed.
    if (const absl::Status s =
            detail::write_file_atomically(o.unique_id_file, to_hex(id) + "\n", "zero3 rank 0: the unique id file");
        !s.ok()) {
      throw invalid_argument(std::string(s.message()));
    }
    return raw;
  }
  const auto deadline = clock::now() + o.timeout;
  while (true) {
    if (auto text = read_id_file(o.unique_id_file)) {
      from_hex(*text, o.unique_id_file);
      return raw;
    }
    if (clock::now() > deadline) {
      throw collective_error(fmt::format("zero3 rank {}: init: the unique id file {} did not appear within {} ms "
                                         "(is rank 0 running?)",
                                         o.rank, o.unique_id_file, o.timeout.count()),
                             o.rank, "init", o.unique_id_file, true);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

unique_id make_unique_id(const nccl_options& options) {
  const nccl::library& lib = nccl::load(options);
  nccl::unique_id_t raw{};
  if (const nccl::result_t r = lib.get_unique_id(&raw); r != nccl::success) {
    throw backend_error(fmt::format("ncclGetUniqueId: {}", lib.describe(r, nullptr)), r, "ncclResult_t");
  }
  unique_id id{};
  std::copy(raw.internal, raw.internal + 128, reinterpret_cast<char*>(id.data()));
  return id;
}

}  // namespace fragctl::zero3
