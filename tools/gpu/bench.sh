#!/usr/bin/env bash
# Performance against the incumbents, in one run on a GPU machine
# (docs/benchmarks-guide.md): trace replay through PyTorch's own allocator
# (native and expandable segments) and every fragctl policy; fragmentation
# stress under a fixed capacity; microbenchmarks against cudaMalloc and
# cudaMallocAsync. Laid out to finish within 7 minutes on an H200, build included.
#
#   OUT=gpu-results tools/gpu/bench.sh
#
# Writes $OUT/bench.md (markdown tables, ready to paste), $OUT/raw/*.json and
# raw/stress-series.csv, the recorded traces in $OUT/traces, logs in
# $OUT/logs; prints a compact summary. A failing step is reported and the
# later ones still run. Needs CUDA, PyTorch with its C++ headers, cmake,
# ninja, g++; fragctl's C++ dependencies come from .devkit
# (source .devkit/devkit.sh unpack). Environment knobs:
#   FRAGCTL_BENCH_BUDGET  seconds the steps after the build may take (default 330)
#   FRAGCTL_BENCH_CAP     the stress benchmark's fixed capacity (default 24GiB)
#   FRAGCTL_BENCH_BUILD   build directory (default build-bench)
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-results}
mkdir -p "$out/raw" "$out/logs" "$out/traces"
out=$(cd "$out" && pwd)
build=${FRAGCTL_BENCH_BUILD:-build-bench}
cap=${FRAGCTL_BENCH_CAP:-24GiB}
t0=$SECONDS
note() { printf '[bench %3ds] %s\n' $((SECONDS - t0)) "$*"; }

# Runs "$@" under a time limit: the step's own, cut to what is left of the
# budget. Skips the step when too little is left.
deadline=0
limited() {
  local limit=$1; shift
  local left=$((deadline - SECONDS))
  if [ "$left" -lt 15 ]; then note "skipped (time budget spent): $*"; return 124; fi
  [ "$limit" -gt "$left" ] && limit=$left
  timeout --kill-after=5 "$limit" "$@"
  local rc=$?
  [ $rc -eq 124 ] && note "timed out after ${limit}s: $1"
  return $rc
}

[ -f .devkit/devkit.sh ] && source .devkit/devkit.sh unpack

# --- machine ------------------------------------------------------------------------
torch_dir=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))' 2>/dev/null)
torch_abi=$(python3 -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>/dev/null)
source tools/gpu/replay_inputs.sh
describe_machine > "$out/machine.txt"
cat "$out/machine.txt"

# --- while building: record traces of other models, build torch_replay -----------------
start_replay_inputs "$out/traces" "$out/logs" "$build" 200 ||
  note "no PyTorch: the torch rows and the recorded traces are left out"

note "building fragctl (Release) into $build"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFRAGCTL_BUILD_TESTS=OFF \
  -DFRAGCTL_BUILD_BENCHMARKS=ON -DFRAGCTL_WERROR=OFF ${FRAGCTL_CMAKE_ARGS:-} > "$out/logs/build.log" 2>&1 &&
  cmake --build "$build" --target fragctl_cli bench_micro bench_stress -- -k 0 >> "$out/logs/build.log" 2>&1 ||
  { note "fragctl build failed:"; grep -E "error:|FAILED" "$out/logs/build.log" | head -20; }
for pid in "${pids[@]}"; do wait "$pid"; done
note "built; recorded traces: $(cd "$out/traces" && ls -1 ./*.trace.csv.gz 2>/dev/null | tr '\n' ' ')"
tr_bin="$build/torch_replay/torch_replay"
if [ -n "$torch_dir" ] && [ ! -x "$tr_bin" ]; then
  note "torch_replay did not build:"; grep -E "error|Error" "$out/logs/build-torch_replay.log" | head -10
fi
for f in "$out"/logs/record-*.log; do
  [ -e "$f" ] || continue
  grep -q "record_trace: wrote" "$f" || { note "recording failed: $f"; tail -3 "$f"; }
done
deadline=$((SECONDS + ${FRAGCTL_BENCH_BUDGET:-330}))

