#!/usr/bin/env bash
# Builds fragctl's wheel: the one file a user copies to a GPU machine and
# installs with `pip install fragctl-*.whl` (docs/packaging.md).
#   tools/wheel.sh [OUT_DIR]    (default dist/); prints the wheel's path
# The same as `pip wheel --no-deps ./python`, without needing pip here: it
# calls the package's own PEP 517 backend (python/build_backend), which
# builds fragctl self-contained (FRAGCTL_SELF_CONTAINED=ON) in
# ${FRAGCTL_WHEEL_BUILD_DIR:-build-wheel}, checks every ELF file's needs,
# and tags the wheel with its glibc floor. FRAGCTL_WHEEL_CMAKE_ARGS adds
# configure arguments (tools/test.sh passes -DFRAGCTL_WERROR=ON).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
out=$(realpath -m "${1:-dist}")
mkdir -p "$out"
export FRAGCTL_WHEEL_BUILD_DIR=${FRAGCTL_WHEEL_BUILD_DIR:-build-wheel}
name=$(cd python && python3 -c '
import sys
sys.path.insert(0, "build_backend")
import fragctl_build
print(fragctl_build.build_wheel(sys.argv[1]))' "$out")
echo "$out/$name"
