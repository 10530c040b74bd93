#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "fmt/format.h"
#include "command.hpp"
#include "util/strings.hpp"

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

namespace {

// What a path is, for refuse_shared_outputs.
struct file_identity {
  bool exists = false;
  bool regular = false;
  dev_t device = 0;
  ino_t inode = 0;
  std::string normal;  // absolute, normal form
};

file_identity identify(const std::string& path) {
  file_identity id;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    id.exists = true;
    id.regular = S_ISREG(st.st_mode);
    id.device = st.st_dev;
    id.inode = st.st_ino;
  }
  std::error_code absolute_error, canonical_error;
  const std::filesystem::path absolute = std::filesystem::absolute(path, absolute_error);
  const std::filesystem::path normal = std::filesystem::weakly_canonical(absolute, canonical_error);
  // Where either step fails (a working directory that was removed), the path
  // as given: never "" for all of them, which would make them one file.
  id.normal = absolute_error || canonical_error ? path : normal.string();
  return id;
}

bool same_file(const file_identity& a, const file_identity& b) {
  if (a.exists && b.exists) return a.device == b.device && a.inode == b.inode;
  return a.normal == b.normal;
}

}  // namespace

void refuse_shared_outputs(const std::vector<named_path>& outputs, const std::vector<named_path>& inputs) {
  std::vector<file_identity> input_ids;
  for (const named_path& in : inputs) input_ids.push_back(identify(in.path));
  std::vector<file_identity> seen;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const named_path& out = outputs[i];
    seen.push_back(identify(out.path));
    const file_identity& o = seen.back();
    if (out.path.empty() || (o.exists && !o.regular)) continue;
    for (std::size_t k = 0; k < inputs.size() && o.exists; ++k) {  // an output not made yet replaces no input
      if (!inputs[k].path.empty() && same_file(o, input_ids[k])) {
        throw usage_error(fmt::format("{} '{}' is the same file as the input '{}': writing it would replace the "
                                      "input; name another file",
                                      out.name, util::printable(out.path), util::printable(inputs[k].path)));
      }
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (outputs[j].path.empty() || (seen[j].exists && !seen[j].regular)) continue;
      if (same_file(o, seen[j])) {
        throw usage_error(fmt::format("{} '{}' and {} '{}' name the same file: one would replace the other",
                                      outputs[j].name, util::printable(outputs[j].path), out.name,
                                      util::printable(out.path)));
      }
    }
  }
}

}  // namespace fragctl::cli
