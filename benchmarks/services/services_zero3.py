"""services_bench.py zero3: FSDP2 and fragctl.torch.zero3.shard, each in its
own process (docs/torch-services.md, "Proof on a GPU", part (b)).

The parent (run) starts one child process per variant, running this same
script with ``--variant``, and samples the device's used memory from
outside (benchmarks/trainers/memsampler.py) from just before the child
starts until it exits: the child's peak above that baseline is the
variant's peak device memory, CUDA context and communicator included, the
same for every variant. The children share the seed, the data and the
steps:

* ``fsdp2``: FSDP2 (``fully_shard`` on each decoder layer and the root) on
  PyTorch's native allocator, as its users run it;
* ``fragctl``: ``fragctl.torch.enable()`` first, before any CUDA
  allocation, then ``fragctl.torch.zero3.shard``, whose manager allocates
  from PyTorch's own (fragctl) allocator: one pool;
* ``fragctl-no-enable`` (with ``--no-enable``): zero3.shard beside
  PyTorch's native allocator, the manager on its two own allocators.

On CPU (``--device cpu``, gloo) the children run the same code without a
sampler and without enable() (it needs CUDA): a check of the script.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import workload

TRAINERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "trainers")

# variant key -> (row name, what the manager allocates from)
VARIANTS = {
    "fsdp2": ("FSDP2 fully_shard", "PyTorch native"),
    "fragctl": ("fragctl zero3.shard", "one pool: fragctl.torch.enable()'s"),
    "fragctl-no-enable": ("fragctl zero3.shard, no enable", "the manager's own two, beside PyTorch native"),
}


def run(args, torch):
    """The parent: every variant in its own process; (result, markdown lines)."""
    keys = ["fsdp2", "fragctl"] + (["fragctl-no-enable"] if args.no_enable else [])
    if args.device == "cuda":  # enable()'s native route is compiled on first use: not inside a timed child
        try:
            from fragctl import _native
            _native.load()
        except Exception as e:  # noqa: BLE001 (enable() then says which route it takes, and why)
            print("fragctl's native torch allocator did not build here: %s" % e, flush=True)
    rows = [run_child(key, index, args) for index, key in enumerate(keys)]
    measured = [r for r in rows if "losses" in r]
    if len(measured) >= 2 and measured[0]["key"] == "fsdp2":
        for other in measured[1:]:
            diffs = [abs(a - b) for a, b in zip(measured[0]["losses"], other["losses"])]
            suffix = "" if other["key"] == "fragctl" else " (%s)" % other["key"]
            rows.append({"variant": "max |loss difference|" + suffix, "value": max(diffs)})
    return {"rows": rows}, table(rows)


def child_argv(args, key, row_path, port):
    """The command line of `key`'s child: this run's options, one variant."""
    argv = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "services_bench.py"), "zero3",
            "--out", args.out, "--variant", key, "--row", row_path, "--port", str(port), "--policy", args.policy]
    for name in ("device", "layers", "hidden", "heads", "intermediate", "vocab", "seq", "batch", "steps", "warmup",
                 "model"):
        argv += ["--" + name, str(getattr(args, name))]
    return argv


def run_child(key, index, args):
    """Runs `key` in a child process; its row with the sampled peak."""
    name = VARIANTS[key][0]
    cuda = args.device == "cuda"
    row_path = os.path.join(tempfile.mkdtemp(prefix="services-zero3-"), key + ".json")
    sampler, baseline = None, 0
    if cuda:
        if TRAINERS not in sys.path:
            sys.path.insert(0, TRAINERS)
        import memsampler
        sampler, baseline, _ = memsampler.start()  # before the child exists: its context counts
    print("running %s in its own process ..." % name, flush=True)
    try:
        code = subprocess.call(child_argv(args, key, row_path, args.port + index))
    finally:
        peak = memsampler.stop(sampler) if sampler is not None else 0
    if not os.path.exists(row_path):
        return {"variant": name, "key": key, "missing": "failed: its process exited with %d" % code}
    with open(row_path) as f:
        row = json.load(f)
    row["key"] = key
    if "missing" not in row:
        row["peak_device_bytes"] = peak - baseline if cuda else 0
    return row


def variant(args, torch):
    """The child: one variant, its row written to --row."""
    key, cuda = args.variant, args.device == "cuda"
    name, allocator = VARIANTS[key]
    row = {"variant": name}
    try:
        import fragctl.torch
        if key == "fragctl" and cuda:
            fragctl.torch.enable(args.policy)  # before any CUDA allocation: PyTorch allocates through fragctl
            allocator = "%s (%s)" % (allocator, args.policy)
        elif key == "fragctl":
            allocator = "the manager's own two (CPU: enable() needs CUDA)"
        import torch.distributed as dist
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(args.port)
        dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
        data = workload.batches(args, torch, args.steps)
        if cuda:  # gloo has no reduce-scatter
            warm_up_collectives(torch, args.device)
        wrap = fsdp2_wrapper(torch) if key == "fsdp2" else fragctl_wrapper
        if isinstance(wrap, str):
            row["missing"] = wrap
        else:
            row.update(train_steps(wrap, args, torch, data))
            row["allocator"] = allocator
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 (the parent reports it in the row)
        import traceback
        traceback.print_exc()
        row["missing"] = "failed: %s: %s" % (type(e).__name__, str(e)[:200])
    with open(args.row, "w") as f:
        json.dump(row, f)
    return 0


def fsdp2_wrapper(torch):
    """FSDP2 on each decoder layer and the root; a string saying why not
    where this torch has no fully_shard."""
    fully_shard = None
    for module in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):  # torch 2.6+, 2.4-2.5
        try:
            fully_shard = __import__(module, fromlist=["fully_shard"]).fully_shard
            break
        except Exception:  # missing; torch 1.13's distributed._shard does not import on Python 3.11
            pass
    if fully_shard is None:
        return "torch %s has no fully_shard" % torch.__version__

    def wrap(model):
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        return model
    return wrap


def fragctl_wrapper(model):
    """fragctl's ZeRO-3, one block per decoder layer, as FSDP2 wraps them."""
    import fragctl.torch.zero3
    layer_type = type(model.model.layers[0])
    return fragctl.torch.zero3.shard(model, config={"stage": 3}, block_types=(layer_type,))


