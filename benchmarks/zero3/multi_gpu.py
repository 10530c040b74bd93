"""ZeRO-3 on several GPUs beside FSDP2 (issue 31, deliverable 3).

One process per GPU over NCCL (gloo on CPU ranks, a check of the script),
each variant in its own job, the same model, weights, data and seed:

* ``fsdp2``: FSDP2 (``fully_shard`` on each decoder layer and the root) on
  PyTorch's native allocator;
* ``fsdp2-arena``: the same after ``fragctl.torch.enable("arena")``;
* ``zero3-arena``: ``fragctl.torch.zero3.shard`` (one block per decoder
  layer) after ``enable("arena")``: the manager allocates from PyTorch's
  allocator, one pool;
* ``zero3-caching``: the same after ``enable("caching")``;
* ``zero3-arena-ahead2`` (named in ``--variants`` only): ``zero3-arena``
  gathering two decoder layers ahead of the one computing
  (``stage3_prefetch_bucket_size`` of 1.5 layers) where DeepSpeed's default
  (5e7 elements, half a layer here) gathers one, as FSDP2 does.

The model is a Hugging Face Llama from a LlamaConfig (random weights, bf16;
benchmarks/services/workload.py builds it), trained with AdamW; each step's
sequence length is drawn from a fixed seed (the same on every rank), each
rank's tokens from the step and the rank, so every variant sees the same
data. Per job the parent samples every GPU's used memory from outside
through NVML (its peak above the used bytes before the job started: the
CUDA context, NCCL and the allocator's reserve included). Per rank the job
records losses, step times, ``num_alloc_retries`` in the steady steps,
fragctl's driver calls per steady step (under enable()), the manager's
statistics (gathered bytes against its budget, time stalled in fetches),
the time of each of the manager's collectives in the steady steps (CUDA
events on the stream it runs them on), and then, with the model idle, the
bus bandwidth of the manager's collective callbacks against
``all_gather_into_tensor`` / ``reduce_scatter_tensor`` on the same buffers.

    python3 benchmarks/zero3/multi_gpu.py --nproc 2 --repeat 2 --out DIR

writes DIR/multi_gpu.json (every rank's row) and DIR/multi_gpu.md (tables).
"""
import argparse
import ctypes
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SERVICES = os.path.join(HERE, "..", "services")

# variant -> (row name, policy enable() installs or None, wrapper: "fsdp2" or "zero3")
VARIANTS = {
    "fsdp2": ("FSDP2, PyTorch's allocator", None, "fsdp2"),
    "fsdp2-arena": ("FSDP2, enable(\"arena\")", "arena", "fsdp2"),
    "zero3-arena": ("zero3.shard, enable(\"arena\")", "arena", "zero3"),
    "zero3-caching": ("zero3.shard, enable(\"caching\")", "caching", "zero3"),
    "zero3-arena-ahead2": ("zero3.shard, enable(\"arena\"), 2 layers ahead", "arena", "zero3"),
}
# zero3 variants -> decoder layers gathered ahead of the one computing (the
# others: DeepSpeed's default stage3_prefetch_bucket_size)
LAYERS_AHEAD = {"zero3-arena-ahead2": 2}


def zero3_config(model, variant):
    """shard()'s DeepSpeed config for a zero3 variant: stage 3 at DeepSpeed's
    defaults, with a prefetch bucket of (layers ahead - 0.5) decoder layers
    where LAYERS_AHEAD names the variant (the manager gathers ahead while
    the bytes gathered ahead are below the bucket)."""
    ahead = LAYERS_AHEAD.get(variant)
    if not ahead:
        return {"stage": 3}
    layer = sum(p.numel() for p in model.model.layers[0].parameters())
    return {"stage": 3, "stage3_prefetch_bucket_size": int((ahead - 0.5) * layer)}
