// The fragctl command's subcommands and the small argument parser they share.
//
// Each subcommand states its usage and options once (command_spec); parsing,
// `--help` and usage errors come from that one statement. A hand-written
// parser rather than absl flags: flags here are per subcommand, and errors
// must name the subcommand and point at its --help.
#pragma once

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "fragctl/config.hpp"
#include "fragctl/trace.hpp"
#include "nlohmann/json.hpp"

namespace fragctl::cli {

/// One option: "--name VALUE" (value non-empty) or a "--name" switch.
struct option_spec {
  std::string_view name;   ///< without the leading dashes
  std::string_view value;  ///< placeholder shown in help ("NAME"); empty for a switch
  std::string_view help;
};

struct command_spec {
  std::string_view name;     ///< "replay"
  std::string_view args;     ///< positional arguments for the usage line: "TRACE..."
  std::string_view summary;  ///< one line for `fragctl --help`
  std::string details;       ///< paragraphs after the options in `fragctl NAME --help`
  std::vector<option_spec> options;
  /// Options end at the first positional argument, which starts a command
  /// line of its own (`fragctl run python train.py --lr 1`), as with env(1).
  bool positional_ends_options = false;
};

/// A command line the user got wrong: the caller prints it and exits 2.
class usage_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Parsed arguments of one subcommand.
struct arguments {
  std::vector<std::string> positional;
  std::map<std::string, std::string, std::less<>> values;  ///< option -> value ("" for switches)
  bool help = false;

  [[nodiscard]] bool has(std::string_view name) const { return values.find(name) != values.end(); }
  [[nodiscard]] std::optional<std::string> get(std::string_view name) const;
};

/// Parses `argv` (after the subcommand name). Accepts --name VALUE,
/// --name=VALUE, -h/--help, and "--" before positional arguments that start
/// with a dash. Throws usage_error for an unknown option, a missing value, or
/// an option given twice.
[[nodiscard]] arguments parse_arguments(const command_spec& spec, const std::vector<std::string>& argv);

/// `fragctl NAME --help`: usage line, summary, options, details.
[[nodiscard]] std::string help_text(const command_spec& spec);

/// One subcommand of the dispatcher.
struct command {
  const command_spec* spec;
  /// Runs with the arguments after the subcommand's name, parsed by its
  /// spec (the dispatcher answers --help itself); returns the exit status.
  /// May throw usage_error (exit 2) or any std::exception (exit 1).
  int (*run)(const arguments& args);
};

/// A file a command names: the option or argument that names it ("--html",
/// "OUT", "TRACE") and its path.
struct named_path {
  std::string_view name;
  std::string path;
};

/// Refuses, with a usage_error naming both, an output that is the same file
/// as an input (same device and inode: writing it would replace the input,
/// which a later reading needs or the user keeps) or as another output (one
/// would replace the other). Outputs that do not exist yet are compared by
/// their absolute, normal form. An output that exists and is not a regular
/// file (/dev/stdout, /dev/null, a FIFO) is never refused here: it is
/// written into, not replaced (core/atomic_file.hpp). Empty paths are skipped.
void refuse_shared_outputs(const std::vector<named_path>& outputs, const std::vector<named_path>& inputs);

/// The --snapshot-device option the trace-reading commands share.
extern const option_spec snapshot_device_option;

/// Reads the trace at `path` with the options in `args` (--snapshot-device).
/// Throws usage_error for a bad option value, std::runtime_error carrying the
/// reader's message ("<file>:<line>: ...") when the trace cannot be read.
[[nodiscard]] trace load_trace(const std::string& path, const arguments& args);

/// The --require-complete switch the trace-reading commands share.
extern const option_spec require_complete_option;

/// Says on stderr what `command` must say of `t`'s completeness: a warning
/// for a cut trace; with --require-complete, an error for every trace that
/// does not show it is whole (cut, or no end marker). Returns false for the
/// latter, which the command then counts as a failure (exit status 1).
[[nodiscard]] bool check_completeness(std::string_view command, const std::string& path, const trace& t,
                                      const arguments& args);

/// `t`'s completeness as JSON: true, false (cut) or null (the file cannot tell).
[[nodiscard]] nlohmann::ordered_json completeness_json(const trace& t);

/// The --policy list of the replaying commands: expressions split at
/// commas, "all" for replay_policy_set(), {""} (the default) when absent.
/// Throws usage_error for an invalid expression.
[[nodiscard]] std::vector<std::string> policy_list(const arguments& args);

/// The configuration of the replaying commands from --conf, --backend and
/// --capacity. Throws usage_error for a bad value.
[[nodiscard]] config replay_config(const arguments& args);

/// The files a replay under `cfg` writes (its --conf keys trace, report and
/// prometheus, as this process expands them), for refuse_shared_outputs.
[[nodiscard]] std::vector<named_path> config_outputs(const config& cfg);

/// The files a replay under `cfg` reads besides its traces (the warmup
/// profile), for refuse_shared_outputs.
[[nodiscard]] std::vector<named_path> config_inputs(const config& cfg);

/// Every positional argument of `args`, named `name` ("TRACE"), for
/// refuse_shared_outputs.
[[nodiscard]] std::vector<named_path> positional_inputs(const arguments& args, std::string_view name);

// The subcommands, each in its own source file.
const command_spec& replay_spec();
int run_replay(const arguments& args);
const command_spec& convert_spec();
int run_convert(const arguments& args);
const command_spec& info_spec();
int run_info(const arguments& args);
const command_spec& policies_spec();
int run_policies(const arguments& args);
const command_spec& config_spec();
/// The "Environment" lines of `fragctl --help`: one per environment_variables() row.
[[nodiscard]] std::string environment_help();
int run_config(const arguments& args);
const command_spec& report_spec();
int run_report(const arguments& args);
const command_spec& run_spec();
int run_run(const arguments& args);

}  // namespace fragctl::cli
