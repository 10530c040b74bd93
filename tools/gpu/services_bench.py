"""fragctl's services in a PyTorch training loop, measured (tools/gpu/services.sh).

    python3 tools/gpu/services_bench.py offload --out DIR [--layers 16 --seq 4096 ...]
    python3 tools/gpu/services_bench.py zero3 --out DIR [--steps 50 ...]

offload: a decoder LM from a transformers config (Llama, random weights,
bf16) at long sequences; the same steps from the same weights and data
without offload, under fragctl.torch.offload_activations at a budget of half
the saved activations' peak (each tensor counted once however many times
autograd saves it), and under
torch.autograd.graph.save_on_cpu(pin_memory=True): step times, losses, peak
device memory.

zero3: the same model, world size 1, for --steps steps under FSDP2
(fully_shard) and under fragctl.torch.zero3.shard where this fragctl has it,
same seed and data: losses, peak device memory, num_alloc_retries in the
steady steps, throughput.

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

TRAINERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks", "trainers")


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
    return p.parse_args(argv)


def build_model(args, torch):
    if args.model == "torch":
        return _torch_decoder(args, torch)
    import transformers
    config = transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                                      intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                                      num_attention_heads=args.heads, num_key_value_heads=args.heads,
                                      max_position_embeddings=args.seq)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    # Initialized on the GPU where torch allows (2.0+): seconds instead of a
    # CPU initialization per variant, which services.sh's time limit feels.
    where = torch.device(args.device) if args.device == "cuda" and hasattr(torch.device, "__enter__") \
        else contextlib.nullcontext()
    with where:
        model = transformers.LlamaForCausalLM(config)
    model = model.to(device=args.device, dtype=dtype)
    model.config.use_cache = False
    return model


def _torch_decoder(args, torch):
    """A causal decoder from torch.nn alone, called as transformers' models are
    (model(input_ids=..., labels=...).loss): for checking the script where
    transformers is missing."""
    import types
    nn = torch.nn

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(args.vocab, args.hidden)
            self.model = types.SimpleNamespace()
            self.layers = nn.ModuleList(
                nn.TransformerEncoderLayer(args.hidden, args.heads, args.intermediate, dropout=0.0, batch_first=True,
                                           norm_first=True) for _ in range(args.layers))
            self.model.layers = self.layers
            self.head = nn.Linear(args.hidden, args.vocab, bias=False)

        def trunk(self, input_ids):
            n = input_ids.shape[1]
            mask = torch.triu(torch.full((n, n), float("-inf"), device=input_ids.device), diagonal=1)
            h = self.embed(input_ids)
            for layer in self.layers:
                h = layer(h, src_mask=mask)
            return h

        def forward(self, input_ids, labels):
            logits = self.head(self.trunk(input_ids))
            loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, args.vocab), labels[:, 1:].reshape(-1))
            return types.SimpleNamespace(loss=loss)

        def gradient_checkpointing_disable(self):
            pass

        def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
            raise SystemExit("--recompute needs --model llama")

    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    return Decoder().to(device=args.device, dtype=dtype)


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


def batches(args, torch, steps):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, args.vocab, (args.batch, args.seq), generator=g) for _ in range(steps)]


def synchronize(torch, device):
    if device == "cuda":
        torch.cuda.synchronize()


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


def zero3(args, torch):
    import torch.distributed as dist
    import fragctl.torch
    import fragctl.torch.zero3
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29571")
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo", rank=0, world_size=1)
    data = batches(args, torch, args.steps)
    rows = []
    if args.device == "cuda":  # gloo has no reduce-scatter; CPU runs sample nothing
        warm_up_collectives(torch, args.device)

    fully_shard = None
    for module in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):  # torch 2.6+, 2.4-2.5
        try:
            fully_shard = __import__(module, fromlist=["fully_shard"]).fully_shard
            break
        except Exception:  # missing; torch 1.13's distributed._shard does not import on Python 3.11
            pass

    def fsdp2(model):
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        return model

    def fragctl_zero3(model):
        # One block per decoder layer, as FSDP2 wraps them.
        layer_type = type(model.model.layers[0])
        return fragctl.torch.zero3.shard(model, config={"stage": 3}, block_types=(layer_type,))

    candidates = [("FSDP2 fully_shard", fsdp2, fully_shard is not None, "torch %s has no fully_shard" % torch.__version__),
                  ("fragctl zero3.shard", fragctl_zero3, hasattr(fragctl.torch.zero3, "shard"),
                   "fragctl.torch.zero3.shard is not in this fragctl")]
    for name, wrap, present, why_not in candidates:
        if not present:
            rows.append({"variant": name, "missing": why_not})
            continue
        try:
            rows.append(train_50(name, wrap, args, torch, data))
        except Exception as e:  # noqa: BLE001 (the other variant's row still counts)
            import traceback
            traceback.print_exc()
            rows.append({"variant": name, "missing": "failed: %s: %s" % (type(e).__name__, str(e)[:200])})
        release_unreachable(torch, args.device == "cuda")
    measured = [r for r in rows if "losses" in r]
    if len(measured) == 2:
        diffs = [abs(a - b) for a, b in zip(measured[0]["losses"], measured[1]["losses"])]
        rows.append({"variant": "max |loss difference|", "value": max(diffs)})
    lines = ["| variant | tokens/s | peak device GiB (sampled) | live bound GiB | retries in steady steps | first loss "
             "| last loss | gathered peak / max live |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if "missing" in r:
            lines.append("| %s | not run: %s | | | | | | |" % (r["variant"], r["missing"]))
        elif "value" in r:
            lines.append("| %s | %.4g | | | | | | |" % (r["variant"], r["value"]))
        else:
            z = r.get("zero3")
            lines.append("| %s | %.0f | %.2f | %.2f | %d | %.4f | %.4f | %s |" % (
                r["variant"], r["tokens_per_s"], r["peak_device_bytes"] / 2**30, r["peak_live_bound_bytes"] / 2**30,
                r["retries_steady"],
                r["losses"][0], r["losses"][-1],
                "%.2f / %.2f GiB" % (z["gathered_bytes"]["peak"] / 2**30, z["budget"]["max_live_bytes"] / 2**30)
                if z else "-"))
    lines += ["", "Memory (GiB): PyTorch's allocated bytes before the variant's model is built (what earlier "
              "variants left: should be 0), its peak allocated per phase of a step, its peak reserved, the optimizer "
              "state, the block manager's long-lived buffers and gathered peak (its own count), what its two "
              "allocators reserve at the end, and the device bytes outside PyTorch's cache that the variant "
              "added (fragctl's allocators, NCCL).", "",
              "| variant | torch allocated before | torch fwd / bwd / opt peak | torch reserved peak | optimizer state "
              "| manager long-lived | manager gathered peak | manager reserved at end | outside torch |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        m = r.get("memory")
        if m:
            ph = m["torch_peak_allocated_by_phase"]
            lines.append("| %s | %.2f | %.2f / %.2f / %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |" % (
                r["variant"], m["torch_allocated_before_bytes"] / 2**30, ph["forward"] / 2**30, ph["backward"] / 2**30, ph["optimizer"] / 2**30,
                m["torch_peak_reserved_bytes"] / 2**30, m["optimizer_state_bytes"] / 2**30,
                m["manager_long_lived_bytes"] / 2**30, m["manager_gathered_peak_bytes"] / 2**30,
                m["manager_reserved_bytes"] / 2**30, m["device_bytes_outside_torch_added"] / 2**30))
    dist.destroy_process_group()
    return {"rows": rows}, lines


def warm_up_collectives(torch, device):
    """One small all-gather and reduce-scatter, so that the process group's
    communicator and its buffers exist before either variant's sampler takes
    its baseline (the first variant would otherwise pay for them alone)."""
    import torch.distributed as dist
    x = torch.ones(1024, device=device)
    out = torch.empty(1024 * dist.get_world_size(), device=device)
    dist.all_gather_into_tensor(out, x)
    dist.reduce_scatter_tensor(x, out)
    synchronize(torch, device)


def train_50(name, wrap, args, torch, data):
    """One variant's run (train_steps) with the device's used bytes sampled
    from outside the process (benchmarks/trainers/memsampler.py; 0 on CPU)
    above what was in use when it began; the sampler stops even if the run
    raises, so that its context never sits in the next variant's baseline."""
    cuda = args.device == "cuda"
    release_unreachable(torch, cuda)  # before the sampler's baseline
    if not cuda:
        row = train_steps(name, wrap, args, torch, data)
        row["peak_device_bytes"] = 0
        return row
    if TRAINERS not in sys.path:
        sys.path.insert(0, TRAINERS)
    import memsampler
    sampler, baseline, _ = memsampler.start()
    try:
        row = train_steps(name, wrap, args, torch, data)
    finally:
        peak = memsampler.stop(sampler)
    row["peak_device_bytes"] = peak - baseline
    return row


