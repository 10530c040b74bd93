"""Checks the split of the device memory that is not fragctl's on real GPUs
(docs/reports.md, "The device memory that is not fragctl's"): NVML's
per-process figures, the context, a PyTorch NCCL process group attributed
with fragctl.torch.nccl_memory, and the split in the OOM message. One
process per GPU:

    OUT=/tmp/memsplit NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
      FRAGCTL_REPORT='/tmp/memsplit/run.{rank}.json' torchrun --nproc-per-node 2 tools/gpu/memsplit_check.py
    fragctl report /tmp/memsplit/run.*.json

Prints each rank's split and one "check ... ok|FAILED" line per claim;
exits 1 when a check failed.
"""
import os
import subprocess
import sys

import torch
import torch.distributed as dist

import fragctl
import fragctl.torch

MiB = 1 << 20


def main() -> int:
    rank = int(os.environ.get("RANK", "0"))
    device = int(os.environ.get("LOCAL_RANK", "0"))
    fragctl.torch.enable()  # before anything touches CUDA (set_device does)
    torch.cuda.set_device(device)
    held = [torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")]  # the allocator exists from here
    allocator = fragctl.default_allocator(device)
    before = allocator.device_memory_split()
    with fragctl.torch.nccl_memory("world", device=device):
        dist.init_process_group("nccl")
        x = torch.ones(1 << 20, device="cuda")
        dist.all_reduce(x)
        torch.cuda.synchronize()
    after = allocator.device_memory_split()
    smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    print("rank %d before the group: %s" % (rank, before))
    print("rank %d after the group:  %s" % (rank, after))
    print("rank %d nvidia-smi (pid, MiB): %s" % (rank, " | ".join(smi.split("\n"))))
    failed = 0

    def check(what: str, ok: bool) -> None:
        nonlocal failed
        failed += 0 if ok else 1
        print("rank %d check %s: %s" % (rank, what, "ok" if ok else "FAILED"))

    check("NVML per-process figures", after["per_process"])
    check("context between 100 MiB and 4 GiB", 100 * MiB < after["context"] < 4096 * MiB)
    check("the NCCL group attributed (> 0)", after["nccl"] > 0)
    ours = (after["fragctl"] + after["context"] + after["nccl"] + after["graph_pools"] + after["other_fragctl"]
            + after["other"])
    # `other` also holds device memory no process is charged with (the driver's).
    print("rank %d used but charged to no process: %d MiB" % (rank, (ours - after["this_process"]) // MiB))
    check("the parts cover this process", ours >= after["this_process"])
    mine = [line for line in smi.splitlines() if line.split(",")[0].strip() == str(os.getpid())]
    if mine:
        check("this process agrees with nvidia-smi (within 64 MiB)",
              abs(int(mine[0].split(",")[1]) * MiB - after["this_process"]) <= 64 * MiB)
    try:
        torch.empty(int(torch.cuda.mem_get_info()[1] * 2), dtype=torch.uint8, device="cuda")
        check("an impossible allocation fails", False)
    except torch.cuda.OutOfMemoryError as e:
        print("rank %d OOM message: %s" % (rank, e))
        check("the OOM message carries the split", "device memory not fragctl's" in str(e) and "NCCL" in str(e))
    del held
    dist.barrier()
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
