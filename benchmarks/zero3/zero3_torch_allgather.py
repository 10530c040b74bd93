#!/usr/bin/env python3
"""All-gather bandwidth of torch.distributed.all_gather_into_tensor for the
shard sizes the ZeRO-3 driver gathers, timed the same way (one pass gathers
every block once, back to back on one stream; wall time between
synchronizations). Launched by torchrun, one process per GPU; rank 0 writes
the JSON result.

    torchrun --standalone --nproc_per_node=2 zero3_torch_allgather.py SIZES.json OUT.json [ITERATIONS]
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> int:
    sizes_path, out_path = sys.argv[1], sys.argv[2]
    iterations = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    with open(sizes_path) as f:
        shard_sizes = json.load(f)  # bytes each rank contributes, per block
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    world = dist.get_world_size()
    largest = max(shard_sizes)
    send = torch.empty(largest // 2, dtype=torch.bfloat16, device="cuda").random_()
    recv = torch.empty(world * (largest // 2), dtype=torch.bfloat16, device="cuda")

    def one_pass():
        for size in shard_sizes:
            n = size // 2
            dist.all_gather_into_tensor(recv[: world * n], send[:n])

    one_pass()
    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(iterations):
        one_pass()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    gathered = sum(shard_sizes) * world * iterations
    algbw = gathered / seconds
    result = {
        "world_size": world,
        "torch": torch.__version__,
        "nccl": ".".join(str(v) for v in torch.cuda.nccl.version()),
        "iterations": iterations,
        "seconds": seconds,
        "algbw_gbps": algbw / 1e9,
        "busbw_gbps": algbw * (world - 1) / world / 1e9,
    }
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(result, f, indent=2)
        print(f"torch all_gather_into_tensor: busbw {result['busbw_gbps']:.1f} GB/s over {len(shard_sizes)} "
              f"blocks x {iterations} passes (NCCL {result['nccl']})")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
