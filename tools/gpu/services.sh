#!/usr/bin/env bash
# On one GPU with PyTorch 2.x and transformers: fragctl's services in a
# training loop (docs/torch-services.md). Builds libfragctl.so, runs the
# fragctl.torch service tests on the GPU machine's Python, then
# benchmarks/services/services_bench.py:
#   (a) offload: a Llama decoder from a transformers config (random weights,
#       bf16, 16 layers, hidden 2048, 2 x 4096 tokens) without offload, with
#       fragctl.torch.offload_activations at half the saved activations'
#       peak, and with torch.autograd.graph.save_on_cpu(pin_memory=True):
#       step times, loss differences, peak device memory; then the same with
#       every layer recomputed (--recompute, 4 x 8192 tokens), with the
#       model's own loss and with the loss in chunks (--loss chunked);
#   (b) zero3: the same model, world size 1, 50 steps, each variant in its
#       own process: FSDP2 (fully_shard) on PyTorch's native allocator,
#       fragctl.torch.zero3.shard after fragctl.torch.enable() (one pool),
#       and zero3.shard without enable (--no-enable): losses, peak device
#       memory (sampled from outside the process), num_alloc_retries in
#       steady steps, throughput.
# About 10 minutes on an H100, at most 19 (the tests are cut at 4 minutes,
# the offload runs at 3, zero3 at 5); TESTS=0, OFFLOAD=0 or ZERO3=0 leave a part out; extra model
# arguments go to every run through BENCH_ARGS (e.g. "--layers 8").
# Results: ${OUT:-gpu-results}/services/{offload,offload-recompute,offload-recompute-chunked,zero3}.{json,md},
# summary.md.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
source tools/gpu/common.sh services
[ -f .devkit/devkit.sh ] && source .devkit/devkit.sh unpack
python=${PYTHON:-python3}
{
  date -u +"date: %Y-%m-%d %H:%M UTC"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$python" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
} 2>&1 | tee "$out/machine.txt"
note "building libfragctl.so"
FRAGCTL_BUILD_TYPE=Release FRAGCTL_BUILD_DIR=build-gpu tools/build.sh -DFRAGCTL_BUILD_TESTS=OFF \
  -DFRAGCTL_BUILD_BENCHMARKS=OFF -DFRAGCTL_WERROR=OFF > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
export FRAGCTL_LIBRARY=$PWD/build-gpu/libfragctl.so PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
if [ "${TESTS:-1}" = 1 ]; then
  note "fragctl.torch service tests (sim backend, this Python)"
  timeout 240 "$python" -m unittest discover -s tests/torch -p "test_*.py" > "$out/unittest.log" 2>&1
  tail -3 "$out/unittest.log"
fi
# shellcheck disable=SC2086  # BENCH_ARGS are words
if [ "${OFFLOAD:-1}" = 1 ]; then
  note "offload: none / fragctl at half the activations / save_on_cpu"
  timeout 180 "$python" benchmarks/services/services_bench.py offload --out "$out" --steps 8 ${BENCH_ARGS:-} \
    > "$out/offload.log" 2>&1 || { note "offload failed"; tail -20 "$out/offload.log"; }
  note "offload with recomputed layers (DeepSpeed's cpu_checkpointing case), at 4 x 8192 tokens"
  timeout 180 "$python" benchmarks/services/services_bench.py offload --recompute --seq 8192 --batch 4 --out "$out" \
    --steps 8 ${BENCH_ARGS:-} > "$out/offload-recompute.log" 2>&1 ||
    { note "offload --recompute failed"; tail -20 "$out/offload-recompute.log"; }
  note "the same with the loss in chunks of 4096 tokens (no fp32 logits saved)"
  timeout 180 "$python" benchmarks/services/services_bench.py offload --recompute --loss chunked --seq 8192 --batch 4 \
    --out "$out" --steps 8 ${BENCH_ARGS:-} > "$out/offload-recompute-chunked.log" 2>&1 ||
    { note "offload --recompute --loss chunked failed"; tail -20 "$out/offload-recompute-chunked.log"; }
fi
if [ "${ZERO3:-1}" = 1 ]; then
  note "zero3: FSDP2, fragctl with enable(), fragctl without; world size 1, 50 steps, a process each"
  timeout 300 "$python" benchmarks/services/services_bench.py zero3 --no-enable --out "$out" --steps 50 \
    ${BENCH_ARGS:-} > "$out/zero3.log" 2>&1 || { note "zero3 failed"; tail -20 "$out/zero3.log"; }
fi
cat "$out"/offload.md "$out"/offload-recompute.md "$out"/offload-recompute-chunked.md "$out"/zero3.md 2>/dev/null | tee "$out/summary.md"
note "done"
