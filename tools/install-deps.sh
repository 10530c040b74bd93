#!/usr/bin/env bash
# Installs the Debian 12 packages fragctl builds with, if any is missing.
#   tools/install-deps.sh [EXTRA_PACKAGE...]   install what is missing
#   tools/install-deps.sh --list               print the package list
# Needs root (or sudo) only when something must be installed. On a machine
# without a package registry (the GPU machine) the dependencies come from
# CMAKE_PREFIX_PATH instead (DEVKIT_PREFIX set) and this does nothing.
set -euo pipefail
packages=(build-essential cmake ninja-build pkg-config python3
  libabsl-dev libspdlog-dev libfmt-dev libjemalloc-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev zlib1g-dev libamdhip64-dev
  chromium)  # chromium: the HTML report's browser test (tests/report/html_browser_test.cpp)
if [ "${1:-}" = "--list" ]; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi
packages+=("$@")
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