# --- trace replay ---------------------------------------------------------------------
traces=(tests/data/gpt2m.trace.csv.gz tests/data/resnet50.trace.csv.gz benchmarks/traces/sample.trace.csv.gz)
for t in "$out"/traces/*.trace.csv.gz; do [ -s "$t" ] && traces+=("$t"); done
note "replay: ${#traces[@]} traces through torch native, torch expandable, every fragctl policy"
if [ -x "$tr_bin" ]; then
  limited 120 env -u PYTORCH_CUDA_ALLOC_CONF -u PYTORCH_ALLOC_CONF "$tr_bin" replay "${traces[@]}" \
    > "$out/raw/replay-torch-native.json" 2> "$out/logs/replay-torch-native.log" || note "torch native replay failed"
  limited 120 env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "$tr_bin" replay "${traces[@]}" \
    > "$out/raw/replay-torch-expandable.json" 2> "$out/logs/replay-torch-expandable.log" ||
    note "torch expandable replay failed"
fi
limited 180 "$build/tools/fragctl" replay "${traces[@]}" --policy all --backend cuda --json \
  > "$out/raw/replay-fragctl.json" 2> "$out/logs/replay-fragctl.log" || note "fragctl replay failed (see logs)"

# --- fragmentation stress -------------------------------------------------------------
# One process per question and allocator family, each writing its results as
# they finish, so a time limit costs only what was not done yet.
note "stress: largest workload under a $cap cap; smallest cap at scale 1 and step time there"
limited 60 "$build/benchmarks/bench_stress" --mode=largest --backend=sim --cap="$cap" \
  --json="$out/raw/stress-fragctl-largest.json" > "$out/logs/stress-fragctl-largest.log" 2>&1 ||
  note "fragctl stress (largest) failed"
limited 120 "$build/benchmarks/bench_stress" --mode=smallest --backend=sim --timing-backend=cuda \
  --json="$out/raw/stress-fragctl-smallest.json" > "$out/logs/stress-fragctl-smallest.log" 2>&1 ||
  note "fragctl stress (smallest) failed"
if [ -x "$tr_bin" ]; then
  for mode in largest smallest; do
    limited 75 env -u PYTORCH_CUDA_ALLOC_CONF -u PYTORCH_ALLOC_CONF "$tr_bin" stress --mode $mode --cap "$cap" \
      > "$out/raw/stress-torch-native-$mode.json" 2> "$out/logs/stress-torch-native-$mode.log" ||
      note "torch native stress ($mode) failed"
    limited 75 env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "$tr_bin" stress --mode $mode --cap "$cap" \
      > "$out/raw/stress-torch-expandable-$mode.json" 2> "$out/logs/stress-torch-expandable-$mode.log" ||
      note "torch expandable stress ($mode) failed"
  done
fi

# --- microbenchmarks --------------------------------------------------------------------
cudart=${FRAGCTL_CUDART:-$(ls /usr/local/cuda/lib64/libcudart.so* "$torch_dir"/../nvidia/cuda_runtime/lib/libcudart.so* 2>/dev/null | head -1)}
for backend in cuda sim; do
  note "micro on $backend"
  limited 150 env FRAGCTL_CUDART="$cudart" "$build/benchmarks/bench_micro" --backend=$backend \
    --benchmark_min_time=0.05 --benchmark_out="$out/raw/micro-$backend.json" --benchmark_out_format=json \
    > "$out/logs/micro-$backend.txt" 2>&1 || { note "micro on $backend failed"; tail -3 "$out/logs/micro-$backend.txt"; }
done

# --- tables -----------------------------------------------------------------------------
{
  echo "# fragctl against the incumbents"
  echo
  sed 's/^/    /' "$out/machine.txt"
  echo
  echo "Command: \`OUT=$out tools/gpu/bench.sh\` (repo root; stress cap $cap). Raw results in raw/, logs in logs/."
  echo
  python3 benchmarks/bench_tables.py "$out/raw"
} > "$out/bench.md"
note "done: $out/bench.md"
python3 benchmarks/bench_tables.py --summary "$out/raw"
