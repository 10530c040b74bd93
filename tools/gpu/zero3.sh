#!/usr/bin/env bash
# ZeRO-3 on two GPUs of one host (nvidia-h200-x2), one process per GPU over
# NCCL. Builds fragctl, runs benchmarks/zero3 (bench_zero3: a Llama-shaped
# parameter set of ~1.2B bf16 parameters, forward-order fetch/release and
# backward-order reduce-scatter for several steps, byte-exact checks, device
# memory from the driver, all-gather bandwidth), then
# torch.distributed.all_gather_into_tensor over the same shard sizes, and
# writes everything into $OUT (default ./gpu-results): machine.txt,
# build.log, rank*.log, zero3-rank*.json, torch_allgather.json, summary.txt.
# A failing step does not stop the later ones from reporting.
#
#   tools/gpu/zero3.sh              (the lead runs it; about 3-5 minutes)
#   ZERO3_ARGS="--layers 4" tools/gpu/zero3.sh   extra driver arguments
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off (KINDS.md), here and in everything launched below
out=${OUT:-gpu-results}
mkdir -p "$out"
out=$(cd "$out" && pwd)
build=${FRAGCTL_BUILD_DIR:-build-zero3-gpu}
{
  date -u +"date: %Y-%m-%d %H:%M UTC"
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
  nvidia-smi topo -m 2>/dev/null | head -5
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"

# --- build ------------------------------------------------------------------
[ -f .devkit/devkit.sh ] && source .devkit/devkit.sh unpack
start=$(date +%s)
if FRAGCTL_KEEP_GOING=1 FRAGCTL_BUILD_TYPE=Release FRAGCTL_BUILD_DIR=$build tools/build.sh -DFRAGCTL_WERROR=OFF \
     -DFRAGCTL_BUILD_TESTS=OFF -DFRAGCTL_BUILD_BENCHMARKS=ON > "$out/build.log" 2>&1; then
  echo "build: ok in $(( $(date +%s) - start )) s"
else
  echo "build: FAILED (see build.log)"; grep -E "error:|FAILED" "$out/build.log" | head -20
fi
driver=$build/benchmarks/bench_zero3

# --- NCCL: the library torch uses, so both sides run the same code --------------
nccl=${FRAGCTL_NCCL_LIBRARY:-}
if [ -z "$nccl" ]; then
  nccl=$(python3 - <<'EOF' 2>/dev/null
import glob, os
found = []
try:
    import nvidia.nccl
    for p in nvidia.nccl.__path__:
        found += sorted(glob.glob(os.path.join(p, "lib", "libnccl.so*")))
except Exception:
    pass
try:
    import torch
    found += sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libnccl.so*")))
except Exception:
    pass
print(found[0] if found else "")
EOF
)
fi
[ -n "$nccl" ] || nccl=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF; exit}')
export FRAGCTL_NCCL_LIBRARY=$nccl
echo "nccl: ${nccl:-not found}" | tee -a "$out/machine.txt"

# --- fragctl ZeRO-3, one process per GPU -----------------------------------------
run=$(mktemp -d)
rcs=()
if [ -x "$driver" ]; then
  pids=()
  for r in 0 1; do
    timeout 300 "$driver" --rank $r --size 2 --device $r --id-file "$run/nccl-id" --out "$out" \
      --steps 6 --bandwidth-iterations 20 --timeout-ms 120000 ${ZERO3_ARGS:-} > "$out/rank$r.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; rcs+=($?); done
  echo "bench_zero3: exit codes ${rcs[*]}"
  cat "$out/rank0.log" "$out/rank1.log" | grep -E "^rank|bench_zero3" | head -20
else
  echo "bench_zero3: not built"
fi

# --- torch.distributed.all_gather_into_tensor on the same sizes -------------------
python3 - "$out" <<'EOF'
import json, os, sys
out = sys.argv[1]
sizes = None
try:
    sizes = json.load(open(os.path.join(out, "zero3-rank0.json")))["bandwidth"]["shard_sizes"]
