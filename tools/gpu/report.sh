#!/usr/bin/env bash
# Fragmentation reports on a GPU machine (docs/reports.md): builds fragctl's
# report layer and its tests, then
#   1. runs the report tests, and oom_cuda_test, which provokes the three OOM
#      verdicts on the real device (fragmentation, another process, capacity)
#      with the caching policy on the cuda backend;
#   2. replays the traces on the cuda backend through caching and arena with
#      `fragctl report` (text, comparison, HTML page, SVG map);
#   3. with PyTorch and the LD_PRELOAD library: a small training-like loop
#      under FRAGCTL_REPORT + FRAGCTL_REPORT_INTERVAL=1s + FRAGCTL_PROMETHEUS,
#      checking that the report is rewritten while the job runs, then a
#      fragmenting tensor pattern until torch raises OutOfMemoryError, whose
#      fragctl log line must carry the diagnosis; `fragctl report` on the
#      resulting reports, caching against arena.
# About 4 minutes on an H200, build included.
#
#   OUT=gpu-results tools/gpu/report.sh
#
# Writes $OUT/report/{machine.txt,build.log,tests.log,diagnosis.txt,
# *.report.txt,*.html,*.svg,torch-*.json,torch-*.prom,torch-*.log,summary.md};
# prints the summary. A failing step is reported and the later ones still
# run. FRAGCTL_REPORT_BUILD sets the build directory (default build-report-gpu).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/common.sh report
build=${FRAGCTL_REPORT_BUILD:-build-report-gpu}
status=0
summary=()
result() { summary+=("$1"); printf '  %s\n' "$1"; }

[ -f .devkit/devkit.sh ] && source .devkit/devkit.sh unpack
{
  date -u +"date: %Y-%m-%d %H:%M UTC"
  echo "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
  echo "cuda: $(nvcc --version 2>/dev/null | tail -1)"
  echo "torch: $(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (modified)')"
} > "$out/machine.txt"
cat "$out/machine.txt"

# --- build -----------------------------------------------------------------------------
tests=(oom_cuda_test oom_diagnosis_test memory_map_test report_render_test live_export_test report_command_test)
targets=(fragctl_cli fragctl_preload "${tests[@]}")
note "building into $build"
if cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFRAGCTL_WERROR=OFF \
     -DFRAGCTL_BUILD_TESTS=ON -DFRAGCTL_BUILD_BENCHMARKS=OFF > "$out/build.log" 2>&1 &&
   cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" -- -k 0 >> "$out/build.log" 2>&1; then
  note "built"
else
  note "build had failures (see build.log); running what was built"
  grep -E "error:|FAILED" "$out/build.log" | head -10
  status=1
fi
fragctl=$build/tools/fragctl
export FRAGCTL_TEST_DATA=$PWD/tests/data

# --- 1. tests, and the three verdicts on the device -------------------------------------
note "tests"
: > "$out/tests.log"
for t in "${tests[@]}"; do
  if [ ! -x "$build/tests/$t" ]; then result "$t: NOT BUILT"; status=1; continue; fi
  if timeout 180 "$build/tests/$t" > "$out/$t.log" 2>&1; then
    result "$t: passed ($(grep -c '^\[       OK \]' "$out/$t.log") ok, $(grep -c '^\[  SKIPPED \] .* ms)$' "$out/$t.log") skipped)"
  else
    result "$t: FAILED (see $t.log)"; status=1
  fi
  cat "$out/$t.log" >> "$out/tests.log"
done
grep '^\[diagnosis\]' "$out/tests.log" > "$out/diagnosis.txt"
if grep -q "no CUDA device" "$out/oom_cuda_test.log" 2>/dev/null; then
  result "oom_cuda_test SKIPPED: $(grep -m1 'no CUDA device' "$out/oom_cuda_test.log")"; status=1
fi
for v in fragmentation "another process" "true capacity"; do
  if grep -q "verdict: $v" "$out/diagnosis.txt"; then result "device OOM diagnosed as: $v"
  else result "device OOM verdict '$v' NOT SEEN"; status=1; fi
done
sed 's/^/    /' "$out/diagnosis.txt"

# --- 2. trace replays on the device, as reports -------------------------------------------
traces=(tests/data/gpt2m.trace.csv.gz tests/data/resnet50.trace.csv.gz)
[ -f benchmarks/traces/sample.trace.csv.gz ] && traces+=(benchmarks/traces/sample.trace.csv.gz)
for t in "${traces[@]}"; do
  name=$(basename "$t"); name=${name%%.*}
  note "fragctl report $name on cuda (caching, arena)"
  if timeout 120 "$fragctl" report "$t" --backend cuda --policy caching,arena --details \
       --html "$out/$name-cuda.html" --svg "$out/$name-cuda-map.svg" > "$out/$name-cuda.report.txt" 2> "$out/$name-cuda.err"; then
    result "$name on cuda: $(grep -m1 'reserves' "$out/$name-cuda.report.txt")"
  else
    result "$name on cuda: FAILED ($(tail -1 "$out/$name-cuda.err"))"; status=1
  fi
  timeout 120 "$fragctl" report "$t" --backend sim --policy caching,arena > "$out/$name-sim.report.txt" 2>&1 &&
    result "$name on sim:  $(grep -m1 'reserves' "$out/$name-sim.report.txt")"
