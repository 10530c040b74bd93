"""NCCL collectives on fragctl memory (docs/interop.md, "Memory pools of
other libraries" and "NCCL buffer registration"; issue 30).

Run with torchrun on two GPUs, one mode per launch (the modes differ in
what must be set before CUDA and the process group start):
    torchrun --nproc-per-node 2 benchmarks/interop/nccl_register.py MODE OUT.json
  native        PyTorch's allocator
  fragctl       fragctl.torch.enable("arena")
  native-reg / fragctl-reg
                the same with TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1
                (set by the caller): every segment the allocator reports is
                registered with ncclCommRegister
  native-pool / fragctl-pool
                torch.distributed's recipe: a MemPool over the NCCL backend's
                mem_allocator (ncclMemAlloc), register_mem_pool, tensors
                allocated inside the pool
Extra options: map_chunk=SIZE for fragctl's arena (largest handle).
Each mode checks all_reduce and all_gather results against the exact
expected values (integers in float32), and writes rank 0's digest of the
outputs and the bus bandwidth at 1 MiB, 64 MiB and 1 GiB to OUT.json.
"""
import hashlib
import json
import os
import sys
import time

SIZES = [1 << 20, 64 << 20, 1 << 30]


def main():
    mode, out = sys.argv[1], sys.argv[2]
    options = dict(a.split("=", 1) for a in sys.argv[3:])
    import torch
    fragctl_mode = mode.startswith("fragctl")
    if fragctl_mode:
        import fragctl.torch
        fragctl.torch.enable("arena", **options)
    import torch.distributed as dist
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    # Memory that exists before the communicator: registered from the
    # allocator's snapshot when the communicator is created (with the hook).
    early = torch.full(((3 << 20) // 4,), float(rank + 1), device=device)
    dist.init_process_group("nccl", device_id=device)
    pool = None
    if mode.endswith("-pool"):
        backend = dist.group.WORLD._get_backend(device)
        pool = torch.cuda.MemPool(backend.mem_allocator)
        backend.register_mem_pool(pool)

    def alloc(n, dtype=torch.float32):
        if pool is None:
            return torch.empty(n, dtype=dtype, device=device)
        with torch.cuda.use_mem_pool(pool):
            return torch.empty(n, dtype=dtype, device=device)

    digest = hashlib.sha256()
    dist.all_reduce(early)
    exact = bool(torch.equal(early, torch.full_like(early, float(sum(range(1, world + 1))))))
    del early
    table = []
    for size in SIZES:
        n = size // 4
        # all_reduce: rank r holds (i % 1024) + r; the sum is exact in float32.
        x = alloc(n)
        base = torch.arange(n, device=device, dtype=torch.int64).remainder_(1024).to(torch.float32)
        x.copy_(base + rank)
        dist.all_reduce(x)
        expected = base * world + sum(range(world))
        exact &= bool(torch.equal(x, expected))
        digest.update(x.cpu().numpy().tobytes()[:1 << 20])
        # all_gather_into_tensor: each rank's shard is (i % 1024) + 1000 * r.
        shard = alloc(n // world)
        shard.copy_(torch.arange(n // world, device=device).remainder_(1024).to(torch.float32) + 1000 * rank)
        gathered = alloc(n)
        dist.all_gather_into_tensor(gathered, shard)
        want = torch.cat([torch.arange(n // world, device=device).remainder_(1024).to(torch.float32) + 1000 * r
                          for r in range(world)])
        exact &= bool(torch.equal(gathered, want))
        digest.update(gathered.cpu().numpy().tobytes()[:1 << 20])
        del base, expected, want
        # Bus bandwidth (nccl-tests' definitions).
        iters = 20 if size <= (64 << 20) else 6
        row = {"bytes": size}
        for name, call, factor in (
                ("all_reduce", lambda: dist.all_reduce(x), 2 * (world - 1) / world),
                ("all_gather", lambda: dist.all_gather_into_tensor(gathered, shard), (world - 1) / world)):
            for _ in range(3):
                call()
            torch.cuda.synchronize()
            dist.barrier()
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                call()
            stop.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(stop) / 1000 / iters
            row[name + "_busbw_GBps"] = round(size / seconds * factor / 1e9, 1)
        table.append(row)
        del x, shard, gathered
    result = {"mode": mode, "options": options, "rank": rank, "exact": exact, "digest": digest.hexdigest()[:16],
              "table": table, "hook": os.environ.get("TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK", "0")}
    if fragctl_mode:
        import fragctl.torch
        result["forwarded"] = fragctl.torch.forwarded_pools()
        stats = torch.cuda.memory_stats()
        result["fragctl_reserved_bytes"] = stats.get("reserved_bytes.all.current")
    if pool is not None:
        try:
            result["pool_segments"] = len(torch.cuda.memory.memory_snapshot(pool.id))
        except Exception as e:  # a torch whose memory_snapshot takes no pool
            result["pool_segments"] = repr(e)[:200]
    if pool is not None:
        dist.group.WORLD._get_backend(device).deregister_mem_pool(pool)
        del pool
        pool = None
        if fragctl_mode:  # the MemPool's destructor gave its blocks back to X
            result["forwarded_after_del"] = fragctl.torch.forwarded_pools()
    gathered_results = [None] * world
    dist.all_gather_object(gathered_results, result)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(gathered_results, f, indent=1)
        print(json.dumps({"mode": mode, "exact": all(r["exact"] for r in gathered_results),
                          "digest": result["digest"], "table": table,
                          **{k: result[k] for k in ("forwarded", "forwarded_after_del") if k in result}}))
    dist.destroy_process_group()
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
