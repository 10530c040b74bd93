#!/usr/bin/env bash
# The activation-checkpoint store on the GPU (docs/checkpoint.md, "Measured"):
# builds bench_checkpoint and the checkpoint tests, runs the tests, then
# drives the store on the cuda backend with a Llama-like stack (24 layers of
# 256 MiB checkpoints, 8 ms forward and 16 ms backward of simulated compute
# per layer) under budgets of 100%, 50% and 10% of their total. Reports the
# copy path's device-to-host and host-to-device bandwidth against a plain
# pinned memcpy_async of the same size, the share of copy time hidden behind
# compute, the forward and backward stall, pins in steady state, and data
# integrity (every checkpoint is written and checked by kernels). About two
# minutes on an H200, build included.
#
#   OUT=gpu-results tools/gpu/checkpoint.sh [bench_checkpoint flags]
#
# Writes $OUT/checkpoint/{machine.txt,build.log,tests.log,bench.json,
# bench.txt,store-stats.log,summary.md}; prints the summary. A failing step is
# reported and the later ones still run. FRAGCTL_CKPT_BUILD sets the build
# directory (default build-ckpt-gpu); FRAGCTL_CKPT_BACKEND the backend
# (default cuda; a dry run without a GPU: FRAGCTL_CKPT_BACKEND=sim
# FRAGCTL_CONF=sim_backed:true tools/gpu/checkpoint.sh --layers=8 --layer_mib=4).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/common.sh checkpoint
build=${FRAGCTL_CKPT_BUILD:-build-ckpt-gpu}
status=0

[ -f .devkit/devkit.sh ] && source .devkit/devkit.sh unpack
{
  date -u +"date: %Y-%m-%d %H:%M UTC"
  echo "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
  echo "cuda: $(nvcc --version 2>/dev/null | tail -1)"
  echo "compiler: $(g++ --version | head -1)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (modified)')"
} > "$out/machine.txt"
cat "$out/machine.txt"

# --- build (only what this script runs) ----------------------------------------------
note "building into $build"
targets=(bench_checkpoint store_test pinned_host_arena_test jemalloc_isolation_test planner_test sim_wait_event_test fragctl)
if cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFRAGCTL_WERROR=OFF \
     -DFRAGCTL_BUILD_TESTS=ON -DFRAGCTL_BUILD_BENCHMARKS=ON > "$out/build.log" 2>&1 &&
   cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" >> "$out/build.log" 2>&1; then
  note "built"
else
  note "BUILD FAILED"; grep -E "error:|FAILED|CMake Error" "$out/build.log" | head -20
  exit 1
fi

# --- tests: sim data checks, and jemalloc kept private with this toolchain -------------
note "tests"
: > "$out/tests.log"
for t in store_test pinned_host_arena_test jemalloc_isolation_test planner_test sim_wait_event_test; do
  if timeout 120 "$build/tests/$t" >> "$out/tests.log" 2>&1; then
    echo "  $t: passed"
  else
    echo "  $t: FAILED (see tests.log)"; status=1
  fi
done

# --- the store on the GPU --------------------------------------------------------------
backend=${FRAGCTL_CKPT_BACKEND:-cuda}
note "bench_checkpoint on $backend"
FRAGCTL_BACKEND=$backend timeout --kill-after=10 240 "$build/benchmarks/bench_checkpoint" \
  --benchmark_out="$out/bench.json" --benchmark_out_format=json --benchmark_counters_tabular=true "$@" \
  > "$out/bench.txt" 2> "$out/store-stats.log"
rc=$?
cat "$out/bench.txt"
if [ $rc -ne 0 ]; then
  note "bench_checkpoint exited $rc"; tail -5 "$out/store-stats.log"; status=1
fi

# --- summary ---------------------------------------------------------------------------
python3 - "$out/bench.json" "$out/machine.txt" "$backend" > "$out/summary.md" <<'EOF' || { note "no summary"; status=1; }
import json, sys
bench = json.load(open(sys.argv[1]))
machine = open(sys.argv[2]).read().strip().splitlines()
rows = [b for b in bench["benchmarks"] if b.get("run_type", "iteration") == "iteration"]
def plain(direction):
    return next((b["GBps"] for b in rows if b["name"].startswith(f"plain_copy/{direction}/")), 0.0)
print(f"### Checkpoint store, {sys.argv[3]} backend\n")
for line in machine:
    print(f"- {line}")
print(f"- plain pinned memcpy_async of one checkpoint: D2H {plain('d2h'):.1f} GB/s, H2D {plain('h2d'):.1f} GB/s\n")
print("| budget | budget GiB | offloaded GiB | D2H GB/s (vs plain) | H2D GB/s (vs plain) | copy hidden | fwd stall ms | bwd stall ms | on-demand gets | pins steady | errors | iteration ms |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
ok, notes, label, seen = True, [], "", 0
for b in rows:
    if not b["name"].startswith("checkpoint/"):
        continue
    seen += 1
    pct = b["name"].split("budget_pct:")[1].split("/")[0]
    if b.get("error_occurred"):
        print(f"| {pct}% | ERROR: {b.get('error_message')} |" + " |" * 10)
        ok = False
        continue
    label = b.get("label", label)
    d2h = f"{b['d2h_GBps']:.1f} ({b['d2h_vs_plain']:.0%})" if "d2h_GBps" in b else "-"
    h2d = f"{b['h2d_GBps']:.1f} ({b['h2d_vs_plain']:.0%})" if "h2d_GBps" in b else "-"
    hidden = f"{b['hidden_pct']:.0f}%" if "hidden_pct" in b else "-"
    print(f"| {pct}% | {b['budget_GiB']:.2f} | {b['offloaded_GiB']:.2f} | {d2h} | {h2d} | {hidden} | "
          f"{b['fwd_stall_ms']:.1f} | {b['bwd_stall_ms']:.1f} | {b['on_demand_gets']:.0f} | {b['pins_steady']:.0f} | "
          f"{b['errors']:.0f} | {b['real_time']:.1f} |")
    if b["errors"] != 0 or b["pins_steady"] != 0:
        ok = False
    for k in ("d2h_vs_plain", "h2d_vs_plain"):
        if k in b and b[k] < 0.8:
            notes.append(f"below target: budget {pct}%, {k} = {b[k]:.0%} (target 80%)")
if seen == 0:
    ok = False
    notes.append("no checkpoint/ benchmark ran: nothing was checked")
print()
for n in notes:
    print(f"- {n}")
print(f"- host tier, device work: {label}")
print("\nresult:", "data intact, no pinning in steady state" if ok else "FAILED (errors or pinning in steady state)")
sys.exit(0 if ok else 1)
EOF
cat "$out/summary.md"
note "done (status $status); results in $out"
exit $status