NCCL_SAFE = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def options(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--nproc", type=int, default=2, help="ranks: one process per GPU")
    p.add_argument("--variants", default=",".join(v for v in VARIANTS if v not in LAYERS_AHEAD),
                   help="comma-separated; default: all but the prefetch-depth ones (%s)" % ", ".join(LAYERS_AHEAD))
    p.add_argument("--repeat", type=int, default=1, help="rounds of every variant, alternated")
    p.add_argument("--model", default="llama", choices=["llama", "torch"],
                   help="torch: a torch.nn decoder (workload.py), where transformers is missing")
    # 1.26 B parameters: TinyLlama's widths, 22 layers, full multi-head attention.
    p.add_argument("--layers", type=int, default=22)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--intermediate", type=int, default=5632)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=2, help="sequences per rank per step")
    p.add_argument("--seq-min", type=int, default=1024)
    p.add_argument("--seq-max", type=int, default=4096, help="also the model's max_position_embeddings")
    p.add_argument("--seq-step", type=int, default=256, help="sequence lengths are multiples of this")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10, help="steps left out of the steady figures")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--bandwidth-iters", type=int, default=20, help="timed calls per buffer size and path")
    p.add_argument("--job-timeout", type=int, default=240, help="seconds a job may take before its ranks are killed")
    p.add_argument("--group-timeout", type=float, default=120.0, help="init_process_group(timeout=) in seconds")
    p.add_argument("--port", type=int, default=29671)
    p.add_argument("--jobs-dir", help="where each job's rank rows go (default: OUT/jobs)")
    p.add_argument("--job", help=argparse.SUPPRESS)  # a rank of this variant (internal)
    args = p.parse_args(argv)
    args.seq = args.seq_max  # workload.build_model reads args.seq (max_position_embeddings)
    return args


# --- the parent: jobs, sampling, tables ------------------------------------------


class DeviceSampler:
    """Every GPU's used bytes from NVML (libnvidia-ml, no CUDA context in this
    process), sampled about every 10 ms in a thread. The peak per GPU over
    the whole job and, once every file of `markers` exists (each rank
    writes one when its training steps are done), the peak until then."""

    class Memory(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    def __init__(self, count, markers=()):
        self.markers = list(markers)
        self.training_peaks = None
        self.nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if self.nvml.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit_v2 failed")
        self.handles = []
        for i in range(count):
            handle = ctypes.c_void_p()
            if self.nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0:
                raise RuntimeError("nvmlDeviceGetHandleByIndex_v2(%d) failed" % i)
            self.handles.append(handle)
        self.baseline = self.used()
        self.peaks = list(self.baseline)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def used(self):
        out = []
        for handle in self.handles:
            m = self.Memory()
            self.nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(m))
            out.append(m.used)
        return out

    def _run(self):
        while not self.stopping.is_set():
            self.peaks = [max(a, b) for a, b in zip(self.peaks, self.used())]
            if self.training_peaks is None and self.markers and all(os.path.exists(m) for m in self.markers):
                self.training_peaks = list(self.peaks)
            time.sleep(0.01)

    def stop(self):
        """Per GPU, above the baseline: (the job's peak used bytes, the peak
        until the markers appeared or None)."""
        self.stopping.set()
        self.thread.join()
        self.peaks = [max(a, b) for a, b in zip(self.peaks, self.used())]
        training = [p - b for p, b in zip(self.training_peaks, self.baseline)] if self.training_peaks else None
        return [p - b for p, b in zip(self.peaks, self.baseline)], training


def free_port(preferred):
    for port in range(preferred, preferred + 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port from %d" % preferred)


def launch(argv, nproc, port, env_extra=None):
    """Starts `argv` once per rank with torchrun's environment; the processes."""
    processes = []
    for rank in range(nproc):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                   LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   CUDA_DEVICE_ORDER="PCI_BUS_ID", PYTHONUNBUFFERED="1", **NCCL_SAFE)
        env.update(env_extra or {})
        processes.append(subprocess.Popen(argv, env=env))
    return processes


