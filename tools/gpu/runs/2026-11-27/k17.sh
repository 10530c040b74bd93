#!/usr/bin/env bash
# One GPU: the code of 7d767eb (check_free; frees that wait for other streams) from the wheel
# alone (no devkit, no build): the install proof (tools/gpu/wheel.sh: torch_checks under enable()
# and fragctl run, record_stream included, torchrun, gpt2m), then the three record_stream cases of
# stream_use_adaptor_test on the cuda backend through the C API, a side stream kept busy by a
# kernel (torch.cuda._sleep): a double free of a block whose free waits, record_stream of a freed
# pointer, a wrong-size free of a recorded block. Results: $OUT/k17.tar.gz.
set -uo pipefail
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
echo "commit: $(cat .carry/commit)"
M=/tmp/k17; rm -rf $M; mkdir -p $M
(OUT=$M timeout 300 bash tools/gpu/wheel.sh 2>&1 | cut -c1-300 | tail -25)
el "wheel proof done"
export PYTHONPATH=/tmp/fragctl-site
timeout 120 python3 - > $M/record_stream.out 2> $M/record_stream.err <<'PY'
import ctypes, json, torch, fragctl
from fragctl._capi import library
lib = library()
rs = lib.fragctl_record_stream
rs.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
rs.restype = ctypes.c_int
MiB = 1 << 20
out = {}
a = fragctl.Allocator("arena", backend="cuda")
main = torch.cuda.current_stream().cuda_stream
side_stream = torch.cuda.Stream()
side = side_stream.cuda_stream
def busy():
    with torch.cuda.stream(side_stream):
        torch.cuda._sleep(2_000_000_000)  # about a second of GPU time on the side stream
def record(p):
    return a._call(rs, p, side)
def misuse():
    c = a.stats()["misuse"] if "misuse" in a.stats() else {}
    return c
# 1. a double free of a block whose free waits for the side stream
busy()
p = a.malloc(64 * MiB, main)
out["record"] = record(p)
a.free(p, 64 * MiB, main)
try:
    a.free(p, 64 * MiB, main)
    out["double_free"] = "accepted"
except Exception as e:
    out["double_free"] = type(e).__name__ + ": " + str(e)[:160]
q = a.malloc(64 * MiB, main)
out["q_is_p_while_side_busy"] = q == p
torch.cuda.synchronize()
r = a.malloc(64 * MiB, main)
out["r_is_q"] = r == q
a.free(q, 64 * MiB, main); a.free(r, 64 * MiB, main)
# 2. record_stream of a freed pointer records nothing
busy()
x = a.malloc(32 * MiB, main); a.free(x, 32 * MiB, main)
out["record_freed"] = record(x)
y = a.malloc(32 * MiB, main)
out["y_is_x"] = y == x
a.free(y, 32 * MiB, main)
z = a.malloc(32 * MiB, main)
out["z_is_y_while_side_busy (nothing held back)"] = z == y
a.free(z, 32 * MiB, main)
# 3. a wrong-size free of a recorded block
w = a.malloc(16 * MiB, main)
record(w)
try:
    a.free(w, 8 * MiB, main)
    out["wrong_size"] = "accepted"
except Exception as e:
    out["wrong_size"] = type(e).__name__ + ": " + str(e)[:160]
torch.cuda.synchronize()
a.release_cached()
out["allocated_at_end"] = a.stats()["pool"]["allocated"] if "pool" in a.stats() else None
out["ok"] = (out["double_free"] != "accepted" and not out["q_is_p_while_side_busy"] and not out["r_is_q"]
             and out["y_is_x"] and out["z_is_y_while_side_busy (nothing held back)"] and out["wrong_size"] != "accepted")
print(json.dumps(out, indent=1))
PY
echo "record_stream cases exit $?"; cat $M/record_stream.out; grep -v "^\s*$" $M/record_stream.err | cut -c1-300 | head -8
tar -czf $OUT/k17.tar.gz -C $M . 2>/dev/null; el "done"
