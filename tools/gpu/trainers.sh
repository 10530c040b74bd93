#!/usr/bin/env bash
# On a GPU machine with PyTorch, torchvision and transformers: builds
# libfragctl.so and libfragctl_preload.so, installs the Python package
# (pip install ./python), and trains GPT-2-medium-shaped and Llama-shaped
# causal LMs (variable sequence lengths) and a ResNet-50 (variable image
# sizes), random weights, no downloads, each under PyTorch's native
# allocator, expandable segments, fragctl.torch.enable with caching, arena,
# buckets:arena and warmup:arena, and LD_PRELOAD=libfragctl_preload.so with
# PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
# (benchmarks/trainers/run_trainers.py). Results in ${OUT:-gpu-results}:
# trainers.md (table and verdict), trainers.json, one log and JSON per run.
# Finishes in under 8 minutes on an H200.
#   tools/gpu/trainers.sh [run_trainers.py options, e.g. --models resnet --steps 6]
# Issue 16's jobs (gradient-checkpointed 1.1B decoder LM at 128-4096 tokens,
# 8-expert top-2 MoE LM, frozen 1.3B base + trainable head) under native,
# expandable segments, cudaMallocAsync, fragctl.torch.enable("arena") and
# LD_PRELOAD arena, in alternation:
#   tools/gpu/trainers.sh --livebytes [--quick]
# With --livebytes it first replays the declm replay model
# (benchmarks/trainers/declm_trace.py) on the GPU with the cuda backend, so
# that the driver calls of docs/policies/arena.md "Driver calls per step"
# are timed on real driver calls (a replay queues no kernels, so nothing
# lags and wait_before_growing changes nothing there):
# $out/declm-model-replay.txt (table) and declm-model-replay.json; not
# when --models leaves declm out.
# Issue 32's other kinds (encoder-decoder, peft LoRA, ViT at variable image
# size, KV-cache generation; benchmarks/trainers/jobs.py), e.g.:
#   tools/gpu/trainers.sh --livebytes --models t5,lora,vit,kvgen --runs native,expandable,arena
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/trainers_setup.sh trainers

# The models run_trainers.py will run: --livebytes's set (with declm) unless --models names others.
models=declm
previous=
for argument in "$@"; do
  case $argument in --models=*) models=${argument#--models=} ;; esac
  [ "$previous" = --models ] && models=$argument
  previous=$argument
done
if [[ " $* " == *" --livebytes "* && ",$models," == *",declm,"* ]]; then
  "$python" benchmarks/trainers/declm_trace.py --out "$out/declm-model.trace.csv.gz"
  "$build/tools/fragctl" replay "$out/declm-model.trace.csv.gz" --backend cuda --policy arena 2>&1 |
    tee "$out/declm-model-replay.txt"
  "$build/tools/fragctl" replay "$out/declm-model.trace.csv.gz" --backend cuda --policy arena --json \
    > "$out/declm-model-replay.json"
fi

# Whatever the build took, stop starting runs so that the whole script ends
# within 8 minutes (480 s), with 30 s to spare.
budget=$(( 450 - ($(date +%s) - start) ))
"$python" benchmarks/trainers/run_trainers.py --out "$out" --preload "$build/libfragctl_preload.so" --budget "$budget" \
  --cli "$build/tools/fragctl" "$@"
rc=$?
echo "trainers: exit $rc, total $(( $(date +%s) - start )) s; table in $out/trainers.md"
exit $rc