def wait_all(processes, timeout):
    """Waits for every process until `timeout` s; kills the rest. Exit codes
    (None: killed here)."""
    deadline = time.monotonic() + timeout
    codes = []
    for p in processes:
        try:
            codes.append(p.wait(max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(None)
    for p in processes:
        if p.poll() is None:
            p.kill()
            p.wait()
    return codes


def run_job(args, key, index):
    """One variant on --nproc ranks; its record with every rank's row."""
    directory = os.path.join(args.jobs_dir or os.path.join(args.out, "jobs"), "%02d-%s" % (index, key))
    os.makedirs(directory, exist_ok=True)
    argv = [sys.executable, os.path.abspath(__file__), "--job", key, "--out", directory]
    for name in ("device", "nproc", "model", "layers", "hidden", "heads", "intermediate", "vocab", "batch",
                 "seq_min", "seq_max", "seq_step", "steps", "warmup", "seed", "bandwidth_iters", "group_timeout"):
        argv += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    markers = [os.path.join(directory, "trained-%d" % r) for r in range(args.nproc)]
    sampler = DeviceSampler(args.nproc, markers) if args.device == "cuda" else None
    began = time.monotonic()
    print("[%s] %s on %d ranks ..." % (time.strftime("%H:%M:%S"), VARIANTS[key][0], args.nproc), flush=True)
    try:
        codes = wait_all(launch(argv, args.nproc, free_port(args.port + 10 * index)), args.job_timeout)
    finally:
        peaks, training = sampler.stop() if sampler is not None else ([0] * args.nproc, None)
    job = {"variant": key, "name": VARIANTS[key][0], "round": index // max(1, len(args.variant_list)),
           "exit_codes": codes, "seconds": round(time.monotonic() - began, 1), "peak_device_bytes": peaks,
           "peak_device_bytes_training": training, "ranks": []}
    for rank in range(args.nproc):
        path = os.path.join(directory, "rank-%d.json" % rank)
        if os.path.exists(path):
            with open(path) as f:
                job["ranks"].append(json.load(f))
        else:
            job["ranks"].append({"rank": rank, "missing": "no row (exit code %s)" % codes[rank]})
    summarize(job)
    print("[%s]   %s" % (time.strftime("%H:%M:%S"), json.dumps({k: job.get(k) for k in (
        "tokens_per_s", "peak_device_gib", "torch_max_reserved_gib", "outside_torch_max_gib", "retries_steady",
        "exit_codes", "missing")})), flush=True)
    return job


def summarize(job):
    """The job's figures over its ranks."""
    ranks = [r for r in job["ranks"] if "missing" not in r]
    missing = [r["missing"] for r in job["ranks"] if "missing" in r]
    if missing:
        job["missing"] = missing[0]
    if not ranks or len(ranks) != len(job["ranks"]):
        return
    steady_tokens = sum(r["steady_tokens"] for r in ranks)
    steady_seconds = max(r["steady_seconds"] for r in ranks)
    job["tokens_per_s"] = steady_tokens / steady_seconds if steady_seconds else 0.0
    job["step_seconds_median"] = statistics.median(ranks[0]["step_seconds"][ranks[0]["warmup"]:])
    job["losses"] = [statistics.fmean(step) for step in zip(*(r["losses"] for r in ranks))]
    # The training steps' peak where the sampler saw every rank's marker (runs from
    # 2026-11-26 14:00 UTC on), else the whole job's, the idle bandwidth phase included.
    job["peak_device_gib"] = [round(p / 2**30, 3) for p in
                              job.get("peak_device_bytes_training") or job["peak_device_bytes"]]
    job["peak_device_gib_job"] = [round(p / 2**30, 3) for p in job["peak_device_bytes"]]
    job["retries_steady"] = max(r["retries_steady"] for r in ranks)
    calls = [r["fragctl_memory_calls_per_steady_step"] for r in ranks if r.get("fragctl_memory_calls_per_steady_step")
             is not None]
    job["fragctl_memory_calls_per_steady_step"] = max(calls) if calls else None
    job["torch_max_reserved_gib"] = [round(r["torch_max_reserved"] / 2**30, 3) for r in ranks]
    job["outside_torch_max_gib"] = [round(r["outside_torch_bytes"]["steps_max"] / 2**30, 3) for r in ranks]


def gib(x):
    return "%.2f" % (x / 2**30)


def tables(args, jobs):
    """Markdown: one row per job, then the collectives of the zero3 jobs."""
    lines = ["| round | variant | tokens/s (all ranks) | median step (s) | peak device GiB per GPU in training (NVML) "
             "| retries (steady) | fragctl driver calls / steady step | first / last loss | max loss diff to FSDP2 "
             "| gathered peak / budget GiB | host s in collectives / steady step (torch.distributed's part) |",
             "| --- | --- | ---: | ---: | --- | ---: | ---: | --- | ---: | --- | ---: |"]
    baseline = {}
    for job in jobs:
        if job["variant"] == "fsdp2" and "losses" in job:
            baseline[job["round"]] = job
    for job in jobs:
        if "tokens_per_s" not in job:
            lines.append("| %d | %s | not run: %s | | | | | | | | |" % (job["round"], job["name"], job.get("missing")))
            continue
        ref = baseline.get(job["round"])
        diff = max(abs(a - b) for a, b in zip(job["losses"], ref["losses"])) if ref else None
        job["max_loss_diff_to_fsdp2"] = diff
        ratio = " (%.3fx)" % (job["tokens_per_s"] / ref["tokens_per_s"]) if ref and ref is not job else ""
        z = job["ranks"][0].get("zero3")
        lines.append("| %d | %s | %.0f%s | %.3f | %s | %d | %s | %.4f / %.4f | %s | %s | %s |" % (
            job["round"], job["name"], job["tokens_per_s"], ratio, job["step_seconds_median"],
            " / ".join("%.2f" % g for g in job["peak_device_gib"]), job["retries_steady"],
            "%.1f" % job["fragctl_memory_calls_per_steady_step"]
            if job["fragctl_memory_calls_per_steady_step"] is not None else "-",
            job["losses"][0], job["losses"][-1], "%.5f" % diff if diff is not None else "-",
            "%s / %s" % (gib(z["gathered_bytes"]["peak"]), gib(z["budget"]["max_live_bytes"])) if z else "-",
            "%.4f (%.4f)" % (job["ranks"][0]["stall_seconds_per_steady_step"],
                             job["ranks"][0].get("issue_seconds_per_steady_step", 0.0)) if z else "-"))
    lines += ["", "Collectives of the zero3 jobs, rank 0. In training: the manager's collectives in the steady "
              "steps, timed by CUDA events on the stream it runs them on (waits for the other ranks and "
              "contention with compute included). Idle: the manager's collective callback "
              "(fragctl.torch._collectives) against torch.distributed on the same buffers, "
              "%d calls each, after training. Bus bandwidth = bytes x (N-1)/N / time." % args.bandwidth_iters, "",
              "| round | variant | collective | MiB per call | calls / steady step | in training: GB/s bus "
              "| idle, zero3 callback: GB/s bus | idle, torch.distributed: GB/s bus | zero3 / torch |",
              "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for job in jobs:
        if "tokens_per_s" not in job:
            continue
        r0 = job["ranks"][0]
        for entry in r0.get("bandwidth", []):
            situ = r0["in_training"].get("%s %d" % (entry["collective"], entry["bytes"]), {})
            lines.append("| %d | %s | %s | %.1f | %.1f | %s | %.1f | %.1f | %.3f |" % (
                job["round"], job["name"], entry["collective"], entry["bytes"] / 2**20,
                situ.get("calls_per_step", 0), "%.1f" % situ["busbw_gbs"] if situ.get("busbw_gbs") else "-",
                entry["zero3_busbw_gbs"], entry["torch_busbw_gbs"],
                entry["zero3_busbw_gbs"] / entry["torch_busbw_gbs"] if entry["torch_busbw_gbs"] else 0))
    return lines


def parent(args):
    args.variant_list = [v for v in args.variants.split(",") if v]
    for v in args.variant_list:
        if v not in VARIANTS:
            raise SystemExit("unknown variant %r; known: %s" % (v, ", ".join(VARIANTS)))
    os.makedirs(args.out, exist_ok=True)
    if args.device == "cuda" and any(VARIANTS[v][1] for v in args.variant_list):
        began = time.monotonic()  # enable()'s native module is compiled on first use: not inside a timed job
        from fragctl import _native
        _native.load()
        print("fragctl's native torch module ready in %.0f s" % (time.monotonic() - began), flush=True)
    jobs = []
    for round_ in range(args.repeat):
        for v in args.variant_list:
            jobs.append(run_job(args, v, len(jobs)))
            write(args, jobs)
    lines = write(args, jobs)
    print("\n".join(lines), flush=True)
    return 0 if all("tokens_per_s" in j for j in jobs) else 1


def write(args, jobs):
    lines = tables(args, jobs)
    settings = {k: v for k, v in vars(args).items() if k not in ("job",)}
    with open(os.path.join(args.out, "multi_gpu.json"), "w") as f:
        json.dump({"settings": settings, "jobs": jobs}, f, indent=1)
    with open(os.path.join(args.out, "multi_gpu.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return lines


# --- a rank ----------------------------------------------------------------------


def sequence_lengths(args):
    """Each step's sequence length, the same on every rank and in every variant."""
    draw = random.Random(args.seed)
    choices = list(range(args.seq_min, args.seq_max + 1, args.seq_step))
    return [draw.choice(choices) for _ in range(args.steps)]


def batches(args, torch, rank):
    out = []
    for step, length in enumerate(sequence_lengths(args)):
        g = torch.Generator().manual_seed(args.seed * 1000003 + step * 1009 + rank)
        out.append(torch.randint(0, args.vocab, (args.batch, length), generator=g))
    return out


class CollectiveClock:
    """Times the manager's collective callbacks (TorchCollectives._gather and
    _scatter, wrapped before shard()): per call, its kind, bytes (gathered,
    or reduced input) and CUDA events on the stream it runs on."""

    def __init__(self, torch, device):
        from fragctl.torch import _collectives
        self.torch, self.device, self.calls = torch, device, []
        self.streams, self.events = {}, []  # CUDA: handle -> ExternalStream; (start, end) per call of a step
        self.module = _collectives
        self.original = (_collectives.TorchCollectives._gather, _collectives.TorchCollectives._scatter)
        clock = self

        def gather(collectives, context, parts, count, stream, tag):
            nbytes = sum(parts[i].bytes for i in range(count)) * collectives.size
            return clock.timed(clock.original[0], "all_gather", nbytes, stream,
                               (collectives, context, parts, count, stream, tag))

        def scatter(collectives, context, parts, count, dtype, stream, tag):
            width = 4 if dtype == 3 else (1 if dtype == 0 else 2)
            nbytes = sum(parts[i].elements for i in range(count)) * width * collectives.size
            return clock.timed(clock.original[1], "reduce_scatter", nbytes, stream,
                               (collectives, context, parts, count, dtype, stream, tag))
        _collectives.TorchCollectives._gather = gather
        _collectives.TorchCollectives._scatter = scatter

    def timed(self, function, kind, nbytes, stream, call):
        torch = self.torch
        if self.device.type != "cuda":
            began = time.perf_counter()
            rc = function(*call)
            self.calls.append((kind, nbytes, time.perf_counter() - began))
            return rc
        # The clock's own host time counts in the manager's stall and in the
        # step: streams and events are made once and reused every step.
        s = self.streams.get(stream)
        if s is None:
            s = self.streams[stream] = torch.cuda.ExternalStream(stream or 0, device=self.device)
        used = len(self.calls)
        while len(self.events) <= used:
            self.events.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
        start, end = self.events[used]
        start.record(s)
        rc = function(*call)
        end.record(s)
        self.calls.append((kind, nbytes, (start, end)))
        return rc

    def time_issue(self, collectives):
        """Also times, on the host, the torch.distributed calls inside the
        callbacks of `collectives` (a TorchCollectives): the part of the
        manager's host time in collectives that is PyTorch's issuing them."""
        clock = self
        self.issue_seconds = 0.0

        def timed(function):
            def call(*args, **kwargs):
                began = time.perf_counter()
                try:
                    return function(*args, **kwargs)
                finally:
                    clock.issue_seconds += time.perf_counter() - began
            return call
        for name in ("_gather_flat", "_scatter_flat"):
            if getattr(collectives, name, None) is not None:
                setattr(collectives, name, timed(getattr(collectives, name)))

    def take(self):
        """The calls since the last take, as (kind, bytes, seconds); after a
        synchronize (their events are reused from the next call on)."""
        out = [(k, n, t if isinstance(t, float) else t[0].elapsed_time(t[1]) / 1000.0) for k, n, t in self.calls]
        self.calls = []
        return out

    def restore(self):
        self.module.TorchCollectives._gather, self.module.TorchCollectives._scatter = self.original


def in_training(calls, steps, world):
    """Per (kind, bytes): calls per step, seconds, bus bandwidth in GB/s."""
    out = {}
    for kind, nbytes, seconds in calls:
        e = out.setdefault("%s %d" % (kind, nbytes), {"collective": kind, "bytes": nbytes, "calls": 0, "seconds": 0.0})
        e["calls"] += 1
        e["seconds"] += seconds
    for e in out.values():
        e["calls_per_step"] = e["calls"] / max(1, steps)
        e["busbw_gbs"] = e["bytes"] * e["calls"] * (world - 1) / world / e["seconds"] / 1e9 if e["seconds"] else 0.0
    return out


def bandwidth(args, torch, sharded, sizes, world, rank):
    """With the model idle: per (kind, bytes), the manager's callback
    (TorchCollectives._gather / _scatter, the code the manager calls) and
    torch.distributed's all_gather_into_tensor / reduce_scatter_tensor on the
    same buffers, --bandwidth-iters calls each, alternated twice; the better
    round of each. On gloo (CPU) the reference is all_gather / all_reduce."""
    import torch.distributed as dist
    from fragctl.torch import _collectives
    collectives = sharded._collectives
    device = sharded.device
    cuda = device.type == "cuda"
    out = []
    dtype = sharded.dtype  # bf16 on GPUs; float32 on CPU (gloo has no bf16)
    width = torch.tensor([], dtype=dtype).element_size()
    code = {torch.float16: 1, torch.bfloat16: 2, torch.float32: 3}[dtype]
    for kind, key in sizes:
        nbytes = key - key % (world * width)
        full = torch.zeros(nbytes // width, dtype=dtype, device=device)
        part = torch.ones(nbytes // width // world, dtype=dtype, device=device)
        stream = torch.cuda.current_stream(device).cuda_stream if cuda else None
        tag = b"bandwidth"
        if kind == "all_gather":
            parts = (_collectives.GatherPart * 1)(_collectives.GatherPart(part.data_ptr(), full.data_ptr(),
                                                                           nbytes // world))

            def via_zero3():
                if collectives._gather(None, parts, 1, stream, tag) != 0:
                    raise RuntimeError("the manager's all_gather callback failed: %s" % (collectives.failure,))

            def via_torch():
                if cuda:
                    dist.all_gather_into_tensor(full, part)
                else:
                    dist.all_gather(list(full.chunk(world)), part)
        else:
            parts = (_collectives.ScatterPart * 1)(_collectives.ScatterPart(full.data_ptr(), part.data_ptr(),
                                                                             part.numel()))

            def via_zero3():
                if collectives._scatter(None, parts, 1, code, stream, tag) != 0:
                    raise RuntimeError("the manager's reduce_scatter callback failed: %s" % (collectives.failure,))

            def via_torch():
                if cuda:
                    dist.reduce_scatter_tensor(part, full)
                else:
                    dist.all_reduce(full)
        best = {"zero3": None, "torch": None}
        for _ in range(2):
            for name, call in (("zero3", via_zero3), ("torch", via_torch)):
                for _ in range(2):
                    call()
                if cuda:
                    torch.cuda.synchronize()
                dist.barrier()
                began = time.perf_counter()
                for _ in range(args.bandwidth_iters):
                    call()
                if cuda:
                    torch.cuda.synchronize()
                seconds = (time.perf_counter() - began) / args.bandwidth_iters
                best[name] = seconds if best[name] is None else min(best[name], seconds)
        bus = nbytes * (world - 1) / world / 1e9
        out.append({"collective": kind, "bytes": key, "zero3_seconds": best["zero3"],
                    "torch_seconds": best["torch"], "zero3_busbw_gbs": bus / best["zero3"],
                    "torch_busbw_gbs": bus / best["torch"]})
    return out


def rank_job(args):
    """One rank of one variant: trains, writes rank-<r>.json into --out."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    name, policy, wrapper = VARIANTS[args.job]
    cuda = args.device == "cuda"
    row = {"rank": rank, "variant": args.job, "warmup": args.warmup}
    try:
        import fragctl.torch
        import fragctl.torch.zero3
        import torch
        if policy and cuda:
            fragctl.torch.enable(policy)  # before any CUDA allocation
        row.update(train(args, torch, fragctl, rank, world, local, wrapper, policy))
    except Exception as e:  # noqa: BLE001 (the parent reports it)
        import traceback
        traceback.print_exc()
        row["missing"] = "failed: %s: %s" % (type(e).__name__, str(e)[:300])
    with open(os.path.join(args.out, "rank-%d.json" % rank), "w") as f:
        json.dump(row, f)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no teardown of the communicators: the job's figures are written


def trained(args, rank, world, wait=30.0):
    """Marks this rank's training steps done (the parent's sampler freezes
    the training peak once every rank has) and waits until every rank's
    mark exists, and 50 ms more for the sampler, before anything else runs."""
    with open(os.path.join(args.out, "trained-%d" % rank), "w"):
        pass
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and not all(
            os.path.exists(os.path.join(args.out, "trained-%d" % r)) for r in range(world)):
        time.sleep(0.005)
    time.sleep(0.05)


def train(args, torch, fragctl, rank, world, local, wrapper, policy):
    import datetime
    import torch.distributed as dist
    sys.path.insert(0, SERVICES)
    import workload
    import services_zero3
    cuda = args.device == "cuda"
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.group_timeout))
    args.device = device.type  # workload.build_model reads it; the model goes to the current device
    if cuda:
        services_zero3.warm_up_collectives(torch, "cuda")
    data = batches(args, torch, rank)
    clock = CollectiveClock(torch, device) if wrapper == "zero3" else None
    model = workload.build_model(args, torch)
    parameters = sum(p.numel() for p in model.parameters())
    if wrapper == "fsdp2":
        wrap = services_zero3.fsdp2_wrapper(torch)
        if isinstance(wrap, str):
            raise RuntimeError(wrap)
        model = wrap(model)
    else:
        layer_type = type(model.model.layers[0])
        model = fragctl.torch.zero3.shard(model, config=zero3_config(model, args.job), block_types=(layer_type,))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses, times, tokens, retries, calls, stalls, situ, outside = [], [], [], [], [], [], [], []
    issued = []  # zero3: host seconds in torch.distributed's calls inside the manager's collectives, cumulative
    if clock is not None and cuda:
        clock.time_issue(model._collectives)

    def outside_torch():
        """Device bytes in use (this GPU, every process) that PyTorch's allocator has not reserved."""
        free, total = torch.cuda.mem_get_info(device)
        return total - free - torch.cuda.memory_reserved(device)
    outside_after_build = outside_torch() if cuda else 0
    for step, batch in enumerate(data):
        ids = batch.to(device)
        workload.synchronize(torch, args.device)
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        workload.synchronize(torch, args.device)
        times.append(time.perf_counter() - start)
        tokens.append(ids.numel())
        losses.append(loss.item())
        if cuda:
            retries.append(torch.cuda.memory_stats().get("num_alloc_retries", 0))
            outside.append(outside_torch())
            if policy:
                calls.append(fragctl.stats()["backend_counters"]["memory_calls"])
        if clock is not None:
            taken = clock.take()
            if step >= args.warmup:
                situ += taken
            stalls.append(model.stats()["stall_seconds"])
            issued.append(getattr(clock, "issue_seconds", 0.0))
    trained(args, rank, world)
    w = args.warmup
    steady = len(times) - w
    row = {"parameters": parameters, "losses": losses, "step_seconds": times, "tokens": tokens,
           "steady_tokens": sum(tokens[w:]), "steady_seconds": sum(times[w:]),
           "retries_steady": retries[-1] - retries[w - 1] if len(retries) > w else 0,
           "fragctl_memory_calls_per_steady_step": (calls[-1] - calls[w - 1]) / steady if len(calls) > w else None,
           "torch_max_reserved": torch.cuda.max_memory_reserved() if cuda else 0,
           "torch_max_allocated": torch.cuda.max_memory_allocated() if cuda else 0,
           "outside_torch_bytes": {"after_build": outside_after_build, "first_step": outside[0] if outside else 0,
                                   "steps_max": max(outside) if outside else 0,
                                   "last_step": outside[-1] if outside else 0}}
    if cuda:
        row["device_name"] = torch.cuda.get_device_name(device)
        row["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else None
    row["torch"] = torch.__version__
    if policy and cuda:
        row["fragctl_stats_end"] = {k: fragctl.stats().get(k) for k in ("backend_counters",)}
    if clock is not None:
        clock.restore()
        row["zero3"] = model.stats()
        # The manager's stall_seconds: host time inside its collective
        # callbacks (on GPUs they queue the collective; the host waits for
        # no device work there); the torch.distributed calls' part of it.
        row["stall_seconds_per_steady_step"] = (stalls[-1] - stalls[w - 1]) / steady if len(stalls) > w else 0.0
        row["issue_seconds_per_steady_step"] = (issued[-1] - issued[w - 1]) / steady if len(issued) > w else 0.0
        row["in_training"] = in_training(situ, steady, world)
        # The most frequent sizes of each kind (a decoder layer's block, then the embedding and head).
        sizes = []
        for kind in ("all_gather", "reduce_scatter"):
            ranked = sorted((e for e in row["in_training"].values() if e["collective"] == kind),
                            key=lambda e: (-e["calls"], -e["bytes"]))
            sizes += [(kind, e["bytes"]) for e in ranked[:2]]
        row["bandwidth"] = bandwidth(args, torch, model, sizes, world, rank)
    return row


def main(argv=None):
    args = options(argv)
    for k, v in NCCL_SAFE.items():
        os.environ[k] = v
    if args.job:
        return rank_job(args)
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
