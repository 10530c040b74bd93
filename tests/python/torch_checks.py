"""What a PyTorch user does with the allocator, one check per process.

    python torch_checks.py ROUTE CHECK

ROUTE: torch (PyTorch's own allocator), native or pluggable (fragctl.torch.enable
with that route, policy from FRAGCTL_TEST_POLICY, default arena). The last line
printed is a JSON object with the check's findings; test_torch_backend.py
compares them across routes. Needs PyTorch 2.x and a CUDA GPU.
"""
import json
import os
import sys
import traceback

GiB = 1 << 30
MiB = 1 << 20
ROUTE = "torch"  # the route main() runs the check under


def setup(route):
    import torch
    if route in ("native", "pluggable"):
        import fragctl.torch
        fragctl.torch.enable(os.environ.get("FRAGCTL_TEST_POLICY", "arena"), route=route)
    return torch


def device_used():
    """Device memory in use, seen from the driver (the whole device)."""
    import torch
    free, total = torch.cuda.mem_get_info()
    return total - free


def check_memory_api(torch):
    """Every torch.cuda memory function: raises or not, and its value, with 2 GiB live."""
    out = {}
    x = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
    calls = {
        "memory_allocated": lambda: torch.cuda.memory_allocated(),
        "max_memory_allocated": lambda: torch.cuda.max_memory_allocated(),
        "memory_reserved": lambda: torch.cuda.memory_reserved(),
        "max_memory_reserved": lambda: torch.cuda.max_memory_reserved(),
        "memory_stats": lambda: {k: v for k, v in torch.cuda.memory_stats().items()
                                 if k in ("allocated_bytes.all.current", "reserved_bytes.all.current",
                                          "active_bytes.all.current", "requested_bytes.all.current",
                                          "num_alloc_retries", "num_ooms", "num_device_alloc",
                                          "allocation.all.current")},
        "memory_summary": lambda: len(torch.cuda.memory_summary()),
        "memory_snapshot": lambda: len(torch.cuda.memory_snapshot()),
        "list_gpu_processes": lambda: len(torch.cuda.list_gpu_processes()),
        "mem_get_info": lambda: torch.cuda.mem_get_info()[1],
        "get_allocator_backend": lambda: torch.cuda.get_allocator_backend(),
    }
    for name, call in calls.items():
        try:
            out[name] = call()
        except Exception as e:
            out[name] = "RAISES %s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
    try:
        torch.cuda.reset_peak_memory_stats()
        out["reset_peak_memory_stats"] = "ok"
    except Exception as e:
        out["reset_peak_memory_stats"] = "RAISES %s" % type(e).__name__
    y = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    del y
    out["max_memory_allocated_after_reset"] = _value(lambda: torch.cuda.max_memory_allocated())
    # Allocations and frees in a MemPool before the reset: its counts are reset too. PyTorch's
    # cudaMallocAsync backend (the one `fragctl run` uses) has no MemPool: there the reset alone.
    pool, in_pool = None, []
    if torch.cuda.get_allocator_backend() != "cudaMallocAsync":
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            in_pool = [torch.empty(MiB, dtype=torch.uint8, device="cuda") for _ in range(4)]
        del in_pool[1:]
    out["pool_before_reset"] = pool is not None
    try:
        torch.cuda.reset_accumulated_memory_stats()
        out["reset_accumulated_memory_stats"] = "ok"
    except Exception as e:
        out["reset_accumulated_memory_stats"] = "RAISES %s" % type(e).__name__
    out["accumulated_after_reset"] = _value(lambda: {
        k: v for k, v in torch.cuda.memory_stats().items()
        if k.endswith((".allocated", ".freed")) or k in ("num_alloc_retries", "num_ooms", "num_device_alloc",
                                                          "num_device_free")})
    del in_pool, pool
    del x
    torch.cuda.synchronize()
    before = device_used()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    out["empty_cache_returned"] = before - device_used()
    return out


def _value(call):
    try:
        return call()
    except Exception as e:
        return "RAISES %s" % type(e).__name__


