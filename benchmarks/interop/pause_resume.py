"""Pause and resume on one GPU (docs/interop.md, "Pause and resume"; issue 30).

A trainer's state (a Llama decoder from a transformers config, random
weights, fp32, AdamW after one step: weights, gradients and optimizer state)
lives under fragctl.torch.enable("arena"). A CUDA graph is captured over
tensors of it. Then:

1. fragctl.torch.pause(keep="host"): device memory used, sampled with
   nvidia-smi from outside the process, must drop by at least 99% of
   fragctl's reserved bytes;
2. another process (plain PyTorch, no fragctl) allocates most of the freed
   memory, writes it and exits (the inference engine's turn);
3. fragctl.torch.resume(): every tensor byte-identical to a host copy taken
   before the pause, at the same address; the graph replays with the right
   result; training goes on.

With --region the trainer's state is made under
``with fragctl.torch.region("train"):`` and only that region pauses: a
tensor outside it stays usable and new allocations outside go on while the
region is paused; an allocation inside it is refused.

Prints one JSON line with the figures (time per GiB of pause and resume).
    python3 benchmarks/interop/pause_resume.py [--layers 24] [--hidden 2048] [--keep host|none] [--region]
"""
import argparse
import json
import os
import subprocess
import sys
import time


def device_used_mib(index):
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", str(index)],
                         capture_output=True, text=True, check=True).stdout
    return int(out.strip().splitlines()[0])


OTHER = r"""
import torch
free, _ = torch.cuda.mem_get_info()
n = free - (512 << 20)  # all the device has free, but a margin for this process's own needs
x = torch.empty(n, dtype=torch.uint8, device="cuda")
x.fill_(7)
torch.cuda.synchronize()
print(n, int(x[::4096].sum().item() == 7 * x[::4096].numel()))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--keep", default="host", choices=["host", "none"])
    ap.add_argument("--region", action="store_true")
    args = ap.parse_args()

    import torch
    import fragctl.torch
    fragctl.torch.enable("arena")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    dev = torch.cuda.current_device()
    cfg = LlamaConfig(hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4, num_hidden_layers=args.layers,
                      num_attention_heads=args.hidden // 128, num_key_value_heads=args.hidden // 128,
                      vocab_size=32000)
    import contextlib
    tag = "train" if args.region else None
    inside = (lambda: fragctl.torch.region(tag)) if args.region else contextlib.nullcontext
    with inside():
        model = LlamaForCausalLM(cfg).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ids = torch.randint(0, 32000, (2, 512), device="cuda")
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
    outside = torch.full((1 << 28,), 5.0, device="cuda") if args.region else None  # 1 GiB, not in the region

    # A CUDA graph over two of the model's tensors, captured before the pause.
    w = model.model.layers[0].mlp.down_proj.weight
    x = torch.randn(64, w.shape[1], device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            y = x @ w.t()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x @ w.t()
    graph.replay()
    expected = (x @ w.t()).cpu()

    tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters() if p.grad is not None]
    for state in opt.state.values():
        tensors += [t for t in state.values() if torch.is_tensor(t) and t.is_cuda]
    torch.cuda.synchronize()
    copies = [t.detach().cpu() for t in tensors]
    addresses = [t.data_ptr() for t in tensors]
    tensor_bytes = sum(t.numel() * t.element_size() for t in tensors)
    if args.region:  # what pauses is the region's allocator alone
        import ctypes
        from fragctl import Allocator, _native
        region_allocator = Allocator._wrap(ctypes.c_void_p(_native.load().region_allocator(tag, dev)))
        reserved = region_allocator.stats()["reserved_bytes"]["current"]
    else:
        reserved = torch.cuda.memory_reserved()
    used_before = device_used_mib(dev)
    free_before = torch.cuda.mem_get_info(dev)[0]

    t0 = time.perf_counter()
    fragctl.torch.pause(keep=args.keep, tag=tag)
    pause_s = time.perf_counter() - t0
    used_paused = device_used_mib(dev)
    dropped = (used_before - used_paused) * 2**20
    refused = None
    try:
        with inside():
            torch.empty(1 << 20, device="cuda")
    except Exception as e:  # allocation in what is paused is refused
        refused = type(e).__name__
    outside_ok = None
    if args.region:  # everything else goes on
        extra = torch.full((1 << 26,), 2.0, device="cuda")
        outside_ok = bool((outside == 5.0).all().item()) and bool((extra == 2.0).all().item())
        del extra

    # Another process takes all the device has free: more than was free before the pause only if
    # the paused memory really went back. Its own CUDA context and its 512 MiB margin (about 1 GiB
    # together) come out of what it can take, so a small job's check allows for them.
    other = subprocess.run([sys.executable, "-c", OTHER], capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
    words = other.stdout.split()
    other_bytes = int(words[-2]) if other.returncode == 0 and len(words) >= 2 else 0
    other_ok = other.returncode == 0 and words[-1:] == ["1"] and other_bytes + (1 << 30) > free_before + 0.9 * reserved

    t0 = time.perf_counter()
    fragctl.torch.resume(tag=tag)
    resume_s = time.perf_counter() - t0
    used_resumed = device_used_mib(dev)

    same_address = all(t.data_ptr() == a for t, a in zip(tensors, addresses))
    identical = sum(1 for t, c in zip(tensors, copies) if torch.equal(t.detach().cpu(), c))
    graph.replay()
    torch.cuda.synchronize()
    graph_ok = torch.equal(y.cpu(), expected)
    with inside():
        loss2 = model(input_ids=ids, labels=ids).loss
        loss2.backward()
        opt.step()
    torch.cuda.synchronize()

    gib = reserved / 2**30
    print(json.dumps({
        "gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__, "keep": args.keep, "region": tag,
        "outside_ok": outside_ok,
        "params": sum(p.numel() for p in model.parameters()), "tensor_bytes": tensor_bytes,
        "fragctl_reserved_bytes": reserved, "device_used_mib": [used_before, used_paused, used_resumed],
        "dropped_fraction_of_reserved": round(dropped / reserved, 4),
        "allocation_while_paused": refused, "free_before_pause": free_before, "other_process_bytes": other_bytes, "other_process_ok": other_ok,
        "other_process_stderr": other.stderr[-300:] if not other_ok else "",
        "pause_s": round(pause_s, 3), "resume_s": round(resume_s, 3),
        "pause_s_per_gib": round(pause_s / gib, 4), "resume_s_per_gib": round(resume_s / gib, 4),
        "same_address": same_address, "identical_tensors": identical, "tensors": len(tensors),
        "graph_replay_ok": graph_ok, "loss_after": float(loss2.item()),
    }))
    # Without kept contents the bytes (and so the graph's result) are undefined: the addresses must hold.
    kept = args.keep != "host" or (identical == len(tensors) and graph_ok)
    ok = (dropped >= 0.99 * reserved and refused is not None and other_ok and same_address and kept
          and outside_ok is not False)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
