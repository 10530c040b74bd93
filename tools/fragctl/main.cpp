// fragctl: the command-line tool. main() dispatches to subcommands; each
// lives in its own file and states its options in a command_spec.
//
// Exit status: 0 success, 1 failure (unreadable trace, backend error), 2 usage
// error (unknown command or option, bad value).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "command.hpp"
#include "fmt/format.h"
#include "fragctl/version.hpp"
#include "util/strings.hpp"

namespace fragctl::cli {
namespace {

const std::vector<command>& commands() {
  static const std::vector<command> table = {
      {&replay_spec(), run_replay},     {&convert_spec(), run_convert}, {&info_spec(), run_info},
      {&policies_spec(), run_policies}, {&config_spec(), run_config},   {&report_spec(), run_report},
      {&run_spec(), run_run},
  };
  return table;
}

const command* find_command(std::string_view name) {
  for (const command& c : commands())
    if (c.spec->name == name) return &c;
  return nullptr;
}

std::string main_help() {
  std::string text =
      "fragctl: replay, compare and inspect GPU allocation traces and fragctl's allocation "
      "policies.\n\nUsage: fragctl COMMAND [OPTIONS] [ARGS...]\n\nCommands:\n";
  for (const command& c : commands()) text += fmt::format("  {:<10}  {}\n", c.spec->name, c.spec->summary);
  text += fmt::format("  {:<10}  {}\n", "help", "show the help of a command (fragctl help replay)");
  text += fmt::format("  {:<10}  {}\n", "version", "print fragctl's version (also --version, -V)");
  text +=
      "\nRun 'fragctl COMMAND --help' for a command's options.\n"
      "Examples:\n"
      "  fragctl replay gpt2m.trace.csv.gz --policy all\n"
      "  fragctl convert snapshot.json trace.csv.gz\n"
      "  fragctl report job.report.json --html job.html\n"
      "  fragctl run --policy arena --report train.json -- python train.py\n"
      "\nEnvironment (docs/configuration.md):\n";
  text += environment_help();
  return text;
}

int run(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::fputs(main_help().c_str(), stderr);
    return 2;
  }
  const std::string& name = args.front();
  if (name == "-h" || name == "--help") {
    std::fputs(main_help().c_str(), stdout);
    return 0;
  }
  const auto asks_help = [](const std::string& a) { return a == "-h" || a == "--help"; };
  constexpr const char* version_help = "Usage: fragctl version\n\nPrint fragctl's version (also fragctl --version or -V).\n";
  if (name == "--version" || name == "-V" || name == "version") {
    if (args.size() == 1) {
      std::printf("fragctl %s\n", FRAGCTL_VERSION);
      return 0;
    }
    if (asks_help(args[1])) {  // every command has --help; version takes nothing else
      std::fputs(version_help, stdout);
      return 0;
    }
    std::fprintf(stderr, "fragctl %s: takes no arguments, got '%s'\n", name.c_str(), util::printable(args[1]).c_str());
    return 2;
  }
  if (name == "help") {
    if (args.size() < 2 || asks_help(args[1]) || args[1] == "help") {
      std::fputs(main_help().c_str(), stdout);
      return 0;
    }
    if (args[1] == "version") {
      std::fputs(version_help, stdout);
      return 0;
    }
    if (const command* c = find_command(args[1])) {
      std::fputs(help_text(*c->spec).c_str(), stdout);
      return 0;
    }
  }
  const command* c = find_command(name == "help" ? args[1] : name);
  if (c == nullptr) {
    std::fprintf(stderr, "fragctl: unknown command '%s'\nRun 'fragctl --help' for the commands.\n",
                 util::printable(name == "help" ? args[1] : name).c_str());
    return 2;
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  // An error may quote a file's content or name (a trace row, a report
  // field): each line of it is shown escaped.
  try {
    const arguments parsed = parse_arguments(*c->spec, rest);
    if (parsed.help) {
      std::fputs(help_text(*c->spec).c_str(), stdout);
      return 0;
    }
    return c->run(parsed);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "fragctl %s: %s\n", std::string(c->spec->name).c_str(),
                 util::printable_lines(e.what()).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fragctl %s: %s\n", std::string(c->spec->name).c_str(),
                 util::printable_lines(e.what()).c_str());
    return 1;
  }
}

// `status`, or 1 where standard output could not take what the command
// printed (a full disk, a file size limit, a closed descriptor): before, the
// command exited 0 with its output cut.
int with_output_written(int status) {
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int error = errno;
  if (flushed && std::ferror(stdout) == 0) return status;
  std::fprintf(stderr, "fragctl: standard output: %s; what was printed is incomplete\n",
               error != 0 ? std::strerror(error) : "a write failed");
  return status == 0 ? 1 : status;
}

}  // namespace
}  // namespace fragctl::cli

int main(int argc, char** argv) {
  return fragctl::cli::with_output_written(fragctl::cli::run(std::vector<std::string>(argv + 1, argv + argc)));
}
