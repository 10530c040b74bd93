#!/usr/bin/env python3
"""Writes the fragctl command's man page and bash completion from its help.

    tools/gen_cli_docs.py FRAGCTL_BINARY OUT_DIR

Runs `fragctl --help`, `fragctl --version` and `fragctl COMMAND --help` for
every command the main help lists, and writes OUT_DIR/fragctl.1 (man, roff)
and OUT_DIR/fragctl.bash (bash completion of commands, each command's
options, and file names). The help text is the one source: a command or
option added to the CLI appears in both at the next build. The build runs
this after building the CLI (tools/CMakeLists.txt) and installs both files.
"""
import os
import re
import subprocess
import sys


def run(binary, *args):
    done = subprocess.run([binary, *args], capture_output=True, text=True, check=True)
    return done.stdout


def listed(text, heading):
    """(name, description) pairs of the two-column block under the line that
    starts with `heading` and ends with ":" (up to the next blank line)."""
    found, inside = [], False
    for line in text.splitlines():
        if not inside:
            inside = line.startswith(heading) and line.endswith(":")
        elif not line:
            break
        else:
            match = re.match(r"^  (\S+)\s+(.*)$", line)
            if match:
                found.append((match.group(1), match.group(2)))
    return found


def commands(main_help):
    """(name, summary) pairs of the "Commands:" block of `fragctl --help`."""
    return listed(main_help, "Commands")


def environment(main_help):
    """(name, help) pairs of the "Environment" block of `fragctl --help`: the
    library's table of environment variables (fragctl::environment_variables)."""
    return listed(main_help, "Environment")


def options(command_help):
    """(flags, placeholder, help) of the "Options:" block of `fragctl CMD --help`."""
    if "Options:\n" not in command_help:
        return []
    block = command_help.split("Options:\n", 1)[1].split("\n\n", 1)[0]
    found = []
    for line in block.splitlines():
        match = re.match(r"^  (-\S+(?:, --\S+)?)(?: (\S+))?\s{2,}(.*)$", line)
        if match:
            found.append((match.group(1), match.group(2) or "", match.group(3)))
    return found


def roff(text):
    text = text.replace("\\", "\\e")
    return "\n".join(("\\&" + line) if line.startswith((".", "'")) else line for line in text.splitlines())


def man_page(version, main_help, helps):
    out = [
        '.TH FRAGCTL 1 "" "fragctl %s" "User Commands"' % version,
        ".SH NAME",
        "fragctl \\- " + roff(main_help.splitlines()[0].split(": ", 1)[-1]),
        ".SH SYNOPSIS",
        ".B fragctl",
        ".I COMMAND",
        "[\\fIOPTIONS\\fR] [\\fIARGS\\fR...]",
        ".br",
        ".B fragctl",
        "\\-\\-version | \\-V | version",
        ".SH COMMANDS",
    ]
    for name, summary, text in helps:
        out += [".SS %s" % name, roff(summary)]
        usage = text.splitlines()[0]
        out += [".PP", ".B " + roff(usage.replace("Usage: ", ""))]
        for flags, value, help_ in options(text):
            out += [".TP", "\\fB%s\\fR%s" % (roff(flags).replace("-", "\\-"), (" \\fI%s\\fR" % value) if value else ""),
                    roff(help_)]
        details = text.split("\n\n")
        tail = [d for d in details[1:] if not d.startswith(("Options:", "Usage:"))]
        if len(tail) > 1:
            out += [".PP", ".nf", roff("\n\n".join(tail[1:]).rstrip()), ".fi"]
    out += [".SH EXIT STATUS", "0 success, 1 failure (unreadable input, backend error), 2 usage error.",
            ".SH ENVIRONMENT"]
    for name, help_ in environment(main_help):
        out += [".TP", "\\fB%s\\fR" % roff(name), roff(help_)]
    out += [".PP", "Each is described in docs/configuration.md.",
            ".SH SEE ALSO", "The docs/ folder of fragctl: reports.md, replay.md, traces.md, configuration.md."]
    return "\n".join(out) + "\n"


def completion(helps):
    names = " ".join([name for name, _, _ in helps] + ["help", "version"])
    cases = []
    for name, _, text in helps:
        flags = []
        for f, _, _ in options(text):
            flags += [x.strip() for x in f.split(",")]
        cases.append("    %s) opts=%r ;;" % (name, " ".join(flags) or "-h --help"))
    return """# bash completion of fragctl, generated from `fragctl --help` by tools/gen_cli_docs.py.
_fragctl() {
  local cur=${COMP_WORDS[COMP_CWORD]} command=${COMP_WORDS[1]} opts
  if [ "$COMP_CWORD" -eq 1 ]; then
    COMPREPLY=($(compgen -W "%s --help --version -V" -- "$cur"))
    return
  fi
  case "$command" in
%s
    help) COMPREPLY=($(compgen -W "%s" -- "$cur")); return ;;
    *) opts="" ;;
  esac
  if [[ "$cur" == -* ]]; then
    COMPREPLY=($(compgen -W "$opts" -- "$cur"))
  else
    COMPREPLY=($(compgen -f -- "$cur"))
  fi
}
complete -o filenames -F _fragctl fragctl
""" % (names, "\n".join(cases), " ".join(name for name, _, _ in helps))


def main():
    binary, out_dir = sys.argv[1], sys.argv[2]
    main_help = run(binary, "--help")
    version = run(binary, "--version").split()[-1]
    helps = [(name, summary, run(binary, name, "--help"))
             for name, summary in commands(main_help) if name not in ("help", "version")]
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "fragctl.1"), "w", encoding="utf-8") as f:
        f.write(man_page(version, main_help, helps))
    with open(os.path.join(out_dir, "fragctl.bash"), "w", encoding="utf-8") as f:
        f.write(completion(helps))


if __name__ == "__main__":
    main()
