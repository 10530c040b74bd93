"""fragctl's services in a PyTorch training loop, measured (tools/gpu/services.sh).

    python3 benchmarks/services/services_bench.py offload --out DIR [--layers 16 --seq 4096 ...]
    python3 benchmarks/services/services_bench.py zero3 --out DIR [--steps 50 ...]

offload: a decoder LM from a transformers config (Llama, random weights,
bf16) at long sequences; the same steps from the same weights and data
without offload, under fragctl.torch.offload_activations at a budget of half
the saved activations' peak (each tensor counted once however many times
autograd saves it), and under
torch.autograd.graph.save_on_cpu(pin_memory=True): step times, losses, peak
device memory.

zero3 (services_zero3.py): the same model, world size 1, for --steps
steps under FSDP2 (fully_shard, PyTorch's native allocator) and under
fragctl.torch.zero3.shard after fragctl.torch.enable() (the manager and
PyTorch on one pool), each in its own process, same seed and data: losses,
peak device memory, num_alloc_retries in the steady steps, throughput.
--no-enable adds a third row: zero3.shard beside PyTorch's native allocator.

Each writes DIR/NAME.json and DIR/NAME.md (a markdown table). On a machine
without CUDA, --device cpu runs the same code on a tiny model (a check of
the script, not a measurement: the offload store then runs on fragctl's sim
backend).
"""
import argparse
import contextlib
import copy
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # loaded by its path (tests/torch) rather than run: its modules are beside it
    sys.path.insert(0, HERE)
