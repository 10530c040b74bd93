#!/usr/bin/env bash
# One GPU: the session's last code from the wheel alone (built by tools/test.sh on the project's
# machine, carried in dist/, no devkit): the install proof (tools/gpu/wheel.sh), then an uncaught
# Ctrl-C in Python holding CUDA memory, under `fragctl run` and under enable() with FRAGCTL_REPORT:
# CPython ends itself by SIGINT; the report must still be written (fragctl's handler on the signal,
# the package's atexit flush where `import fragctl` saw outputs asked for). Results: $OUT/k9.tar.gz.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
L=/tmp/k9; rm -rf $L; mkdir -p $L
echo "commit: $(cat .carry/commit 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
(OUT=$L timeout 300 bash tools/gpu/wheel.sh 2>&1 | cut -c1-300 | tail -24)
echo "[wheel proof done at $(( $(date +%s) - start )) s]"
site=/tmp/fragctl-site
export PYTHONPATH=$site PATH=$site/bin:$PATH FRAGCTL_TORCH_BUILD_DIR=/tmp/fragctl-native
unset FRAGCTL_LIBRARY
cat > $L/uncaught.py <<'PY'
import os, signal, sys, time, torch
if sys.argv[1] == "enable":
    import fragctl.torch
    fragctl.torch.enable()
x = torch.empty(1 << 20, device="cuda")
os.kill(os.getpid(), signal.SIGINT)
time.sleep(5)
PY
(cd $L && timeout 120 python3 -m fragctl run --report $L/run.report.json -- python3 $L/uncaught.py run > $L/run.out 2>&1; echo "rc=$?" >> $L/run.out)
(cd $L && FRAGCTL_REPORT=$L/enable.report.json timeout 120 python3 $L/uncaught.py enable > $L/enable.out 2>&1; echo "rc=$?" >> $L/enable.out)
for r in run enable; do
  echo "uncaught ctrl-c ($r): $(tail -1 $L/$r.out) $(grep -c KeyboardInterrupt $L/$r.out) KeyboardInterrupt line(s); report: $(python3 -c "
import json, sys
try:
    d = json.load(open('$L/$r.report.json')); print(d['reason'], [(a['allocator'], a['allocations']) for a in d['allocators']])
except Exception as e: print('none:', e)")"
done
tar -czf $OUT/k9.tar.gz -C $L . 2>/dev/null; echo "done in $(( $(date +%s) - start )) s"
