# Sourced by tools/gpu/trainers.sh and tools/gpu/capacity.sh, from the
# repository root, at their start: `source tools/gpu/trainers_setup.sh NAME`.
# Sets `start` (epoch seconds) and `out` (the results folder ${OUT:-gpu-results},
# created, absolute), records the machine in $out/NAME-machine.txt, builds libfragctl.so, libfragctl_preload.so and the fragctl CLI in
# ${FRAGCTL_BUILD_DIR:-build-trainers} (exits on a failed build), installs the
# Python package (or falls back to PYTHONPATH=python) and exports
# FRAGCTL_LIBRARY. Sets `python` and `build`.
setup_name=$1
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
  # peft and timm: only the lora and vit jobs need them
  "$python" -c "import peft, timm; print('peft', peft.__version__, 'timm', timm.__version__)"
} 2>&1 | tee "$out/$setup_name-machine.txt"

build=${FRAGCTL_BUILD_DIR:-build-trainers}
echo "building libfragctl.so and libfragctl_preload.so in $build ..."
if ! { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFRAGCTL_BUILD_TESTS=OFF \
         -DFRAGCTL_BUILD_BENCHMARKS=OFF -DFRAGCTL_WERROR=OFF \
       && cmake --build "$build" --target fragctl fragctl_preload fragctl_cli -j "$(nproc)"; } > "$out/$setup_name-build.log" 2>&1; then
  grep -E "error|FAILED" "$out/$setup_name-build.log" | head -30
  echo "build failed; see $out/$setup_name-build.log"
  exit 1
fi
echo "built in $(( $(date +%s) - start )) s"

# The documented install; a plain PYTHONPATH if pip cannot install here.
if "$python" -m pip install --no-deps --no-index --force-reinstall --quiet ./python > "$out/$setup_name-pip.log" 2>&1; then
  echo "python package: pip install ./python ok"
else
  echo "python package: pip install failed (see $setup_name-pip.log); using PYTHONPATH=python"
  export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
fi
export FRAGCTL_LIBRARY=$PWD/$build/libfragctl.so

