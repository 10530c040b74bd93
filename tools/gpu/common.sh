# Sourced by the tools/gpu scripts, from the repository root, with the
# script's name: `source tools/gpu/common.sh NAME`. Sets `out` to
# ${OUT:-gpu-results}/NAME, created and made absolute; starts the clock `t0`;
# defines note(), which prints a line prefixed with NAME and the seconds since.
gpu_script=$1
out=${OUT:-gpu-results}/$gpu_script
mkdir -p "$out"
out=$(cd "$out" && pwd)
t0=$SECONDS
note() { printf '[%s %3ds] %s\n' "$gpu_script" $((SECONDS - t0)) "$*"; }