except Exception:
    # The driver failed: the default model's blocks, padded as the manager pads them.
    h, i, v, kv = 2048, 5632, 32000, 512
    layer = 2 * (2 * h * h + 2 * h * kv + 3 * h * i)
    sizes = [v * h] + [layer // 2] * 24 + [v * h]
json.dump(sizes, open(os.path.join(out, "sizes.json"), "w"))
EOF
timeout 200 python3 -m torch.distributed.run --standalone --nproc_per_node=2 benchmarks/zero3/zero3_torch_allgather.py \
  "$out/sizes.json" "$out/torch_allgather.json" 20 > "$out/torch.log" 2>&1
echo "torch all-gather: exit $?"; grep -E "busbw|Error|error" "$out/torch.log" | head -5

# --- summary ----------------------------------------------------------------------
python3 - "$out" <<'EOF' | tee "$out/summary.txt"
import json, os, sys
out = sys.argv[1]
def load(name):
    try:
        return json.load(open(os.path.join(out, name)))
    except Exception as e:
        return {"error": f"{name}: {e}"}
ranks = [load(f"zero3-rank{r}.json") for r in (0, 1)]
torch = load("torch_allgather.json")
summary = {"ranks": [], "torch_busbw_gbps": torch.get("busbw_gbps")}
for r in ranks:
    if "memory" not in r:
        print(f"rank {r.get('rank', '?')}: FAILED: {r.get('error')}")
        summary["ranks"].append({"error": r.get("error")})
        continue
    gb = 1e9
    m, ms, g, bw, v = r["memory"], r["model_states"], r["gather_budget"], r["bandwidth"], r["verification"]
    row = {
        "rank": r["rank"], "ok": r.get("ok"),
        "parameters": r["model"]["parameters"],
        "model_state_gb": ms["bytes"] / gb, "ideal_16psi_over_n_gb": ms["ideal_16psi_over_n"] / gb,
        "model_state_ratio": ms["ratio"],
        "gathered_peak_gb": g["gathered_peak"] / gb, "max_live_gb": g["max_live_bytes"] / gb,
        "bucket_gb": g["bucket_bytes"] / gb,
        "device_used_after_comm_gb": m["used_after_comm"] / gb,
        "device_setup_delta_gb": m["measured_setup_delta"] / gb,
        "device_peak_delta_gb": m["measured_peak_delta"] / gb,
        "expected_peak_delta_gb": m["expected_model_states_buckets_gathered_peak"] / gb,
        "manager_busbw_gbps": bw["manager"]["busbw_gbps"],
        "communicator_busbw_gbps": bw["communicator"]["busbw_gbps"],
        "gathered_blocks_checked": v["gathered_blocks_checked"], "gathered_bad_words": v["gathered_bad_words"],
        "gradient_elements_checked": v["gradient_elements_checked"], "gradient_mismatches": v["gradient_mismatches"],
        "persistent_gradient_mismatches": v["persistent_gradient_mismatches"],
        "stall_seconds": r["zero3"]["stall_seconds"], "prefetch": r["zero3"]["prefetch"],
        "step_seconds": [s["seconds"] for s in r["steps"]],
    }
    t = torch.get("busbw_gbps")
    if t:
        row["manager_over_torch"] = row["manager_busbw_gbps"] / t
        row["communicator_over_torch"] = row["communicator_busbw_gbps"] / t
    summary["ranks"].append(row)
    print(f"rank {row['rank']}: {'OK' if row['ok'] else 'FAILED'}  {row['parameters']/1e9:.3f} B params")
    print(f"  model states {row['model_state_gb']:.3f} GB = {row['model_state_ratio']:.4f} x 16Psi/N "
          f"({row['ideal_16psi_over_n_gb']:.3f} GB); gathered peak {row['gathered_peak_gb']:.3f} GB of "
          f"max_live {row['max_live_gb']:.3f} GB; buckets {row['bucket_gb']:.3f} GB")
    print(f"  device (driver): after NCCL init {row['device_used_after_comm_gb']:.3f} GB used; +{row['device_setup_delta_gb']:.3f} GB "
          f"after setup; peak +{row['device_peak_delta_gb']:.3f} GB vs expected {row['expected_peak_delta_gb']:.3f} GB")
    print(f"  all-gather busbw: manager {row['manager_busbw_gbps']:.1f} GB/s, communicator {row['communicator_busbw_gbps']:.1f} GB/s"
          + (f", torch {t:.1f} GB/s -> {row['manager_over_torch']:.3f} / {row['communicator_over_torch']:.3f} of torch" if t else ", torch: n/a"))
    print(f"  checks: {row['gathered_blocks_checked']} gathered blocks, {row['gathered_bad_words']} bad words; "
          f"{row['gradient_elements_checked']} gradient elements, {row['gradient_mismatches']} mismatches; "
          f"persistent mismatches {row['persistent_gradient_mismatches']}; stall {row['stall_seconds']:.3f} s; "
          f"prefetch {row['prefetch']}")
    print(f"  step seconds: {', '.join(f'{s:.3f}' for s in row['step_seconds'])}")
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=2)
EOF
rm -rf "$run"
