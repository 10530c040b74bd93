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
set -uo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s)
out=${OUT:-gpu-results}
mkdir -p "$out"
out=$(cd "$out" && pwd)
[ -f .devkit/devkit.sh ] && source .devkit/devkit.sh unpack
python=${PYTHON:-python3}
{
  date -u +"date: %Y-%m-%d %H:%M UTC"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$python" -c "import torch, torchvision, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'torchvision', torchvision.__version__, 'transformers', transformers.__version__)"
} 2>&1 | tee "$out/trainers-machine.txt"

build=${FRAGCTL_BUILD_DIR:-build-trainers}
echo "building libfragctl.so and libfragctl_preload.so in $build ..."
if ! { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFRAGCTL_BUILD_TESTS=OFF \
         -DFRAGCTL_BUILD_BENCHMARKS=OFF -DFRAGCTL_WERROR=OFF \
       && cmake --build "$build" --target fragctl fragctl_preload -j "$(nproc)"; } > "$out/trainers-build.log" 2>&1; then
  grep -E "error|FAILED" "$out/trainers-build.log" | head -30
  echo "build failed; see $out/trainers-build.log"
  exit 1
fi
echo "built in $(( $(date +%s) - start )) s"

# The documented install; a plain PYTHONPATH if pip cannot install here.
if "$python" -m pip install --no-deps --no-index --force-reinstall --quiet ./python > "$out/trainers-pip.log" 2>&1; then
  echo "python package: pip install ./python ok"
else
  echo "python package: pip install failed (see trainers-pip.log); using PYTHONPATH=python"
  export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
fi
export FRAGCTL_LIBRARY=$PWD/$build/libfragctl.so

# Whatever the build took, stop starting runs so that the whole script ends
# within 8 minutes (480 s), with 30 s to spare.
budget=$(( 450 - ($(date +%s) - start) ))
"$python" benchmarks/trainers/run_trainers.py --out "$out" --preload "$build/libfragctl_preload.so" --budget "$budget" "$@"
rc=$?
echo "trainers: exit $rc, total $(( $(date +%s) - start )) s; table in $out/trainers.md"
exit $rc
