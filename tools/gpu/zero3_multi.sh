#!/usr/bin/env bash
# ZeRO-3 on several GPUs of one host beside FSDP2 (issue 31, deliverable 3),
# then a rank that stops inside zero3.shard's training on NCCL. Builds
# libfragctl.so (the library target alone) and fragctl's native torch module
# at once, then runs
#   benchmarks/zero3/multi_gpu.py: FSDP2 on PyTorch's allocator, FSDP2 under
#     enable("arena"), zero3.shard under enable("arena") and enable("caching"),
#     a 1.26 B Llama, 50 steps, one process per GPU, REPEAT rounds alternated;
#   benchmarks/zero3/nccl_hang.py (HANG=1, the default, on 2 or more GPUs).
# NVLink multicast stays off in every process (KINDS.md).
# Environment: NPROC (default: every GPU), REPEAT (1), VARIANTS (default the four
# above; zero3-arena-ahead2 gathers two layers ahead),
# BENCH_ARGS (more multi_gpu.py options), HANG (1), FRAGCTL_BUILD_DIR
# (default /tmp/fragctl-zero3-multi: outside the tree, so a later call on
# the same machine reuses it), OUT.
# Results in ${OUT:-gpu-results}/zero3_multi (six files, as the device tool
# brings back): machine.txt, multi_gpu.{json,md,log}, nccl_hang.json and
# logs.tar.gz (the build logs, every rank's row, the hang's rank logs);
# with SAVE_PREBUILT=1 also prebuilt.tar.gz (the library and the native
# module), which PREBUILT=<that file> takes instead of building.
# About 30 s per job on H100s after a build of about a minute.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source tools/gpu/common.sh zero3_multi
[ -f .devkit/devkit.sh ] && source .devkit/devkit.sh unpack
python=${PYTHON:-python3}
nproc=${NPROC:-$(nvidia-smi -L | wc -l)}
build=${FRAGCTL_BUILD_DIR:-/tmp/fragctl-zero3-multi}
work=$(mktemp -d /tmp/zero3-multi.XXXXXX)
export FRAGCTL_LIBRARY=$build/libfragctl.so PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export FRAGCTL_TORCH_BUILD_DIR=$build/torch-native
{
  date -u +"date: %Y-%m-%d %H:%M UTC"
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
  nvidia-smi topo -m 2>/dev/null | head -$((nproc + 1))
  "$python" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', '.'.join(map(str, torch.cuda.nccl.version())), 'transformers', transformers.__version__)"
  echo "commit: $(cat .commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)"
} 2>&1 | tee "$out/machine.txt"
if [ -n "${PREBUILT:-}" ] && [ -f "$PREBUILT" ]; then
  note "taking libfragctl.so and the native module from $PREBUILT (built by an earlier call on this image)"
  mkdir -p "$build" && tar -xzf "$PREBUILT" -C "$build"
  if "$python" -c "from fragctl import _capi; _capi.library()" > "$work/prebuilt.log" 2>&1; then
    true & library=$!
  else
    note "the prebuilt library does not load; building"; cat "$work/prebuilt.log"; unset PREBUILT
  fi
fi
if [ -z "${PREBUILT:-}" ] || [ ! -f "$PREBUILT" ]; then
  note "building libfragctl.so and the native torch module (in parallel)"
  (cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFRAGCTL_BUILD_TESTS=OFF -DFRAGCTL_BUILD_BENCHMARKS=OFF \
     -DFRAGCTL_WERROR=OFF && cmake --build "$build" --target fragctl -j "$(nproc)") > "$work/build.log" 2>&1 &
  library=$!
fi
"$python" -c "from fragctl import _native; _native.load()" > "$work/native.log" 2>&1 &
native=$!
wait $library || { note "library build failed"; tail -30 "$work/build.log"; exit 1; }
wait $native || { note "native module build failed"; tail -30 "$work/native.log"; }
note "built"
if [ "${SAVE_PREBUILT:-0}" = 1 ]; then  # for a later call on a fresh machine of the same image (PREBUILT=)
  strip --strip-debug "$build"/libfragctl.so.*.* 2>/dev/null
  tar -czf "$out/prebuilt.tar.gz" -C "$build" $(cd "$build" && ls -d libfragctl.so* torch-native) && ls -la "$out/prebuilt.tar.gz"
fi
# shellcheck disable=SC2086  # BENCH_ARGS are words
timeout 560 "$python" benchmarks/zero3/multi_gpu.py --nproc "$nproc" --repeat "${REPEAT:-1}" \
  ${VARIANTS:+--variants "$VARIANTS"} --out "$out" --jobs-dir "$work/jobs" ${BENCH_ARGS:-} > "$out/multi_gpu.log" 2>&1
note "multi_gpu.py exited $?"
grep -E "^\[|^\|" "$out/multi_gpu.log" | head -60
if [ "${HANG:-1}" = 1 ] && [ "$nproc" -ge 2 ]; then
  note "a rank that stops: nccl_hang.py, group timeout 20 s"
  CUDA_VISIBLE_DEVICES=0,1 timeout 200 "$python" benchmarks/zero3/nccl_hang.py --out "$work/hang" > "$out/nccl_hang.json" 2> "$work/hang.log"
  note "nccl_hang.py exited $?"
  tail -20 "$work/hang.log"; cat "$out/nccl_hang.json"
fi
tar -czf "$out/logs.tar.gz" -C "$work" . 2>/dev/null
note "done"