def table(rows):
    lines = ["| variant | tokens/s | peak device GiB (sampled) | live bound GiB | retries in steady steps "
             "| fragctl memory calls per steady step | first loss | last loss | gathered peak / max live |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if "missing" in r:
            lines.append("| %s | not run: %s | | | | | | | |" % (r["variant"], r["missing"]))
        elif "value" in r:
            lines.append("| %s | %.4g | | | | | | | |" % (r["variant"], r["value"]))
        else:
            z = r.get("zero3")
            calls = r.get("memory_calls_steady")
            lines.append("| %s | %.0f | %.2f | %.2f | %d | %s | %.4f | %.4f | %s |" % (
                r["variant"], r["tokens_per_s"], r["peak_device_bytes"] / 2**30, r["peak_live_bound_bytes"] / 2**30,
                r["retries_steady"], "%.1f" % (calls / r["steady_steps"]) if calls is not None and r["steady_steps"]
                else "-", r["losses"][0], r["losses"][-1],
                "%.2f / %.2f GiB" % (z["gathered_bytes"]["peak"] / 2**30, z["budget"]["max_live_bytes"] / 2**30)
                if z else "-"))
    lines += ["", "Tokens/s leave out the time of the per-phase memory probes. Each variant ran in its own process; peak device memory is the device's used bytes sampled "
              "from outside, above what was in use before the process started (its CUDA context and NCCL "
              "included). Memory (GiB): PyTorch's allocated bytes before the model is built (should be 0), its "
              "peak allocated per phase of a step, its peak reserved, the optimizer state, the block manager's "
              "long-lived buffers and gathered peak (its own count), what the allocators under it reserve at the "
              "end (with enable(): the one pool, PyTorch's bytes included; PyTorch's counts then include the "
              "manager's), and the device bytes outside PyTorch's cache the variant added (fragctl's own "
              "allocators, NCCL).", "",
              "| variant | manager allocates from | torch allocated before | torch fwd / bwd / opt peak "
              "| torch reserved peak | optimizer state | manager long-lived | manager gathered peak "
              "| manager's allocators reserved at end | outside torch |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        m = r.get("memory")
        if m:
            ph = m["torch_peak_allocated_by_phase"]
            lines.append("| %s | %s | %.2f | %.2f / %.2f / %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |" % (
                r["variant"], r["allocator"] if r.get("zero3") else "-", m["torch_allocated_before_bytes"] / 2**30,
                ph["forward"] / 2**30, ph["backward"] / 2**30, ph["optimizer"] / 2**30,
                m["torch_peak_reserved_bytes"] / 2**30, m["optimizer_state_bytes"] / 2**30,
                m["manager_long_lived_bytes"] / 2**30, m["manager_gathered_peak_bytes"] / 2**30,
                m["manager_reserved_bytes"] / 2**30, m["device_bytes_outside_torch_added"] / 2**30))
    return lines


def warm_up_collectives(torch, device):
    """One small all-gather and reduce-scatter, so that the process group's
    communicator and its buffers exist before the model is built."""
    import torch.distributed as dist
    x = torch.ones(1024, device=device)
    out = torch.empty(1024 * dist.get_world_size(), device=device)
    dist.all_gather_into_tensor(out, x)
    dist.reduce_scatter_tensor(x, out)
    workload.synchronize(torch, device)


def train_steps(wrap, args, torch, data):
    """--steps AdamW steps of wrap(model) on `data`: the row's measured part.
    Besides the parent's sampled peak: computed from in-process counts,
    PyTorch's peak allocated plus, for a manager outside PyTorch's
    allocator, its long-lived buffers and gathered peak, an upper bound on
    the bytes live at once; "memory" splits it (memory_split)."""
    cuda = args.device == "cuda"
    allocated_before = torch.cuda.memory_allocated() if cuda else 0
    outside_before = device_bytes_outside_torch(torch) if cuda else 0
    model = wrap(workload.build_model(args, torch))
    # The manager's bytes are in PyTorch's counts when it allocates from PyTorch's allocator.
    import fragctl.torch
    shared = getattr(model, "allocator", None) is not None and fragctl.torch.enabled() is not None
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses, times, retries = [], [], []
    phases = {"forward": 0, "backward": 0, "optimizer": 0}
    outside_peak = 0
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()

    probing = [0.0]  # seconds this step spent in phase_end's probes, left out of its time

    def phase_end(phase):
        nonlocal outside_peak
        if cuda:
            began = time.perf_counter()
            phases[phase] = max(phases[phase], torch.cuda.max_memory_allocated())
            outside_peak = max(outside_peak, device_bytes_outside_torch(torch))
            torch.cuda.reset_peak_memory_stats()
            probing[0] += time.perf_counter() - began

    calls = []  # fragctl's backend memory calls after each step (enable() only)
    for batch in data:
        ids = batch.to(args.device)
        workload.synchronize(torch, args.device)
        probing[0] = 0.0
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        phase_end("forward")
        loss.backward()
        phase_end("backward")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        phase_end("optimizer")
        workload.synchronize(torch, args.device)
        times.append(time.perf_counter() - start - probing[0])
        losses.append(loss.item())
        if cuda:
            retries.append(torch.cuda.memory_stats().get("num_alloc_retries", 0))
            if fragctl.torch.enabled() is not None:
                calls.append(fragctl.stats()["backend_counters"])
    steady = times[args.warmup:] or times
    stats = model.stats() if hasattr(model, "stats") else None
    peak = max(phases.values())
    memory = memory_split(torch, cuda, phases, stats, shared, outside_peak - outside_before, optimizer)
    memory["torch_allocated_before_bytes"] = allocated_before
    if stats and not shared:
        peak += memory["manager_long_lived_bytes"] + memory["manager_gathered_peak_bytes"]
    if hasattr(model, "close"):
        model.close()
    return {"losses": losses, "tokens_per_s": args.batch * args.seq / statistics.median(steady),
            "peak_live_bound_bytes": peak, "memory": memory, "manager_in_torch_pool": shared,
            "retries_steady": (retries[-1] - retries[args.warmup - 1]) if len(retries) > args.warmup else 0,
            "memory_calls_steady": (calls[-1]["memory_calls"] - calls[args.warmup - 1]["memory_calls"])
            if len(calls) > args.warmup else None,
            "backend_calls_steady": {k: v - calls[args.warmup - 1]["calls"].get(k, 0)
                                     for k, v in calls[-1]["calls"].items()} if len(calls) > args.warmup else None,
            "steady_steps": max(len(times) - args.warmup, 0), "zero3": stats}


def device_bytes_outside_torch(torch):
    """Device bytes in use that PyTorch's allocator has not reserved (the
    CUDA context, NCCL, and fragctl's own allocators)."""
    free, total = torch.cuda.mem_get_info()
    return total - free - torch.cuda.memory_reserved()


def memory_split(torch, cuda, phases, stats, shared, outside_bytes, optimizer):
    """Where a row's device memory is: PyTorch's peak allocated bytes per
    phase of a step (the largest over the steps) and reserved bytes; the
    manager's long-lived buffers (shards, gradient shards, reduce buckets)
    and gathered peak, by its own count, and the bytes the allocators under
    it reserve at the end: its two own, or with `shared` the one pool
    PyTorch allocates from too (both "allocators" entries are that pool);
    the device bytes outside PyTorch's cache this variant added; and the
    optimizer state's bytes (in PyTorch)."""
    state_bytes = sum(t.numel() * t.element_size() for st in optimizer.state.values() for t in st.values()
                      if hasattr(t, "numel") and t.dim() > 0)
    reserved = 0
    if stats:
        pools = stats.get("allocators", {})
        reserved = pools.get("long_lived", {}).get("reserved", 0) if shared else sum(
            a["reserved"] for a in pools.values())
    return {"torch_peak_allocated_by_phase": dict(phases),
            "torch_peak_reserved_bytes": torch.cuda.max_memory_reserved() if cuda else 0,
            "optimizer_state_bytes": state_bytes,
            "manager_long_lived_bytes": sum(stats["long_lived_bytes"].values()) if stats else 0,
            "manager_gathered_peak_bytes": stats["gathered_bytes"]["peak"] if stats else 0,
            "manager_reserved_bytes": reserved,
            "device_bytes_outside_torch_added": outside_bytes}
