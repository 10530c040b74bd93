#!/usr/bin/env python3
"""A hung collective on two GPUs (NCCL): does fragctl name the rank that did
not come before PyTorch's NCCL watchdog, and do both processes end?
(issue 31, deliverable 1).

Two ranks (torchrun, one process per GPU) train fragctl.torch.zero3.shard of
a small bf16 MLP on allocators that write their JSON reports into the run's
folder; rank 1 stops before step --stop-step's forward (it sleeps, as a rank
stuck in data loading would) and rank 0 goes on, logging the loss every step
(a CUDA synchronization behind the hung all-gather). Checked, after torchrun
returns:

  - rank 0's stderr has fragctl's line naming rank 1, the collective
    (all_gather #N) and the block, written within the group's timeout + 2 s
    of step --stop-step's start;
  - rank 0's report holds the same hang under "hangs", missing [1];
  - torchrun ended within the group's timeout + 90 s and no rank's process
    is left (no hang, no orphan).

Prints one JSON line with the figures and exits 0 when every check passed.

    NCCL_NVLS_ENABLE=0 FRAGCTL_LIBRARY=build-gpu/libfragctl.so PYTHONPATH=python \\
      python3 benchmarks/zero3/nccl_hang.py [--timeout 20] [--out DIR]
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time


def worker(args):
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    err = os.open(os.path.join(args.out, "rank%d.err" % rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(err, 2)
    with open(os.path.join(args.out, "rank%d.pid" % rank), "w") as f:
        f.write(str(os.getpid()))
    import torch
    import torch.distributed as dist
    import fragctl
    import fragctl.torch.zero3 as zero3
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank),
                            timeout=datetime.timedelta(seconds=args.timeout))
    allocator = fragctl.Allocator("caching", backend="cuda", device=local_rank,
                                  report=os.path.join(args.out, "report.%d.json" % rank))
    torch.manual_seed(0)
    layers = []
    for _ in range(6):
        layers += [torch.nn.Linear(2048, 2048), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).to(device="cuda", dtype=torch.bfloat16)
    sharded = zero3.shard(model, allocator=allocator)
    opt = torch.optim.SGD(sharded.parameters(), lr=1e-3)
    x = torch.randn(64, 2048, device="cuda", dtype=torch.bfloat16)
    for step in range(args.steps):
        if step == args.stop_step:
            with open(os.path.join(args.out, "rank%d.stop_step" % rank), "w") as f:
                f.write(repr(time.time()))
            if rank == 1:
                time.sleep(10 * args.timeout + 600)  # stops before the step's first collective
        loss = sharded(x).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print("rank %d step %d loss %.6f" % (rank, step, loss.item()), file=sys.stderr, flush=True)
    return 0


def first_hang(path):
    """The first record under "hangs" of the JSON report at `path`, or None."""
    try:
        with open(path) as f:
            hangs = json.load(f).get("hangs", [])
    except (OSError, ValueError):
        return None
    return hangs[0] if hangs else None


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (not reaped yet) is not running.
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def check(args):
    os.makedirs(args.out, exist_ok=True)
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               os.path.abspath(__file__), "--worker", "--out", args.out, "--timeout", str(args.timeout),
               "--steps", str(args.steps), "--stop-step", str(args.stop_step)]
    started = time.monotonic()
    limit = args.timeout + 90  # the watchdog, else fragctl (END_GRACE_S after the timeout), ends rank 0
    try:
        run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=limit)
        torchrun_rc, torchrun_tail = run.returncode, (run.stdout + run.stderr)[-3000:]
    except subprocess.TimeoutExpired as e:
        torchrun_rc, torchrun_tail = None, str(e)
    took = time.monotonic() - started
    time.sleep(2)  # let the workers torchrun signalled finish ending
    orphans = []
    for rank in (0, 1):
        try:
            with open(os.path.join(args.out, "rank%d.pid" % rank)) as f:
                pid = int(f.read())
        except (OSError, ValueError):
            continue
        if alive(pid):
            orphans.append(pid)
            os.kill(pid, 9)
    result = {"group_timeout_s": args.timeout, "torchrun_rc": torchrun_rc, "torchrun_s": round(took, 1),
              "orphans": orphans, "checks": {}}
    err = ""
    if os.path.exists(os.path.join(args.out, "rank0.err")):
        with open(os.path.join(args.out, "rank0.err"), errors="replace") as f:
            err = f.read()
    lines = [line for line in err.splitlines() if line.startswith("[fragctl] zero3 rank 0:")]
    result["message"] = lines[0] if lines else None
    stop_at = None
    if os.path.exists(os.path.join(args.out, "rank0.stop_step")):
        with open(os.path.join(args.out, "rank0.stop_step")) as f:
            stop_at = float(f.read())
    hang = result["hang"] = first_hang(os.path.join(args.out, "report.0.json"))
    if hang and stop_at:
        result["seconds_to_hang_record"] = round(hang["time_unix_s"] - stop_at, 2)
    message = result["message"] or ""
    result["checks"] = {
        "names rank 1, the collective and the block": ("rank 1 has not entered it" in message
                                                       and "all_gather #" in message and "block " in message),
        "in rank 0's report, missing [1]": bool(hang) and hang.get("missing") == [1],
        "within the group's timeout + 2 s": ("seconds_to_hang_record" in result
                                             and result["seconds_to_hang_record"] <= args.timeout + 2),
        "torchrun ended": torchrun_rc is not None,
        "no orphan": not orphans,
    }
    if not all(result["checks"].values()):
        result["torchrun_tail"] = torchrun_tail
        result["rank0_err_tail"] = err[-3000:]
    print(json.dumps(result))
    return 0 if all(result["checks"].values()) else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=20.0, help="the process group's timeout, seconds")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--stop-step", type=int, default=2, help="rank 1 stops before this step's forward")
    parser.add_argument("--out", default=None, help="folder for the ranks' stderr and reports (default: a new one)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    args.out = os.path.abspath(args.out or tempfile.mkdtemp(prefix="fragctl-nccl-hang-"))
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
