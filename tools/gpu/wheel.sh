#!/usr/bin/env bash
# The install proof on the GPU machine (docs/packaging.md): nothing but the
# wheel, built on the project's machine (tools/wheel.sh) and carried alone in
# dist/. No build, no system package, no devkit here:
#   1. pip install --no-deps --target of the wheel; import time; readelf -d;
#   2. tests/python/torch_checks.py under fragctl.torch.enable() (native
#      route: its first-use compile against this torch) and under
#      `fragctl run` (LD_PRELOAD shim, PyTorch's cudaMallocAsync backend);
#   3. one benchmarks/trainers job (gpt2m) under both, beside PyTorch's own;
#   4. jemalloc in the pinned host tier from Python.
# Results: ${OUT:-gpu-results}/wheel/{log.txt,*.json}.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/common.sh wheel
wheel=$(ls dist/fragctl-*.whl | tail -1)
site=/tmp/fragctl-site
rm -rf "$site"
note "installing $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB) with pip --target"
python3 -m pip install -q --no-index --no-deps --no-cache-dir --target "$site" "$wheel" || exit 1
export PYTHONPATH=$site PYTHONUNBUFFERED=1 PATH=$site/bin:$PATH
unset FRAGCTL_LIBRARY
export FRAGCTL_TORCH_BUILD_DIR=/tmp/fragctl-native
fragctl() { python3 -m fragctl "$@"; }
note "glibc $(ldd --version | head -1 | awk '{print $NF}'); $(python3 -c 'import torch; print("torch", torch.__version__)')"
for f in "$site"/fragctl/lib/*.so "$site"/fragctl/bin/fragctl; do
  echo "$(basename "$f"): $(readelf -d "$f" | grep NEEDED | sed 's/.*\[\(.*\)\]/\1/' | tr '\n' ' ')"
done
fragctl --version
python3 -c "import fragctl; print('library', fragctl.library_path()); print('preload', fragctl.preload_library())"
note "import time (5 runs each, ms)"
for i in 1 2 3 4 5; do
  python3 -c "import time; t = time.perf_counter(); import fragctl; print(round((time.perf_counter() - t) * 1e3, 1))"
done | tr '\n' ' '; echo
note "pinned host tier from Python"
python3 - <<'PY'
import json, fragctl
a = fragctl.Allocator("caching", backend="cuda")
print("allocator on", a.stats()["backend"])
PY
checks="${CHECKS:-memory_api record_stream graph cudnn_benchmark hf_trainer}"
note "torch_checks under enable() (native route; the first builds the module)"
for c in $checks; do
  python3 tests/python/torch_checks.py native "$c" 2>"$out/native_$c.err" | tail -1 > "$out/native_$c.json"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], 'ok' if r.get('ok') else 'FAILED', r.get('route'), r.get('error',''))" "$out/native_$c.json" "$c"
done
grep -h "compiling\|fragctl:" "$out"/native_*.err | sort | uniq -c | head -5
note "torch_checks under fragctl run (LD_PRELOAD)"
for c in memory_api record_stream graph; do
  fragctl run --policy arena --report "$out/run_$c.report.json" -- python3 tests/python/torch_checks.py torch "$c" \
    2>"$out/run_$c.err" | tail -1 > "$out/run_$c.json"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], 'ok' if r.get('ok') else 'FAILED', r.get('error',''))" "$out/run_$c.json" "$c"
  grep "fragctl run" "$out/run_$c.err"
done
note "fragctl run with torchrun (the worker gets the shim)"
fragctl run --policy arena --report "$out/torchrun.report.json" -- \
  torchrun --standalone --nproc-per-node 1 tests/python/torch_checks.py torch memory_api 2>"$out/torchrun.err" |
  tail -1 | cut -c1-300
grep "fragctl run" "$out/torchrun.err"
note "trainer gpt2m: PyTorch, enable(), fragctl run"
cd benchmarks/trainers
python3 train_one.py --model gpt2m --mode native --steps 12 --out "$out/train_native.json" > /dev/null 2>&1
python3 train_one.py --model gpt2m --mode fragctl --steps 12 --out "$out/train_enable.json" > /dev/null 2>&1
python3 -m fragctl run --policy arena --report "$out/train_run.report.json" -- \
  python3 train_one.py --model gpt2m --mode preload --steps 12 --out "$out/train_run.json" > /dev/null 2>"$out/train_run.err"
grep "fragctl run" "$out/train_run.err"
cd ../..
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
for name in ["train_native", "train_enable", "train_run"]:
    path = os.path.join(out, name + ".json")
    if not os.path.exists(path):
        print(name, "no result"); continue
    r = json.load(open(path))
    f = r.get("fragctl") or {}
    print(name, "error" if r.get("error") else "ok", "median step %.4f s" % r.get("median_step_s", 0),
          "peak device %.2f GiB" % ((r.get("peak_device_used_bytes") or 0) / 2**30), "last loss", r.get("losses", [None])[-1],
          "fragctl %s ratio %s" % (f.get("allocator"), f.get("reserved_over_requested")), (r.get("error") or "")[:200])
PY
note "done"
