#!/usr/bin/env bash
# The generated man page and bash completion (tools/gen_cli_docs.py) name
# every command `fragctl --help` lists, with each command's options, and
# every environment variable it lists; the completion loads in bash and
# completes a command and an option.
#   cli_docs_test.sh FRAGCTL_BINARY DIR_WITH_fragctl.1_AND_fragctl.bash
set -euo pipefail
fragctl=$1 dir=$2
man=$dir/fragctl.1 completion=$dir/fragctl.bash
grep -q "^\.TH FRAGCTL 1 .*fragctl $("$fragctl" --version | cut -d' ' -f2)" "$man"
commands=$("$fragctl" --help | awk '/^Commands:/{f=1; next} /^$/{f=0} f{print $1}')
[ -n "$commands" ]
for c in $commands; do
  case $c in help|version) continue ;; esac
  grep -q "^\.SS $c\$" "$man" || { echo "man page lacks $c"; exit 1; }
  for option in $("$fragctl" "$c" --help | grep -oE '^  --[a-z-]+' || true); do
    name=${option#--}
    grep -qF -- '\fB\-\-'"${name//-/\\-}" "$man" || { echo "man page lacks $c $option"; exit 1; }
  done
done
# ENVIRONMENT: every variable of the library's table that --help lists.
variables=$("$fragctl" --help | awk '/^Environment/{f=1; next} /^$/{f=0} f{print $1}')
[ -n "$variables" ] || { echo "fragctl --help lists no environment variables"; exit 1; }
for v in $variables; do
  sed -n '/^\.SH ENVIRONMENT/,/^\.SH SEE ALSO/p' "$man" | grep -qF "\fB$v\fR" || { echo "man page lacks $v"; exit 1; }
done
# shellcheck disable=SC1090
. "$completion"
complete -p fragctl >/dev/null
COMP_WORDS=(fragctl rep); COMP_CWORD=1; _fragctl
[ "${COMPREPLY[*]}" = "replay report" ] || { echo "completing 'rep': ${COMPREPLY[*]}"; exit 1; }
COMP_WORDS=(fragctl policies --j); COMP_CWORD=2; _fragctl
[ "${COMPREPLY[*]}" = "--json" ] || { echo "completing 'policies --j': ${COMPREPLY[*]}"; exit 1; }
echo "cli docs: ok"
