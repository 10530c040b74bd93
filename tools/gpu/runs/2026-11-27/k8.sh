#!/usr/bin/env bash
# One GPU: this session's red-team fixes on the GPU machine, from the wheel alone (built on the
# project's machine with tools/wheel.sh, carried in dist/, no devkit):
#   1. the install proof (tools/gpu/wheel.sh: torch_checks under enable() and `fragctl run`, gpt2m);
#   2. CUDA IPC through PyTorch (benchmarks/interop/ipc_share.py) with fragctl's arena and caching
#      producers (fragctl_export_block now checks that the range is live) and its negative control;
#   3. Ctrl-C in Python under `fragctl run` (LD_PRELOAD, a report asked for) once CUDA memory is
#      held: Python's own SIGINT handler must be in place and KeyboardInterrupt raised.
# Results: $OUT/k8.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/k8; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
(OUT=$L timeout 300 bash tools/gpu/wheel.sh 2>&1 | cut -c1-300 | tail -30)
echo "[wheel proof done at $(( $(date +%s) - start )) s]"
site=/tmp/fragctl-site  # where tools/gpu/wheel.sh installed the wheel
export PYTHONPATH=$site PATH=$site/bin:$PATH FRAGCTL_TORCH_BUILD_DIR=/tmp/fragctl-native
unset FRAGCTL_LIBRARY
for pair in "arena fragctl" "caching fragctl" "arena native"; do
  set -- $pair
  timeout 200 python3 benchmarks/interop/ipc_share.py --producer $1 --consumer $2 > $L/ipc-$1-$2.json 2> $L/ipc-$1-$2.err
  echo "ipc $1 -> $2: rc=$? $(tail -c 400 $L/ipc-$1-$2.json | tr '\n' ' ')"
done
timeout 200 python3 benchmarks/interop/ipc_share.py --producer arena --consumer fragctl --control > $L/ipc-control.json 2> $L/ipc-control.err
echo "ipc control (must fail): rc=$? $(tail -c 300 $L/ipc-control.json | tr '\n' ' ')"
echo "[ipc done at $(( $(date +%s) - start )) s]"
cat > $L/ctrl_c.py <<'PY'
import os, signal, time, torch
x = torch.empty(1 << 20, device="cuda")  # the first CUDA allocation: fragctl's allocator exists
print("python's handler:", signal.getsignal(signal.SIGINT) is signal.default_int_handler, flush=True)
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(2)
    print("no KeyboardInterrupt")
except KeyboardInterrupt:
    print("KeyboardInterrupt")
finally:
    print("finally ran")
PY
(cd $L && timeout 120 python3 -m fragctl run --report $L/ctrl_c.report.json -- python3 $L/ctrl_c.py > $L/ctrl_c.out 2> $L/ctrl_c.err; echo "rc=$?" >> $L/ctrl_c.out)
echo "ctrl-c under fragctl run: $(tr '\n' ' ' < $L/ctrl_c.out) report: $(ls $L/ctrl_c.report.json 2>/dev/null)"
grep -v "^\s*$" $L/ctrl_c.err | head -5
tar -czf $OUT/k8.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
