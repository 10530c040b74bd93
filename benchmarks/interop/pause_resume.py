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

Prints one JSON line with the figures (time per GiB of pause and resume).
    python3 benchmarks/interop/pause_resume.py [--layers 24] [--hidden 2048]
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
import sys, torch
n = int(sys.argv[1])
x = torch.empty(n, dtype=torch.uint8, device="cuda")
x.fill_(7)
torch.cuda.synchronize()
print(int(x[::4096].sum().item() == 7 * x[::4096].numel()))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--keep", default="host", choices=["host", "none"])
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
    model = LlamaForCausalLM(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 32000, (2, 512), device="cuda")
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()

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
    reserved = torch.cuda.memory_reserved()
    used_before = device_used_mib(dev)

    t0 = time.perf_counter()
    fragctl.torch.pause(keep=args.keep)
    pause_s = time.perf_counter() - t0
    used_paused = device_used_mib(dev)
    dropped = (used_before - used_paused) * 2**20
    refused = None
    try:
        torch.empty(1 << 20, device="cuda")
    except Exception as e:  # allocation while paused is refused
        refused = type(e).__name__

    other_bytes = int(reserved * 0.9)
    other = subprocess.run([sys.executable, "-c", OTHER, str(other_bytes)], capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
    other_ok = other.returncode == 0 and other.stdout.strip().endswith("1")

    t0 = time.perf_counter()
    fragctl.torch.resume()
    resume_s = time.perf_counter() - t0
    used_resumed = device_used_mib(dev)

    same_address = all(t.data_ptr() == a for t, a in zip(tensors, addresses))
    identical = sum(1 for t, c in zip(tensors, copies) if torch.equal(t.detach().cpu(), c))
    graph.replay()
    torch.cuda.synchronize()
    graph_ok = torch.equal(y.cpu(), expected)
    loss2 = model(input_ids=ids, labels=ids).loss
    loss2.backward()
    opt.step()
    torch.cuda.synchronize()

    gib = reserved / 2**30
    print(json.dumps({
        "gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__, "keep": args.keep,
        "params": sum(p.numel() for p in model.parameters()), "tensor_bytes": tensor_bytes,
        "fragctl_reserved_bytes": reserved, "device_used_mib": [used_before, used_paused, used_resumed],
        "dropped_fraction_of_reserved": round(dropped / reserved, 4),
        "allocation_while_paused": refused, "other_process_bytes": other_bytes, "other_process_ok": other_ok,
        "other_process_stderr": other.stderr[-300:] if not other_ok else "",
        "pause_s": round(pause_s, 3), "resume_s": round(resume_s, 3),
        "pause_s_per_gib": round(pause_s / gib, 4), "resume_s_per_gib": round(resume_s / gib, 4),
        "same_address": same_address, "identical_tensors": identical, "tensors": len(tensors),
        "graph_replay_ok": graph_ok, "loss_after": float(loss2.item()),
    }))
    # Without kept contents the bytes (and so the graph's result) are undefined: the addresses must hold.
    kept = args.keep != "host" or (identical == len(tensors) and graph_ok)
    ok = dropped >= 0.99 * reserved and refused is not None and other_ok and same_address and kept
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
