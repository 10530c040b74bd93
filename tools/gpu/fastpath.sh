#!/usr/bin/env bash
# One GPU: the fast path per operation (issue 32, deliverable 3; docs/benchmarks.md "The fast path
# per operation on replays"). Replays the five shared traces (tests/data/gpt2m,
# tests/data/resnet50, benchmarks/traces/sample, and gpt_wide and llama1b recorded here as
# tools/gpu/bench.sh records them) through PyTorch's CUDACachingAllocator from C++
# (benchmarks/torch_replay, PYTORCH_CUDA_ALLOC_CONF unset: torch-native) and through fragctl's
# arena on the cuda backend (`fragctl replay --policy arena --backend cuda`), three rounds
# alternated (round 1 torch first, round 2 fragctl first, round 3 torch first), each allocator in
# its own process. Run from the repository root with .devkit carried:
#
#   OUT=gpu-results tools/gpu/fastpath.sh
#
# Writes two files into $OUT: fastpath.md (the machine, then a table of median ns per operation
# per trace, allocator and round, with the arena's reserved/requested and driver memory calls) and
# fastpath.log (build and replay logs). Everything else (the recorded traces, raw JSON) stays in
# the build directory. Laid out to finish within 6 minutes, build included; a replay past its
# time is cut and its cells read "-". Knobs: FRAGCTL_FASTPATH_BUILD (build directory, default
# build-fastpath).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-results}
mkdir -p "$out"
out=$(cd "$out" && pwd)
build=${FRAGCTL_FASTPATH_BUILD:-build-fastpath}
work=$build/fastpath-work
rm -rf "$work"
mkdir -p "$work"
work=$(cd "$work" && pwd)
log=$out/fastpath.log
: > "$log"
t0=$SECONDS
note() { printf '[fastpath %3ds] %s\n' $((SECONDS - t0)) "$*" | tee -a "$log"; }
# Appends a file to the log under a heading.
keep_log() { { echo "--- $1"; cat "$1" 2>/dev/null; } >> "$log"; }

[ -f .devkit/devkit.sh ] && source .devkit/devkit.sh unpack

torch_dir=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))' 2>/dev/null)
torch_abi=$(python3 -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>/dev/null)
source tools/gpu/replay_inputs.sh
describe_machine > "$work/machine.txt"
tee -a "$log" < "$work/machine.txt"

# --- while building: record gpt_wide and llama1b, build torch_replay (as tools/gpu/bench.sh) ---
start_replay_inputs "$work" "$work" "$build" 170 || note "no PyTorch: no torch-native column and no recorded traces"
note "building fragctl_cli (Release) into $build"
timeout 220 bash -c "cmake -S . -B '$build' -G Ninja -DCMAKE_BUILD_TYPE=Release -DFRAGCTL_BUILD_TESTS=OFF \
    -DFRAGCTL_BUILD_BENCHMARKS=OFF -DFRAGCTL_WERROR=OFF && cmake --build '$build' --target fragctl_cli" \
  > "$work/build.log" 2>&1 || { note "fragctl build failed"; grep -E "error:|FAILED" "$work/build.log" | head -20; }
for pid in "${pids[@]}"; do wait "$pid"; done
cli=$build/tools/fragctl
tr_bin=$build/torch_replay/torch_replay
for f in "$work"/record-*.log "$work"/build-torch_replay.log "$work"/build.log; do keep_log "$f"; done
[ -x "$cli" ] || { note "no fragctl binary: see $log"; exit 1; }
[ -n "$torch_dir" ] && [ ! -x "$tr_bin" ] && note "torch_replay did not build (see $log)"

traces=(tests/data/gpt2m.trace.csv.gz tests/data/resnet50.trace.csv.gz benchmarks/traces/sample.trace.csv.gz)
for t in gpt_wide llama1b; do
  if [ -s "$work/$t.trace.csv.gz" ]; then traces+=("$work/$t.trace.csv.gz"); else note "no $t trace (recording failed)"; fi
done
note "built; ${#traces[@]} traces; three rounds alternated"