def train_steps(name, wrap, args, torch, data):
    """One variant's run: --steps AdamW steps on `data`; its row. Peak device
    memory: the device's used bytes sampled from outside the process every
    10 ms, above what was in use before the variant's model was built (every
    cache counted: PyTorch's, the manager's allocators'); and, computed from
    in-process counts, PyTorch's peak allocated plus, for fragctl, the block
    manager's long-lived buffers and gathered peak (held outside PyTorch),
    an upper bound on the bytes live at once. The row's "memory" splits it
    (memory_split)."""
    cuda = args.device == "cuda"
    allocated_before = torch.cuda.memory_allocated() if cuda else 0
    outside_before = device_bytes_outside_torch(torch) if cuda else 0
    model = wrap(build_model(args, torch))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses, times, retries = [], [], []
    phases = {"forward": 0, "backward": 0, "optimizer": 0}
    outside_peak = 0
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()

    def phase_end(phase):
        nonlocal outside_peak
        if cuda:
            phases[phase] = max(phases[phase], torch.cuda.max_memory_allocated())
            outside_peak = max(outside_peak, device_bytes_outside_torch(torch))
            torch.cuda.reset_peak_memory_stats()

    for batch in data:
        ids = batch.to(args.device)
        synchronize(torch, args.device)
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        phase_end("forward")
        loss.backward()
        phase_end("backward")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        phase_end("optimizer")
        synchronize(torch, args.device)
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
        if cuda:
            retries.append(torch.cuda.memory_stats().get("num_alloc_retries", 0))
    steady = times[args.warmup:] or times
    stats = model.stats() if hasattr(model, "stats") else None
    peak = max(phases.values())
    memory = memory_split(torch, cuda, phases, stats, outside_peak - outside_before, optimizer)
    memory["torch_allocated_before_bytes"] = allocated_before
    if stats:
        peak += memory["manager_long_lived_bytes"] + memory["manager_gathered_peak_bytes"]
    if hasattr(model, "close"):
        model.close()
    del model, optimizer
    return {"variant": name, "losses": losses, "tokens_per_s": args.batch * args.seq / statistics.median(steady),
            "peak_live_bound_bytes": peak, "memory": memory,
            "retries_steady": (retries[-1] - retries[args.warmup - 1]) if len(retries) > args.warmup else 0,
            "zero3": stats}