def check_fraction(torch):
    """set_per_process_memory_fraction(0.05), then allocate 10% of the device."""
    total = torch.cuda.mem_get_info()[1]
    torch.cuda.set_per_process_memory_fraction(0.05)
    try:
        x = torch.empty(int(total * 0.10), dtype=torch.uint8, device="cuda")
        return {"capped": False, "fraction": _value(lambda: torch.cuda.get_per_process_memory_fraction())}
    except torch.cuda.OutOfMemoryError:
        small = torch.empty(int(total * 0.01), dtype=torch.uint8, device="cuda")  # below the cap: fine
        return {"capped": True, "below_cap_ok": small.numel() > 0}


def check_record_stream(torch, record=True, trials=3):
    """A side stream reads a tensor after the main stream freed it; the main
    stream allocates again at once and writes. With record_stream the read
    sees the original values."""
    results = []
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    n = 64 * MiB
    for trial in range(trials):
        x = torch.full((n,), 7.0, device="cuda")
        torch.cuda.synchronize()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)  # ~0.1 s: the read starts after the reuse below
            copy = x.clone()
        if record:
            x.record_stream(side)
        del x
        y = torch.empty(n, device="cuda")  # same size, main stream: the freed block if reusable
        y.fill_(-1.0)
        torch.cuda.synchronize()
        results.append(bool((copy == 7.0).all().item()))
        del y, copy
    return {"intact": results}


def check_graph(torch, replays=100):
    """torch.cuda.graph: outputs of 100 replays, and tensors allocated between replays untouched."""
    static_in = torch.randn(4096, 1024, device="cuda")
    weight = torch.randn(1024, 1024, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            (static_in @ weight).relu_()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        tmp = static_in @ weight  # freed inside the capture: its memory is reused inside the graph
        tmp2 = tmp.relu()
        del tmp
        static_out = tmp2 * 2.0 + 1.0
        del tmp2
    outputs_ok = 0
    between_ok = 0
    keep = []
    for i in range(replays):
        static_in.copy_(torch.full_like(static_in, float(i % 7) / 7.0))
        g.replay()
        expected = ((static_in @ weight).relu() * 2.0 + 1.0)
        outputs_ok += int(torch.allclose(static_out, expected, rtol=1e-3, atol=1e-3))
        t = torch.full((1 << 20,), float(i), device="cuda")  # allocated between replays
        keep.append((t, float(i)))
        torch.cuda.synchronize()
        between_ok += int(all(bool((k == v).all().item()) for k, v in keep[-8:]))
    keep_ok = all(bool((k == v).all().item()) for k, v in keep)
    del g
    return {"outputs_ok": outputs_ok, "between_ok": between_ok, "all_kept": keep_ok, "replays": replays}


def check_snapshot(torch):
    """memory_viz: _record_memory_history, _snapshot, _dump_snapshot."""
    import pickle
    import tempfile
    torch.cuda.memory._record_memory_history(max_entries=10000)
    xs = [torch.empty((i + 1) * MiB, dtype=torch.uint8, device="cuda") for i in range(8)]
    del xs[::2]
    snap = torch.cuda.memory._snapshot()
    path = os.path.join(tempfile.mkdtemp(), "snap.pickle")
    torch.cuda.memory._dump_snapshot(path)
    with open(path, "rb") as f:
        loaded = pickle.load(f)
    torch.cuda.memory._record_memory_history(enabled=None)
    traces = snap["device_traces"][0] if snap["device_traces"] else []
    actions = sorted({t["action"] for t in traces})
    frames = sum(1 for t in traces if t.get("frames"))
    live = sum(1 for seg in snap["segments"] for b in seg["blocks"] if b["state"] == "active_allocated")
    html = None
    try:
        from torch.cuda import _memory_viz
        html = len(_memory_viz.trace_plot(loaded))
    except Exception as e:
        html = "RAISES %s: %s" % (type(e).__name__, e)
    return {"segments": len(snap["segments"]), "live_blocks": live, "actions": actions, "entries_with_frames": frames,
            "pickle_keys": sorted(loaded.keys()), "trace_plot_chars": html, "path": path}


def check_cudnn_benchmark(torch):
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 7, stride=2, padding=3), torch.nn.ReLU(),
                              torch.nn.Conv2d(64, 128, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(128, 10)).cuda()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    losses = []
    for step in range(5):
        x = torch.randn(32, 3, 160 + 16 * step, 160 + 16 * step, device="cuda")
        loss = net(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"losses": losses}


