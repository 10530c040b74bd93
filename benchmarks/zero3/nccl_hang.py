"""A rank that stops inside fragctl.torch.zero3.shard's training (issue 31,
deliverable 1 on NCCL): what the waiting rank says, and when.

Two ranks (one process per GPU over NCCL; gloo on CPU ranks), a small Llama
(or the torch.nn decoder of benchmarks/services/workload.py) sharded by
zero3.shard after fragctl.torch.enable("arena") (on GPUs), group timeout
--group-timeout seconds. Rank 1 stops before step 2's forward: it sleeps
past the group's timeout and then exits, as a rank stuck in a data loader
or a debugger would look to the others. Rank 0 goes on into step 2 and
waits in the first collective. Expected (the issue's target): rank 0 raises
fragctl.torch.zero3.CollectiveTimeoutError naming rank 1, the collective
and the block, within the group's timeout plus 2 s, and both processes
exit. The parent records what happened: rank 0's exception (type, message,
seconds from its step-2 forward to the raise) or, if rank 0 died without
one (PyTorch's NCCL watchdog aborts the process), its exit code and the
last lines of its stderr; when each process ended; rank 1 is ended by the
parent 5 s after rank 0 ends, as torchrun ends the others.

    python3 benchmarks/zero3/nccl_hang.py --out DIR      (writes DIR/nccl_hang.json)
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import multi_gpu  # noqa: E402  (launch, free_port, NCCL_SAFE)

STOP_STEP = 1  # rank 1 stops before this step's forward (the second step)


def options(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--model", default="llama", choices=["llama", "torch"])
    p.add_argument("--group-timeout", type=float, default=20.0, help="init_process_group(timeout=) in seconds")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--intermediate", type=int, default=2816)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--port", type=int, default=29871)
    p.add_argument("--rank-job", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def write(path, record):
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)


def rank_job(args):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    path = os.path.join(args.out, "rank-%d.json" % rank)
    record = {"rank": rank, "pid": os.getpid(), "steps_done": 0}
    write(path, record)
    try:
        import datetime
        import torch
        import torch.distributed as dist
        import fragctl.torch
        import fragctl.torch.zero3 as zero3
        sys.path.insert(0, multi_gpu.SERVICES)
        import workload
        cuda = args.device == "cuda"
        if cuda:
            fragctl.torch.enable("arena")
            torch.cuda.set_device(rank)
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=args.group_timeout))
        model = workload.build_model(args, torch)
        sharded = zero3.shard(model, config={"stage": 3}, block_types=(type(model.model.layers[0]),))
        record["deadline_s"] = sharded._collectives.progress.deadline
        optimizer = torch.optim.AdamW(sharded.parameters(), lr=1e-4)
        data = workload.batches(args, torch, args.steps)
        for step, ids in enumerate(data):
            if step == STOP_STEP and rank == 1:
                record["stopped_at"] = time.time()
                write(path, record)
                time.sleep(args.group_timeout + 30)  # stops answering past every timeout
                record["woke_at"] = time.time()
                write(path, record)
                os._exit(3)
            record["forward_at"] = time.time()
            write(path, record)
            ids = ids.to(args.device)
            loss = sharded(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            record["last_loss"] = loss.item()
            record["steps_done"] = step + 1
            write(path, record)
    except BaseException as e:  # noqa: BLE001 (recorded for the parent)
        record["raised_at"] = time.time()
        record["error"] = {"type": type(e).__name__, "message": str(e)[:3000],
                           "is_collective_timeout": type(e).__name__ == "CollectiveTimeoutError"}
        for name in ("rank", "collective", "block", "sequence", "missing", "deadline", "group_timeout"):
            value = getattr(e, name, None)
            if value is not None:
                record["error"][name] = value if isinstance(value, (int, float, str, list)) else str(value)
        write(path, record)
        sys.stderr.write("rank %d: %s: %s\n" % (rank, type(e).__name__, e))
        sys.stderr.flush()
        os._exit(1)
    record["finished_at"] = time.time()
    write(path, record)
    os._exit(0)


def parent(args):
    os.makedirs(args.out, exist_ok=True)
    argv = [sys.executable, os.path.abspath(__file__), "--rank-job"]
    for name in ("out", "device", "model", "group_timeout", "layers", "hidden", "heads", "intermediate", "vocab",
                 "seq", "batch", "steps"):
        argv += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    logs = [open(os.path.join(args.out, "rank-%d.stderr" % r), "w") for r in range(2)]
    began = time.time()
    port = multi_gpu.free_port(args.port)
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), PYTHONUNBUFFERED="1", **multi_gpu.NCCL_SAFE)
        procs.append(subprocess.Popen(argv, env=env, stdout=logs[rank], stderr=subprocess.STDOUT))
    ended = [None, None]
    limit = began + args.group_timeout + 150  # start-up included
    while time.time() < limit and None in ended:
        for i, p in enumerate(procs):
            if ended[i] is None and p.poll() is not None:
                ended[i] = time.time()
        if ended[0] is not None and ended[1] is None and time.time() > ended[0] + 5:
            break  # torchrun ends the other ranks once one has failed
        time.sleep(0.1)
    killed = []
    for i, p in enumerate(procs):
        if p.poll() is None:
            p.kill()
            p.wait()
            ended[i] = time.time()
            killed.append(i)
    for f in logs:
        f.close()
    ranks = []
    for r in range(2):
        with open(os.path.join(args.out, "rank-%d.json" % r)) as f:
            ranks.append(json.load(f))
        with open(os.path.join(args.out, "rank-%d.stderr" % r), errors="replace") as f:
            lines = [line.rstrip() for line in f if line.strip() and not line.startswith("frame #")]
        ranks[r]["stderr_tail"] = lines[-25:]
        ranks[r]["exit_code"] = procs[r].returncode
        ranks[r]["ended_at"] = ended[r]
    r0, r1 = ranks
    result = {"device": args.device, "group_timeout_s": args.group_timeout, "killed_by_parent": killed, "ranks": ranks}
    if "forward_at" in r0 and r1.get("stopped_at"):
        result["rank0_ended_after_s"] = round(ended[0] - r0["forward_at"], 2)
        if "raised_at" in r0:
            result["rank0_raised_after_s"] = round(r0["raised_at"] - r0["forward_at"], 2)
    error = r0.get("error", {})
    message = error.get("message", "")
    result["verdict"] = {
        "collective_timeout_error": bool(error.get("is_collective_timeout")),
        "names_rank_1": "rank 1" in message,
        "names_collective": any(c in message for c in ("all_gather", "reduce_scatter")),
        "names_block": "block " in message,
        "within_group_timeout_plus_2s": result.get("rank0_raised_after_s", 1e9) <= args.group_timeout + 2,
        "both_exited": all(p.returncode is not None for p in procs),
        "rank1_ended_by_parent": 1 in killed,
    }
    write(os.path.join(args.out, "nccl_hang.json"), result)
    print(json.dumps({k: result[k] for k in ("verdict",)} | {k: result.get(k) for k in (
        "rank0_raised_after_s", "rank0_ended_after_s", "killed_by_parent")}, indent=1))
    print("rank 0 error: %s: %s" % (error.get("type"), message[:1500]))
    if not error:
        print("rank 0 exited %s without a Python exception; its stderr ends:\n  %s"
              % (r0["exit_code"], "\n  ".join(r0["stderr_tail"][-8:])))
    return 0


def main(argv=None):
    args = options(argv)
    for k, v in multi_gpu.NCCL_SAFE.items():
        os.environ[k] = v
    return rank_job(args) if args.rank_job else parent(args)


if __name__ == "__main__":
    sys.exit(main())