def release_unreachable(torch, cuda):
    """Frees what an earlier variant left in reference cycles (FSDP2's and
    the sharded module's hooks hold their modules): without it, the first
    variant's parameters stay allocated through the second's run and count
    in its peak (reset_peak_memory_stats starts from what is allocated)."""
    import gc
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def device_bytes_outside_torch(torch):
    """Device bytes in use that PyTorch's caching allocator has not reserved
    (the CUDA context, NCCL, and fragctl's own allocators)."""
    free, total = torch.cuda.mem_get_info()
    return total - free - torch.cuda.memory_reserved()


def memory_split(torch, cuda, phases, stats, outside_bytes, optimizer):
    """Where a zero3 row's device memory is: PyTorch's peak allocated bytes
    per phase of a step (the largest over the steps) and reserved bytes;
    the manager's long-lived buffers (shards, gradient shards, reduce
    buckets) and gathered peak, by its own count, and the bytes its two
    allocators reserve at the end (those plus cache); the device bytes outside
    PyTorch's cache that this variant added (fragctl's allocators reserve
    at least the manager's bytes; more is caching); and the optimizer
    state's bytes (in PyTorch)."""
    state_bytes = sum(t.numel() * t.element_size() for st in optimizer.state.values() for t in st.values()
                      if hasattr(t, "numel") and t.dim() > 0)
    out = {"torch_peak_allocated_by_phase": dict(phases),
           "torch_peak_reserved_bytes": torch.cuda.max_memory_reserved() if cuda else 0,
           "optimizer_state_bytes": state_bytes,
           "manager_long_lived_bytes": sum(stats["long_lived_bytes"].values()) if stats else 0,
           "manager_gathered_peak_bytes": stats["gathered_bytes"]["peak"] if stats else 0,
           # Both allocators under the manager at the end of the run: its bytes plus their cache.
           "manager_reserved_bytes": sum(a["reserved"] for a in stats.get("allocators", {}).values())
           if stats else 0,
           "device_bytes_outside_torch_added": outside_bytes}
    return out


def main(argv):
    args = parse_args(argv)
    import torch
    os.makedirs(args.out, exist_ok=True)
    meta = {"torch": torch.__version__, "device": args.device, "model_kind": args.model,
            "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
            "model": {k: getattr(args, k) for k in ("model", "layers", "hidden", "heads", "intermediate", "vocab", "seq",
                                                    "batch")},
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    result, lines = (offload if args.part == "offload" else zero3)(args, torch)
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