def check_compile_reduce_overhead(torch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    compiled = torch.compile(model, mode="reduce-overhead")
    losses = []
    gen = torch.Generator(device="cuda").manual_seed(1)
    for step in range(12):
        x = torch.randn(256, 512, device="cuda", generator=gen)
        torch.compiler.cudagraph_mark_step_begin()
        loss = compiled(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return {"losses": losses}


def check_hf_trainer(torch):
    import tempfile
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=1000, n_positions=256))

    class data(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            ids = torch.randint(0, 1000, (128,), generator=g)
            return {"input_ids": ids, "labels": ids}

    args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=8, max_steps=8,
                             skip_memory_metrics=False, report_to=[], logging_steps=1, save_strategy="no",
                             seed=0, data_seed=0, dataloader_num_workers=0)
    trainer = Trainer(model=model, args=args, train_dataset=data())
    result = trainer.train()
    metrics = {k: v for k, v in result.metrics.items() if "gpu" in k or "mem" in k}
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"losses": losses, "memory_metrics": metrics}


def check_lightning(torch):
    import tempfile
    import lightning as L
    from lightning.pytorch.callbacks import DeviceStatsMonitor
    from lightning.pytorch.loggers import CSVLogger

    class module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))

        def training_step(self, batch, _):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(256, 64), torch.randn(256, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=32)
    logdir = tempfile.mkdtemp()
    trainer = L.Trainer(max_epochs=1, accelerator="gpu", devices=1, callbacks=[DeviceStatsMonitor()],
                        logger=CSVLogger(logdir), enable_progress_bar=False, enable_model_summary=False,
                        log_every_n_steps=1)
    trainer.fit(module(), loader)
    import csv
    import glob
    columns = set()
    for path in glob.glob(os.path.join(logdir, "**", "metrics.csv"), recursive=True):
        with open(path) as f:
            columns |= set(next(csv.reader(f)))
    memory_columns = sorted(c for c in columns if "allocated_bytes" in c or "reserved_bytes" in c)
    return {"memory_columns": len(memory_columns), "loss": float(trainer.callback_metrics["loss"])}


def check_fsdp2(torch):
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)]).cuda()
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator(device="cuda").manual_seed(1)
    losses = []
    for _ in range(8):
        x = torch.randn(64, 1024, device="cuda", generator=gen)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    dist.destroy_process_group()
    return {"losses": losses}


