#!/usr/bin/env python3
"""A hung collective in fragctl's own NCCL communicator on two GPUs (issue
31, deliverable 1, the C++ side): does the waiting rank name the rank that
did not come, from the progress files beside the NCCL id file, and write the
hang into its report?

Two processes, one per GPU, each a ZeRO-3 manager made through the C API
(fragctl_zero3_create with "nccl:rank=R,size=2,id_file=...,timeout_ms=T" on
a caching allocator that writes report.R.json): every step fetches and
releases every block, then synchronizes. Rank 1 stops before step
--stop-step (it sleeps); rank 0's synchronize must fail with
FRAGCTL_ERROR_TIMEOUT naming rank 1, the collective (all_gather #N) and the
block within T + 2 s of that step's start; its report must hold the hang
(missing [1]); both processes end (rank 1 is ended by this script after
rank 0's result, as a launcher ends the others when one fails). No PyTorch.
Prints one JSON line; exits 0 when every check passed.

    NCCL_NVLS_ENABLE=0 FRAGCTL_LIBRARY=build-gpu/libfragctl.so PYTHONPATH=python \\
      FRAGCTL_NCCL_LIBRARY=/path/to/libnccl.so.2 python3 benchmarks/zero3/nccl_cpp_hang.py [--timeout-ms 8000]
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time

from nccl_hang import first_hang  # this script's folder is on sys.path


class Param(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("elements", ctypes.c_size_t), ("element_bytes", ctypes.c_size_t),
                ("trainable", ctypes.c_int)]


def worker(args):
    import fragctl
    from fragctl import _capi
    lib = _capi.library()
    lib.fragctl_zero3_create.restype = ctypes.c_int
    lib.fragctl_zero3_create.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                         ctypes.POINTER(ctypes.c_void_p)]
    rank = args.rank
    allocator = fragctl.Allocator("caching", backend="cuda", device=rank,
                                  report=os.path.join(args.out, "report.%d.json" % rank))
    spec = "nccl:rank=%d,size=2,id_file=%s,timeout_ms=%d" % (rank, os.path.join(args.out, "nccl.id"), args.timeout_ms)
    z = ctypes.c_void_p()
    status = allocator._call(lambda h: lib.fragctl_zero3_create(h, h, b"", spec.encode(), ctypes.byref(z)))

    def check(status, what):
        if status != 0:
            message = lib.fragctl_last_error().decode(errors="replace")
            print(json.dumps({"rank": rank, "failed": what, "status": status, "message": message,
                              "at": time.time()}), flush=True)
            sys.exit(3)

    check(status, "create")
    for b in range(4):
        params = (Param * 1)(Param(("w%d" % b).encode(), 1 << 22, 2, 1))
        check(lib.fragctl_zero3_add_block(z, ("layer.%d" % b).encode(), ctypes.cast(params, ctypes.c_void_p), 1),
              "add_block")
    check(lib.fragctl_zero3_start(z), "start")
    for step in range(args.steps):
        if step == args.stop_step:
            print(json.dumps({"rank": rank, "stop_step_at": time.time()}), flush=True)
            if rank == 1:
                time.sleep(3600)  # stops before the step's first collective
        for b in range(4):
            check(lib.fragctl_zero3_fetch(z, b, None, None, None, 0), "fetch %d" % b)
            check(lib.fragctl_zero3_release(z, b, None), "release %d" % b)
        check(lib.fragctl_zero3_synchronize(z), "synchronize")
    print(json.dumps({"rank": rank, "done": args.steps}), flush=True)
    return 0


def check(args):
    os.makedirs(args.out, exist_ok=True)
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    procs = []
    for r in (0, 1):
        with open(os.path.join(args.out, "rank%d.err" % r), "w") as err:
            procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", "--rank", str(r),
                                           "--out", args.out, "--timeout-ms", str(args.timeout_ms), "--steps",
                                           str(args.steps), "--stop-step", str(args.stop_step)],
                                          env=env, stdout=subprocess.PIPE, stderr=err, text=True))
    limit = args.timeout_ms / 1000 + 60
    try:
        out0, _ = procs[0].communicate(timeout=limit)
        rc0 = procs[0].returncode
    except subprocess.TimeoutExpired:
        procs[0].kill()
        out0, rc0 = procs[0].communicate()[0], None
    procs[1].kill()  # the launcher's part: the stopped rank is ended once rank 0 failed
    procs[1].wait(10)
    lines = [json.loads(line) for line in out0.splitlines() if line.startswith("{")]
    stop = next((line["stop_step_at"] for line in lines if "stop_step_at" in line), None)
    failed = next((line for line in lines if "failed" in line), None)
    hang = first_hang(os.path.join(args.out, "report.0.json"))
    message = failed["message"] if failed else ""
    result = {"timeout_ms": args.timeout_ms, "rank0_rc": rc0, "failed": failed and failed["failed"],
              "status": failed and failed["status"], "message": message, "hang": hang,
              "seconds_to_error": round(failed["at"] - stop, 2) if failed and stop else None}
    result["checks"] = {
        "TIMEOUT naming rank 1, the collective and the block": (bool(failed) and failed["status"] == _timeout()
                                                                and "rank 1 has not entered it" in message
                                                                and "all_gather #" in message and "layer." in message),
        "in rank 0's report, missing [1]": bool(hang) and hang.get("missing") == [1],
        "within the timeout + 2 s": (result["seconds_to_error"] is not None
                                     and result["seconds_to_error"] <= args.timeout_ms / 1000 + 2),
        "rank 0 ended by itself": rc0 is not None,
    }
    if not all(result["checks"].values()):
        for r in (0, 1):
            with open(os.path.join(args.out, "rank%d.err" % r), errors="replace") as f:
                result["rank%d_err_tail" % r] = f.read()[-2000:]
    print(json.dumps(result))
    return 0 if all(result["checks"].values()) else 1


def _timeout():
    from fragctl import _capi
    return _capi.TIMEOUT


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout-ms", type=int, default=8000, help="the communicator's deadline")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--stop-step", type=int, default=2, help="rank 1 stops before this step")
    parser.add_argument("--out", default=None, help="folder for the id file, records, reports and logs")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    args.out = os.path.abspath(args.out or tempfile.mkdtemp(prefix="fragctl-nccl-cpp-hang-"))
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