done

# --- 3. a PyTorch job under LD_PRELOAD: live export and a real OOM ------------------------
preload=$build/libfragctl_preload.so
if [ ! -f "$preload" ] || ! python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  result "torch steps SKIPPED (no $preload or no torch with CUDA)"
else
  for policy in caching arena; do
    note "torch loop under LD_PRELOAD, FRAGCTL_POLICY=$policy"
    rm -f "$out/torch-$policy.json" "$out/torch-$policy.prom"
    LD_PRELOAD=$preload PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync FRAGCTL_POLICY=$policy \
    FRAGCTL_REPORT=$out/torch-$policy.json FRAGCTL_REPORT_INTERVAL=1s FRAGCTL_PROMETHEUS=$out/torch-$policy.prom \
    timeout 150 python3 - "$out/torch-$policy.json" "$out/torch-$policy.prom" > "$out/torch-$policy.log" 2>&1 <<'PY'
import json, os, sys, time, torch
report, prom = sys.argv[1], sys.argv[2]
dev = torch.device("cuda")
torch.manual_seed(0)
# A training-like loop: weights stay, activations of a varying sequence length come and go.
w = [torch.randn(4096, 4096, device=dev) for _ in range(8)]
interval_seen = False
start = time.time()
step = 0
while time.time() - start < 6:
    seq = 512 + (step * 997) % 3584
    x = torch.randn(seq, 4096, device=dev)
    acts = []
    for m in w:
        x = torch.tanh(x @ m)
        acts.append(x)
    loss = sum(a.float().mean() for a in acts)
    del acts, x, loss
    step += 1
    if time.time() - start > 3 and not interval_seen and os.path.exists(report):
        interval_seen = json.load(open(report)).get("reason") == "interval"
torch.cuda.synchronize()
print(f"steps {step}; report rewritten while running: {interval_seen}; prometheus file: {os.path.exists(prom)}")
# A fragmenting pattern until OOM: 8 MiB holes between 12 MiB blocks, holes freed, then 19 MiB.
holes, keep = [], []
try:
    while True:
        holes.append(torch.empty(8 << 20, dtype=torch.uint8, device=dev))
        keep.append(torch.empty(12 << 20, dtype=torch.uint8, device=dev))
except torch.OutOfMemoryError:
    pass
del holes
try:
    big = torch.empty(19 << 20, dtype=torch.uint8, device=dev)
    print("19 MiB after the holes: allocated (no OOM)")
except torch.OutOfMemoryError:
    print("19 MiB after the holes: OutOfMemoryError")
del keep
sys.exit(0 if interval_seen else 3)
PY
    rc=$?
    result "torch $policy: exit $rc; $(grep -m1 '^steps' "$out/torch-$policy.log"); $(grep -m1 '^19 MiB' "$out/torch-$policy.log")"
    [ $rc -eq 0 ] || status=1
    line=$(grep "\[fragctl\].*out of memory" "$out/torch-$policy.log" | tail -1)
    if [ -n "$line" ]; then result "  fragctl log: ${line:0:400}"; else result "  no fragctl OOM log line"; fi
    if [ -f "$out/torch-$policy.prom" ]; then
      result "  prometheus: $(grep -m1 '^fragctl_reserved_peak_bytes' "$out/torch-$policy.prom")"
    else
      result "  prometheus file MISSING"; status=1
    fi
  done
  if [ -f "$out/torch-caching.json" ] && [ -f "$out/torch-arena.json" ]; then
    timeout 60 "$fragctl" report "$out/torch-caching.json" "$out/torch-arena.json" --details \
      --html "$out/torch-compare.html" > "$out/torch-compare.report.txt" 2>&1 &&
      result "torch job: $(grep -m1 'reserve' "$out/torch-compare.report.txt")" ||
      { result "fragctl report on the torch reports FAILED"; status=1; }
  fi
fi

# --- summary ---------------------------------------------------------------------------
{
  echo "### fragctl report on the GPU"
  echo
  sed 's/^/- /' "$out/machine.txt"
  echo
  for s in "${summary[@]}"; do echo "- $s"; done
  echo
  echo "status: $status"
} > "$out/summary.md"
echo
cat "$out/summary.md"
note "done (status $status); results in $out"
exit $status