def check_mempool(torch):
    """torch.cuda.MemPool with use_mem_pool: values, no aliasing with tensors outside, a block freed in the
    pool reused by the pool and not by allocations outside it, the pool's memory back after it is gone."""
    n = 4 << 20  # 16 MiB of float32
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    reserved_start = torch.cuda.memory_reserved()
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        a = torch.full((n,), 3.0, device="cuda")
        b = torch.full((n // 16,), 5.0, device="cuda")
    outside = torch.full((n,), 7.0, device="cuda")
    spans = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in (a, b, outside)]
    disjoint = all(x[1] <= y[0] or y[1] <= x[0] for i, x in enumerate(spans) for y in spans[i + 1:])
    values_ok = bool((a == 3.0).all().item() and (b == 5.0).all().item() and (outside == 7.0).all().item())
    a_ptr = a.data_ptr()
    del a
    other = torch.empty((n,), device="cuda")  # outside the pool: not the pool's freed block
    with torch.cuda.use_mem_pool(pool):
        again = torch.empty((n,), device="cuda")  # in the pool: its freed block
    reused_in_pool = again.data_ptr() == a_ptr
    outside_kept_out = other.data_ptr() != a_ptr
    del b, again
    torch.cuda.synchronize()
    del pool
    torch.cuda.empty_cache()
    reserved_end = torch.cuda.memory_reserved()
    held_outside = (outside.numel() + other.numel()) * 4
    del outside, other
    return {"values_ok": values_ok, "disjoint": disjoint, "reused_in_pool": reused_in_pool,
            "outside_kept_out": outside_kept_out, "reserved_start": reserved_start, "reserved_end": reserved_end,
            "held_outside": held_outside}


def check_mempool_graph(torch, replays=20):
    """torch.cuda.graph captured into a MemPool(allocator=X), X another allocator object to PyTorch (a
    CUDAPluggableAllocator over libfragctl's fragctl_torch_alloc/fragctl_torch_free), with frees inside the
    capture: one on the capture stream (its block taken by the next allocation of that size, in stream order)
    and one of a tensor a side stream of the capture used (record_stream), followed by an allocation of that
    size on the side stream, which must not wait on events of the capture. Replays give the eager values; the
    pool's blocks go back to X once the pool and the graph are gone (native route)."""
    import gc
    import fragctl
    n = 1 << 20
    x_alloc = torch.cuda.memory.CUDAPluggableAllocator(fragctl.library_path(), "fragctl_torch_alloc",
                                                       "fragctl_torch_free")
    pool = torch.cuda.MemPool(x_alloc.allocator())
    static_in = torch.zeros(n, device="cuda")

    def reference(v):
        a = v * 2 + 1
        return (a.square() + 3) * 0.5 + 1 + a.square()

    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    with torch.cuda.graph(g, pool=pool.id):
        cur = torch.cuda.current_stream()
        a = static_in * 2 + 1
        a_ptr = a.data_ptr()
        b = a.square()
        del a  # freed in the capture, on the capture stream
        c = b + 3  # same size, same stream: a's block
        reused = c.data_ptr() == a_ptr
        d = c * 0.5
        del c
        side.wait_stream(cur)  # the side stream joins the capture
        with torch.cuda.stream(side):
            e = d + 1
            d.record_stream(side)
        del d  # used on the side stream: nothing reuses it during the capture
        with torch.cuda.stream(side):
            f = torch.empty_like(e)  # d's size on the side stream
            f.copy_(e)
        cur.wait_stream(side)
        out = f + b
        del b, e, f
    outputs_ok = 0
    for i in range(replays):
        v = (torch.arange(n, device="cuda", dtype=torch.float32) + i) % 7
        static_in.copy_(v)
        g.replay()
        torch.cuda.synchronize()
        outputs_ok += int(torch.equal(out, reference(v)))
    found = {"replays": replays, "outputs_ok": outputs_ok, "reused_in_capture": reused}
    del out, g, static_in
    gc.collect()
    torch.cuda.synchronize()
    del pool
    gc.collect()
    torch.cuda.empty_cache()
    if ROUTE == "native":
        import fragctl.torch
        found["forwarded_blocks_left"] = fragctl.torch.forwarded_pools(0)["blocks"]
    if outputs_ok != replays:
        raise AssertionError("%d of %d replays gave the eager values" % (outputs_ok, replays))
    return found


def check_ipc(torch, control=False):
    """CUDA IPC through torch.multiprocessing: benchmarks/interop/ipc_share.py with this route in both
    processes (its producer and consumer), in processes of its own. ``control``: its --control, which shares
    the blocks past PyTorch's reference counting (fragctl routes only): the consumer must see them overwritten."""
    import subprocess
    route = ROUTE
    producer = "native" if route == "torch" else os.environ.get("FRAGCTL_TEST_POLICY", "arena")
    consumer = "native" if route == "torch" else "fragctl"
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks", "interop",
                          "ipc_share.py")
    done = subprocess.run([sys.executable, script, "--producer", producer, "--consumer", consumer]
                          + (["--control"] if control else []), capture_output=True, text=True, timeout=600)
    lines = done.stdout.strip().splitlines()
    found = json.loads(lines[-1]) if lines else {"stderr": done.stderr[-2000:]}
    found["exit"] = done.returncode
    return found


CHECKS = {name[len("check_"):]: fn for name, fn in globals().items() if name.startswith("check_")}


def main():
    route, name = sys.argv[1], sys.argv[2]
    global ROUTE
    ROUTE = route
    torch = setup(route)
    kwargs = {}
    if name == "record_stream_control":
        name, kwargs = "record_stream", {"record": False}
    if name == "ipc_control":
        name, kwargs = "ipc", {"control": True}
    try:
        result = {"ok": True, **CHECKS[name](torch, **kwargs)}
    except Exception as e:
        result = {"ok": False, "error": "%s: %s" % (type(e).__name__, e), "traceback": traceback.format_exc()[-3000:]}
    if route in ("native", "pluggable"):
        import fragctl
        import fragctl.torch
        result["route"] = fragctl.torch.route()
        try:
            st = fragctl.stats(0)
            result["fragctl_peak_requested"] = st["requested_bytes"]["peak"]
            result["fragctl_peak_reserved"] = st["reserved_bytes"]["peak"]
        except Exception as e:
            result["fragctl_stats_error"] = str(e)
    sys.stdout.flush()
    print(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