from workload import batches, build_model, synchronize  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("part", choices=["offload", "zero3"])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--intermediate", type=int, default=5504)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=8, help="offload: steps per variant (the first 2 are warm-up)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--min-bytes", default="1MiB")
    p.add_argument("--recompute", action="store_true",
                   help="offload: every variant recomputes each layer in backward (torch.utils.checkpoint, "
                        "reentrant, whose saved layer inputs pass through the offload hooks), so a step saves "
                        "only the layers' inputs and the head's: DeepSpeed's cpu_checkpointing case")
    p.add_argument("--loss", default="hf", choices=["hf", "chunked"],
                   help="offload: hf: the model's own loss (transformers: fp32 logits of every token, saved for "
                        "backward); chunked: the head and cross-entropy applied --loss-chunk tokens at a time, "
                        "each chunk recomputed in backward, so no logits are saved (the long-sequence trainers' way)")
    p.add_argument("--loss-chunk", type=int, default=4096, help="tokens per chunk of --loss chunked")
    p.add_argument("--model", default="llama", choices=["llama", "torch"],
                   help="llama: transformers' LlamaForCausalLM; torch: a torch.nn decoder (checks without transformers)")
    p.add_argument("--no-enable", action="store_true",
                   help="zero3: also run fragctl without fragctl.torch.enable() (the manager's own allocators "
                        "beside PyTorch's native one)")
    p.add_argument("--policy", default="arena", help="zero3: the policy fragctl.torch.enable() installs")
    p.add_argument("--port", type=int, default=29571, help="zero3: MASTER_PORT of the first variant's process")
    # Internal: zero3 runs each variant as this script with --variant, its row written to --row.
    p.add_argument("--variant", choices=["fsdp2", "fragctl", "fragctl-no-enable"], help=argparse.SUPPRESS)
    p.add_argument("--row", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def loss_of(model, ids, args, torch):
    """The step's loss on `ids` (labels = inputs, shifted by one), by --loss."""
    if args.loss == "hf":
        return model(input_ids=ids, labels=ids).loss
    if args.model == "torch":
        hidden, head = model.trunk(ids), model.head
    else:
        hidden, head = model.model(input_ids=ids).last_hidden_state, model.lm_head
    return chunked_cross_entropy(hidden, head, ids, args.loss_chunk, torch)


def chunked_cross_entropy(hidden, head, labels, chunk, torch):
    """Mean next-token cross-entropy with `head` and the loss applied `chunk`
    tokens at a time, each chunk under a reentrant checkpoint: one chunk's
    fp32 logits exist at a time, in forward and again in backward, and none
    is saved; the saves are the chunks' inputs (views of `hidden`)."""
    import torch.utils.checkpoint
    h = hidden[:, :-1].reshape(-1, hidden.shape[-1])
    y = labels[:, 1:].reshape(-1)

    def piece(h_chunk, y_chunk):
        return torch.nn.functional.cross_entropy(head(h_chunk).float(), y_chunk, reduction="sum")

    total = None
    for i in range(0, h.shape[0], chunk):
        part = torch.utils.checkpoint.checkpoint(piece, h[i:i + chunk], y[i:i + chunk], use_reentrant=True)
        total = part if total is None else total + part
    return total / h.shape[0]


def movable_filter(args, fragctl_torch):
    """The test offload_activations applies to a saved tensor, for the store
    this script builds (the store resolves its device as "cuda:N", the form
    a tensor's .device has; torch.device("cuda") matches no tensor)."""
    probe = fragctl_torch.offload_activations(budget="1GiB", min_bytes=args.min_bytes,
                                              backend=None if args.device == "cuda" else "sim")
    return probe.movable


def saved_activation_bytes(model, data, args, torch, movable):
    """Bytes of the tensors one forward saves that offload would move:
    (counting every save, counting each tensor once, the largest one). A
    tensor saved twice (cross_entropy's log-probabilities) holds its memory
    once, and the offload moves it once: the second figure is the
    activations' peak."""
    every, unique = [0], {}

    def pack(t):
        if movable(t):
            nbytes = t.numel() * t.element_size()
            every[0] += nbytes
            unique[(t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)] = nbytes  # all alive: no reuse
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_of(model, data.to(args.device), args, torch)
    del loss
    return every[0], sum(unique.values()), max(unique.values(), default=0)


def run_steps(model, state, data, args, torch, context_factory):
    """Loads `state`, runs one step per batch under context_factory(); returns
    (losses, step seconds, peak allocated bytes)."""
    model.load_state_dict(state)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    losses, times = [], []
    if args.device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    for batch in data:
        ids = batch.to(args.device)
        synchronize(torch, args.device)
        start = time.perf_counter()
        with context_factory():
            loss = loss_of(model, ids, args, torch)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(torch, args.device)
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    peak = torch.cuda.max_memory_allocated() if args.device == "cuda" else 0
    return losses, times, peak


def offload(args, torch):
    import fragctl.torch
    model = build_model(args, torch)
    if args.recompute:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    else:
        model.gradient_checkpointing_disable()
    state = copy.deepcopy(model.state_dict())
    data = batches(args, torch, args.steps)
    saves_bytes, saved, largest = saved_activation_bytes(model, data[0], args, torch, movable_filter(args, fragctl.torch))
    budget = max(saved // 2, 1 << 20)
    print("saved activations per step: %.2f GiB (%.2f GiB of saves); offload budget %.2f GiB" % (
        saved / 2**30, saves_bytes / 2**30, budget / 2**30), flush=True)
    backend = None if args.device == "cuda" else "sim"
    store = fragctl.torch.offload_activations(budget=budget, min_bytes=args.min_bytes, backend=backend)
    # Everything offloaded, as save_on_cpu does: a region of the largest save
    # (one on the device at a time), the memory save_on_cpu holds.
    least = max(largest, 1 << 20)
    store_all = fragctl.torch.offload_activations(budget=least, min_bytes=args.min_bytes, backend=backend)
    variants = [
        ("none", contextlib.nullcontext, 0),
        ("fragctl offload", lambda: store, budget),
        ("save_on_cpu(pin_memory=True)",
         lambda: torch.autograd.graph.save_on_cpu(pin_memory=args.device == "cuda"), 0),
        ("fragctl offload, everything", lambda: store_all, least),
    ]
    rows = []
    for name, factory, extra in variants:
        print("running %s ..." % name, flush=True)
        losses, times, peak = run_steps(model, state, data, args, torch, factory)
        steady = times[args.warmup:] or times
        rows.append({"variant": name, "step_s": statistics.median(steady), "losses": losses,
                     "peak_torch_bytes": peak,
                     # The store's region comes from fragctl's own allocator unless
                     # fragctl.torch.enable is active: add it to PyTorch's peak.
                     "store_region_bytes": extra if fragctl.torch.enabled() is None else 0})
    store_stats = store.stats()
    store.close()
    store_all_stats = store_all.stats()
    store_all.close()
    base = rows[0]
    for r in rows:
        r["vs_none"] = r["step_s"] / base["step_s"]
        # bf16 kernels are not bit-reproducible from run to run (two runs of
        # "none" differ too): the difference is reported, not required to be 0.
        r["max_loss_diff_vs_none"] = max(abs(a - b) for a, b in zip(r["losses"], base["losses"]))
        r["peak_device_bytes"] = r["peak_torch_bytes"] + r["store_region_bytes"]
    result = {"saved_activation_bytes": saved, "saves_bytes": saves_bytes, "budget": budget, "rows": rows,
              "store": store_stats, "budget_everything": least, "store_everything": store_all_stats, "recompute": args.recompute, "loss": args.loss,
              "targets": {"offload_vs_none_at_most": 1.10, "save_on_cpu_over_offload_at_least": 1.5}}
    result["offload_vs_save_on_cpu"] = rows[2]["step_s"] / rows[1]["step_s"]
    result["everything_vs_save_on_cpu"] = rows[2]["step_s"] / rows[3]["step_s"]
    lines = ["| variant | step s (median) | x none | peak device GiB | max abs loss difference to none |",
             "| --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append("| %s | %.3f | %.2f | %.2f | %.5f |" % (r["variant"], r["step_s"], r["vs_none"],
                                                           r["peak_device_bytes"] / 2**30, r["max_loss_diff_vs_none"]))
    lines.append("")
    lines.append(("recomputed layers (torch.utils.checkpoint): " if args.recompute else "") +
                 ("loss in chunks of %d tokens: " % args.loss_chunk if args.loss == "chunked" else "") +
                 "saved activations %.2f GiB per step (%.2f GiB of saves), budget %.2f GiB; save_on_cpu / fragctl "
                 "step time %.2fx (target >= 1.5x); fragctl / none %.2fx (target <= 1.10x); store: %d evictions ahead, "
                 "%d prefetched gets (%d still copying), %d on demand; %d kept in backward; %d saves shared; %d of %d "
                 "moved tensors straight to the host (larger than the budget)" % (
                                  saved / 2**30, saves_bytes / 2**30, budget / 2**30, result["offload_vs_save_on_cpu"],
                                  rows[1]["vs_none"], store_stats.get("copies", {}).get("evictions_ahead", 0),
                                  store_stats.get("gets_by_source", {}).get("prefetched", 0),
                                  store_stats.get("gets_by_source", {}).get("prefetch_pending", 0),
                                  store_stats.get("gets_by_source", {}).get("on_demand", 0),
                                  store_stats.get("tensors_kept_in_backward", 0),
                                  store_stats.get("tensors_shared", 0),
                                  store_stats.get("tensors_to_host_direct", 0), store_stats.get("tensors_moved", 0)))
    lines.append("")
    lines.append("everything offloaded (budget %.2f GiB, the largest save): save_on_cpu / fragctl step time %.2fx, "
                 "peak device %.2f against save_on_cpu's %.2f GiB; %d kept in backward" % (
                     least / 2**30, result["everything_vs_save_on_cpu"], rows[3]["peak_device_bytes"] / 2**30,
                     rows[2]["peak_device_bytes"] / 2**30, store_all_stats.get("tensors_kept_in_backward", 0)))
    return result, lines


def main(argv):
    args = parse_args(argv)
    import torch
    if args.variant:  # a zero3 variant's process: nothing may touch CUDA before it decides on enable()
        import services_zero3
        return services_zero3.variant(args, torch)
    os.makedirs(args.out, exist_ok=True)
    meta = {"torch": torch.__version__, "device": args.device, "model_kind": args.model,
            "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
            "model": {k: getattr(args, k) for k in ("model", "layers", "hidden", "heads", "intermediate", "vocab", "seq",
                                                    "batch")},
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if args.part == "offload":
        result, lines = offload(args, torch)
    else:
        import services_zero3
        result, lines = services_zero3.run(args, torch)
    result["meta"] = meta
    name = args.part + ("-recompute" if args.recompute else "") + ("-chunked" if args.loss == "chunked" else "")
    with open(os.path.join(args.out, name + ".json"), "w") as f:
        json.dump(result, f, indent=1)
    header = "%s, %s, torch %s, %s" % (args.part, meta["gpu"], meta["torch"], meta["date"])
    text = "\n".join(["### " + header, ""] + lines) + "\n"
    with open(os.path.join(args.out, name + ".md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
