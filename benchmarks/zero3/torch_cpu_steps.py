"""Step time of fragctl.torch.zero3.shard on CPU ranks (gloo, the sim
backend): the model of tests/torch/test_zero3.py (a 4-layer MLP with a frozen
layer; --width widens its hidden layers), SGD with momentum, each rank a
process. Prints the median and the quartiles of the step times of rank 0 over
--steps steps after --warmup, in milliseconds, the CPU time rank 0's process
spent per step (all its threads: steadier than wall time on a shared
machine), and the collectives per step.
Used to measure what a change to the Python collectives costs per step
(issue 31: publishing each rank's progress for hang reports): run it with
PYTHONPATH at each tree, on the same machine, alternately.

    FRAGCTL_LIBRARY=build/libfragctl.so PYTHONPATH=python /usr/bin/python3 benchmarks/zero3/torch_cpu_steps.py
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time


def model(torch, width):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.GELU(), torch.nn.Linear(width, width),
                            torch.nn.GELU(), torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Linear(width, 4))
    m[2].weight.requires_grad_(False)
    return m


def rank_main(rank, world, directory, args):
    import torch
    import torch.distributed as dist
    import fragctl.torch.zero3 as zero3
    dist.init_process_group("gloo", init_method="file://" + os.path.join(directory, "store"), rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=args.group_timeout))
    config = {"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 100,
                                    "stage3_prefetch_bucket_size": 2000, "stage3_max_live_parameters": 1e8}}
    sharded = zero3.shard(model(torch, args.width), config=config)
    optimizer = torch.optim.SGD(sharded.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(args.rows, 16, generator=torch.Generator().manual_seed(rank))
    times = []
    cpu = 0.0
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            cpu = time.process_time()
        start = time.perf_counter()
        sharded(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    cpu = time.process_time() - cpu  # this process's threads (gloo's, fragctl's publisher) included
    stats = sharded.stats()
    if rank == 0:
        steady = sorted(times[args.warmup:])
        q = statistics.quantiles(steady, n=4)
        print(json.dumps({"width": args.width, "steps": args.steps, "median_ms": 1e3 * statistics.median(steady),
                          "q1_ms": 1e3 * q[0], "q3_ms": 1e3 * q[2],
                          "cpu_ms_per_step": 1e3 * cpu / args.steps,
                          "collectives_per_step": (stats["gathers"] + stats["reduce_scatters"]) / stats["steps"]
                          if stats["steps"] else None}), flush=True)
    dist.barrier()
    sharded.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=64, help="hidden width (tests/torch: 64)")
    parser.add_argument("--rows", type=int, default=8, help="rows per rank per step")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--group-timeout", type=float, default=60.0, help="init_process_group's timeout, seconds")
    args = parser.parse_args()
    import multiprocessing
    directory = tempfile.mkdtemp(prefix="fragctl-zero3-steps-")
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=rank_main, args=(r, args.world, directory, args)) for r in range(args.world)]
    for p in processes:
        p.start()
    for p in processes:
        p.join()
    sys.exit(max(abs(p.exitcode or 0) for p in processes))


if __name__ == "__main__":
    main()