# --- the rounds -------------------------------------------------------------------------------
deadline=$((t0 + 345))
# Runs "$@" with stdout to $1's file, under the time left (at most 90 s); skips when under 20 s.
replay_into() {
  local file=$1; shift
  local left=$((deadline - SECONDS))
  if [ "$left" -lt 20 ]; then note "skipped (time spent): $(basename "$file")"; return 124; fi
  [ "$left" -gt 90 ] && left=90
  timeout --kill-after=5 "$left" "$@" > "$file" 2> "$file.err"
  local rc=$?
  [ $rc -ne 0 ] && note "$(basename "$file"): exit $rc" && tail -3 "$file.err" | tee -a "$log"
  keep_log "$file.err"
  return $rc
}
run_torch() {
  [ -x "$tr_bin" ] || return 0
  replay_into "$work/torch-native-$1.json" env -u PYTORCH_CUDA_ALLOC_CONF -u PYTORCH_ALLOC_CONF \
    "$tr_bin" replay "${traces[@]}"
}
run_arena() { replay_into "$work/arena-$1.json" "$cli" replay "${traces[@]}" --policy arena --backend cuda --json; }
for round in 1 2 3; do
  if [ $((round % 2)) -eq 1 ]; then run_torch $round; run_arena $round; else run_arena $round; run_torch $round; fi
  note "round $round done"
done

# --- the table --------------------------------------------------------------------------------
python3 - "$work" > "$out/fastpath.md" <<'PY'
import glob, json, os, statistics, sys
work = sys.argv[1]
def load(path):
    try:
        text = open(path).read()
    except OSError:
        return {}
    try:
        runs = json.loads(text)
    except ValueError:  # cut by its time limit: torch_replay prints each trace as it finishes
        try:
            runs = json.loads(text.rstrip().rstrip(",") + "\n]")
        except ValueError:
            return {}
    runs = runs if isinstance(runs, list) else [runs]
    return {os.path.basename(str(r.get("trace", "?"))).split(".")[0]: r for r in runs}
allocators = [("torch-native", "PyTorch CUDACachingAllocator"), ("arena", "fragctl arena (cuda)")]
res = {a: [load(os.path.join(work, f"{a}-{r}.json")) for r in (1, 2, 3)] for a, _ in allocators}
traces = []
for a, _ in allocators:
    for rounds in res[a]:
        traces += [t for t in rounds if t not in traces]
print("# The fast path: median ns per operation, PyTorch's caching allocator and fragctl's arena")
print()
print("    " + open(os.path.join(work, "machine.txt")).read().replace("\n", "\n    ").rstrip())
print()
print("Command: `OUT=... tools/gpu/fastpath.sh` (repo root). Each cell: median ns per malloc or free, each")
print("timed alone with steady_clock (the clock's own cost included; `clock` is its median back-to-back")
print("read, from the arena's runs). Rounds alternated: 1 torch first, 2 arena first, 3 torch first.")
print()
head = ["trace"] + [f"{name} r{r}" for _, name in allocators for r in (1, 2, 3)]
head += ["median of rounds: torch / arena", "clock ns", "arena reserved/requested", "arena driver memory calls"]
print("| " + " | ".join(head) + " |")
print("|" + " --- |" * len(head))
def cell(r, key, fmt="{:.0f}"):
    return fmt.format(r[key]) if r and key in r else "-"
for t in traces:
    row = [t]
    meds = {}
    for a, _ in allocators:
        vals = [rounds.get(t) for rounds in res[a]]
        row += [cell(v, "median_ns") for v in vals]
        got = [v["median_ns"] for v in vals if v]
        meds[a] = f"{statistics.median(got):.0f}" if got else "-"
    arena = next((rounds[t] for rounds in res["arena"] if t in rounds), None)
    clocks = [rounds[t]["clock_overhead_ns"] for rounds in res["arena"] if t in rounds]
    row += [f"{meds['torch-native']} / {meds['arena']}", f"{statistics.median(clocks):.0f}" if clocks else "-",
            cell(arena, "reserved_over_requested", "{:.4f}"), cell(arena, "backend_memory_calls")]
    print("| " + " | ".join(row) + " |")
PY
note "done: $out/fastpath.md"
cat "$out/fastpath.md"
