#include <algorithm>

#include "fmt/format.h"
#include "command.hpp"

namespace fragctl::cli {

std::optional<std::string> arguments::get(std::string_view name) const {
  const auto it = values.find(name);
  if (it == values.end()) return std::nullopt;
  return it->second;
}

arguments parse_arguments(const command_spec& spec, const std::vector<std::string>& argv) {
  arguments out;
  const auto fail = [&](const std::string& what) {
    throw usage_error(fmt::format("{}\nRun 'fragctl {} --help' for its options.", what, spec.name));
  };
  bool options_done = false;
  for (std::size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (options_done || arg.size() < 2 || arg[0] != '-') {
      out.positional.push_back(arg);
      options_done = options_done || spec.positional_ends_options;
      continue;
    }
    if (arg == "--") {
      options_done = true;
      continue;
    }
    if (arg == "-h" || arg == "--help") {
      out.help = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0) fail(fmt::format("unknown option '{}'", arg));
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (const std::size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    const auto spec_it = std::find_if(spec.options.begin(), spec.options.end(),
                                      [&](const option_spec& o) { return o.name == name; });
    if (spec_it == spec.options.end()) fail(fmt::format("unknown option '--{}'", name));
    if (out.has(name)) fail(fmt::format("option '--{}' given twice", name));
    if (spec_it->value.empty()) {
      if (value) fail(fmt::format("option '--{}' takes no value", name));
      out.values.emplace(name, "");
      continue;
    }
    if (!value) {
      if (i + 1 >= argv.size()) fail(fmt::format("option '--{}' needs a value ({})", name, spec_it->value));
      value = argv[++i];
    }
    out.values.emplace(name, *value);
  }
  return out;
}

std::string help_text(const command_spec& spec) {
  std::string text = fmt::format("Usage: fragctl {} [OPTIONS] {}\n\n{}\n", spec.name, spec.args, spec.summary);
  if (!spec.options.empty()) {
    text += "\nOptions:\n";
    std::size_t width = 10;
    std::vector<std::string> heads;
    for (const option_spec& o : spec.options) {
      heads.push_back(o.value.empty() ? fmt::format("--{}", o.name) : fmt::format("--{} {}", o.name, o.value));
      width = std::max(width, heads.back().size());
    }
    for (std::size_t i = 0; i < spec.options.size(); ++i)
      text += fmt::format("  {:<{}}  {}\n", heads[i], width, spec.options[i].help);
    text += fmt::format("  {:<{}}  {}\n", "-h, --help", width, "show this help");
  }
  if (!spec.details.empty()) text += "\n" + spec.details;
  if (text.back() != '\n') text += '\n';
  return text;
}

}  // namespace fragctl::cli
