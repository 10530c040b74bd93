#!/usr/bin/env bash
# Installs the Debian 12 packages a fragctl command needs, if any is missing.
#   tools/install-deps.sh [GROUP...] [EXTRA_PACKAGE...]   install what is missing
#   tools/install-deps.sh --list [GROUP...]               print the package list
# Groups (the base is always included):
#   (none)      the library and the fragctl CLI: tools/replay-sample.sh
#   --tests     GoogleTest, Google Benchmark, python3-venv, python3-pip: tools/test.sh
#   --hip       libamdhip64-dev (≈190 MiB with libllvm15 and comgr): compiles
#               the HIP backend, which is otherwise left out with a warning
#   --browser   chromium (≈350 MiB): the HTML report's browser test
#               (tests/report/html_browser_test.cpp), skipped without it
#   --torch     python3-torch (PyTorch 1.13 CPU for Debian's /usr/bin/python3):
#               the fragctl.torch service tests (tests/torch), skipped without it
#   --all       every group above (CI)
# Needs root (or sudo) only when something must be installed. On a machine
# without a package registry (the GPU machine) the dependencies come from
# CMAKE_PREFIX_PATH instead (DEVKIT_PREFIX set) and this does nothing.
set -euo pipefail
base=(build-essential cmake ninja-build pkg-config python3 patchelf
  libabsl-dev libspdlog-dev libfmt-dev libjemalloc-dev nlohmann-json3-dev zlib1g-dev)
tests=(libgtest-dev libgmock-dev libbenchmark-dev python3-venv python3-pip)
hip=(libamdhip64-dev)
browser=(chromium)
torch=(python3-torch)
packages=("${base[@]}")
list=0
for arg in "$@"; do
  case "$arg" in
    --list) list=1 ;;
    --tests) packages+=("${tests[@]}") ;;
    --hip) packages+=("${hip[@]}") ;;
    --browser) packages+=("${browser[@]}") ;;
    --torch) packages+=("${torch[@]}") ;;
    --all) packages+=("${tests[@]}" "${hip[@]}" "${browser[@]}" "${torch[@]}") ;;
    -*) echo "tools/install-deps.sh: unknown option $arg (see the comment at its top)" >&2; exit 2 ;;
    *) packages+=("$arg") ;;
  esac
done
if [ "$list" -eq 1 ]; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi
if [ -n "${DEVKIT_PREFIX:-}" ] || ! command -v dpkg-query >/dev/null; then
  exit 0
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "fragctl: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null ||
  { $sudo apt-get update >/dev/null && $sudo apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; }
