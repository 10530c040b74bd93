// PyTorch's allocator keys (PYTORCH_CUDA_ALLOC_CONF) in fragctl's terms.
//
// A PyTorch user's habit is max_split_size_mb:128 or expandable_segments:True.
// Where fragctl has an option of the same meaning, such a key is translated
// (in PyTorch's units: `_mb` is MiB); where it has none, it is an error that
// names what to use instead. The table of keys lives in pytorch_conf.cpp only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "fragctl/config.hpp"

namespace fragctl::util {

/// The items of PYTORCH_CUDA_ALLOC_CONF, trimmed, empty ones left out: split
/// at the commas outside brackets, as PyTorch reads a list value
/// (roundup_power2_divisions:[256:1,512:2,>:1] is one item).
[[nodiscard]] std::vector<std::string_view> pytorch_conf_items(std::string_view conf);

/// Whose a PYTORCH_CUDA_ALLOC_CONF key is where fragctl's shim stands in for
/// PyTorch's device allocator (`fragctl run`; `backend` aside).
enum class pytorch_key_owner : std::uint8_t {
  fragctl,           ///< translated into a fragctl option (apply_pytorch_key applies it)
  pytorch,           ///< PyTorch's still: its pinned host memory's keys, and keys this table does not know
  device_allocator,  ///< tunes PyTorch's own device allocator, which the shim replaces
};
[[nodiscard]] pytorch_key_owner owner_of_pytorch_key(std::string_view key);

/// Applies one PyTorch allocator key to `c`. nullopt when `key` is not one of
/// PyTorch's keys; else the fragctl form applied ("max_split_size:128MiB"),
/// or InvalidArgument when the value is bad or fragctl has no equivalent
/// (the message names what to use instead). `backend` is PyTorch's own:
/// an error here (it belongs in PYTORCH_CUDA_ALLOC_CONF).
[[nodiscard]] std::optional<absl::StatusOr<std::string>> apply_pytorch_key(config& c, std::string_view key,
                                                                           std::string_view value);

/// Applies PYTORCH_CUDA_ALLOC_CONF ("key:value,key:value", PyTorch's syntax)
/// on top of `base`: keys with a fragctl meaning are translated; `backend`
/// and keys without an equivalent are left to PyTorch. Returns the config
/// and one line saying what was mapped and what was left, or InvalidArgument
/// for a bad value of a translated key. `base` is untouched on error.
struct pytorch_conf_result {
  config applied;
  std::string summary;  ///< "mapped max_split_size_mb:128 -> max_split_size:128MiB; left to PyTorch: backend:..."
  bool mapped_any = false;  ///< whether any key was applied
};
[[nodiscard]] absl::StatusOr<pytorch_conf_result> apply_pytorch_conf(std::string_view conf, config base);

}  // namespace fragctl::util
