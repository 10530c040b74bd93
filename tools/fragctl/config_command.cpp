// fragctl config: the options table and the environment table, as the
// library holds them (config_options(), environment_variables()).
#include <cstdio>

#include "command.hpp"
#include "core/json_io.hpp"
#include "fmt/format.h"
#include "fragctl/backend.hpp"
#include "fragctl/config.hpp"
#include "fragctl/policy.hpp"
#include "nlohmann/json.hpp"
#include "util/strings.hpp"

namespace fragctl::cli {

std::string environment_help() {
  std::string text;
  for (const environment_variable& v : environment_variables()) {
    text += fmt::format("  {:<24}  {}{}\n", v.name, v.help,
                        v.default_value.empty() ? "" : fmt::format(" (default {})", v.default_value));
  }
  return text;
}

const command_spec& config_spec() {
  static const command_spec spec = {
      "config",
      "",
      "List every FRAGCTL_CONF option and environment variable with its default.",
      "Defaults are those of a default-constructed fragctl::config; docs/configuration.md has a row\n"
      "for each. With --current, the values the environment gives instead, checked (a bad policy,\n"
      "option or backend exits 1 with the reason), and the policy and backend a program started\n"
      "with this environment gets.\n",
      {{"json", "", "print one JSON object ({options, environment}) instead of text"},
       {"current", "", "show the values config_from_environment reads from this environment"}}};
  return spec;
}

int run_config(const arguments& args) {
  if (!args.positional.empty()) throw usage_error("fragctl config takes no arguments");
  config current;
  std::string effective;
  nlohmann::ordered_json effective_json;
  if (args.has("current")) {
    auto read = config_from_environment();
    if (!read.ok()) throw std::runtime_error(std::string(read.status().message()));
    current = *std::move(read);
    if (!current.policy.empty()) {
      if (const absl::Status s = validate_policy(current.policy); !s.ok())
        throw std::runtime_error(fmt::format("FRAGCTL_POLICY: {}", std::string(s.message())));
    }
    // What a job started now would get: the backend found from here, and
    // its default policy where none is named.
    const std::unique_ptr<device_backend> backend = make_backend(current);
    const std::string policy = current.policy.empty() ? default_policy(*backend) : current.policy;
    effective = fmt::format("A program started with this environment gets: policy {}{} on the {} backend, "
                            "device {}\n\n", policy, current.policy.empty() ? " (the backend's default)" : "",
                            backend->name(), current.device);
    effective_json = {{"policy", policy}, {"backend", std::string(backend->name())}, {"device", current.device}};
  }
  const std::string_view column = args.has("current") ? "value" : "default";
  nlohmann::ordered_json options = nlohmann::ordered_json::array();
  nlohmann::ordered_json environment = nlohmann::ordered_json::array();
  std::string text = effective + fmt::format("FRAGCTL_CONF options (key:value,...):\n  {:<22} {:<18} {:<18} {}\n", "key", "type",
                                 column, "meaning");
  for (const option_info& o : config_options()) {
    const std::string value = args.has("current") ? option_value(current, o.key) : o.default_value;
    options.push_back({{"key", o.key}, {"type", o.type}, {column, value}, {"help", o.help}});
    text += fmt::format("  {:<22} {:<18} {:<18} {}\n", o.key, o.type, util::printable(value), o.help);
  }
  for (const environment_variable& v : environment_variables()) {
    environment.push_back(
        {{"name", v.name}, {"value", v.value}, {"default", v.default_value}, {"help", v.help}, {"read_by", v.read_by}});
  }
  text += "\nEnvironment variables:\n" + environment_help();
  if (args.has("json")) {
    nlohmann::ordered_json out{{"options", options}, {"environment", environment}};
    if (!effective_json.is_null()) out["effective"] = effective_json;
    std::printf("%s\n", detail::dump_json(out).c_str());
  } else {
    std::fputs(text.c_str(), stdout);
  }
  return 0;
}

}  // namespace fragctl::cli
