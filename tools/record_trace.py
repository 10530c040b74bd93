#!/usr/bin/env python3
"""Record a GPU allocation trace from a PyTorch program, as fragctl CSV.

The program runs under PyTorch's allocator history recorder
(torch.cuda.memory._record_memory_history); when it ends (normally, by an
exception, or by sys.exit) the recorded history of one device is written as
fragctl CSV -- action,addr,size,stream,time_us with PyTorch's action names --
ready for `fragctl replay`. See docs/traces.md.

    # record any training script (its own arguments after "--")
    python3 tools/record_trace.py --out trace.csv.gz -- train.py --epochs 1

    # the built-in demo: a small GPT-like model, random weights, no downloads
    python3 tools/record_trace.py --out sample.trace.csv.gz --demo gpt --steps 3

    # from Python
    from record_trace import record
    with record("trace.csv.gz"):
        train()

Only torch is needed; nothing is downloaded. The CSV keeps every row PyTorch
recorded (segment_*, free_completed too); fragctl's reader replays alloc and
free_requested and counts the rest.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gzip
import io
import os
import random
import runpy
import sys
from typing import Any, Iterator, Optional

CSV_HEADER = ["action", "addr", "size", "stream", "time_us"]
DEFAULT_MAX_ENTRIES = 10_000_000


# --- Snapshot -> fragctl CSV (pure Python; testable without torch) -----------


def _open_text(path: str):
    if path.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "wb", compresslevel=6), encoding="ascii", newline="")
    return open(path, "w", encoding="ascii", newline="")


def snapshot_events(snapshot: dict, device: Optional[int] = None) -> list:
    """The trace events of one device of a torch.cuda.memory._snapshot().

    device None picks the first device whose trace has events.
    """
    traces = snapshot.get("device_traces") or []
    if device is None:
        device = next((d for d, t in enumerate(traces) if t), 0)
    if device >= len(traces):
        return []
    return traces[device]


def write_csv(events: list, out_path: str) -> int:
    """Writes snapshot trace events as fragctl CSV; returns the row count."""
    rows = 0
    with _open_text(out_path) as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(CSV_HEADER)
        for e in events:
            w.writerow([
                e["action"],
                int(e.get("addr", 0) or 0),
                int(e.get("size", 0) or 0),
                int(e.get("stream", 0) or 0),
                int(e.get("time_us", 0) or 0),
            ])
            rows += 1
    return rows


# --- Recording ---------------------------------------------------------------


@contextlib.contextmanager
def record(out_path: str, max_entries: int = DEFAULT_MAX_ENTRIES, device: Optional[int] = None,
           snapshot_path: Optional[str] = None) -> Iterator[None]:
    """Records every CUDA caching-allocator event in the block to `out_path`.

    The trace is written when the block exits, also when it raises (an OOM
    trace is the most useful kind). `max_entries` bounds PyTorch's history
    ring buffer: if the program makes more allocator calls, the first ones
    are lost and a warning is printed. `snapshot_path` also keeps the raw
    snapshot (pickle) for PyTorch's memory_viz.
    """
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("record_trace: no CUDA device is available to PyTorch")
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                             max_entries=max_entries)
    try:
        yield
    finally:
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        if snapshot_path:
            import pickle
            with open(snapshot_path, "wb") as f:
                pickle.dump(snapshot, f)
        events = snapshot_events(snapshot, device)
        rows = write_csv(events, out_path)
        allocs = sum(1 for e in events if e["action"] == "alloc")
        print(f"record_trace: wrote {rows} rows ({allocs} allocs) to {out_path}", file=sys.stderr)
        if rows >= max_entries:
            print(f"record_trace: warning: the history buffer ({max_entries} entries) was full; "
                  "the earliest events are missing. Raise --max-entries.", file=sys.stderr)


def run_script(script: str, args: list) -> None:
    """Runs `script` as __main__ with `args` as its sys.argv[1:]."""
    saved = sys.argv
    sys.argv = [script] + list(args)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
    finally:
        sys.argv = saved


# --- The demo: a small GPT-like model ----------------------------------------


def run_gpt_demo(steps: int, layers: int, width: int, heads: int, batch: int, max_seq: int,
                 vocab: int, seed: int) -> None:
    """Trains a GPT-like decoder with random weights on random tokens.

    Sequence length varies per step (drawn from max_seq/8 .. max_seq, a
    multiple of 64) so allocation sizes vary as in real training; bf16
    autocast and AdamW as usual.
    """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(seed)
    rng = random.Random(seed)
    dev = torch.device("cuda")

    class block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(width)
            self.qkv = nn.Linear(width, 3 * width)
            self.proj = nn.Linear(width, width)
            self.ln2 = nn.LayerNorm(width)
            self.fc = nn.Linear(width, 4 * width)
            self.out = nn.Linear(4 * width, width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(width, dim=2)
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class gpt(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(vocab, width)
            self.pos = nn.Embedding(max_seq, width)
            self.blocks = nn.ModuleList(block() for _ in range(layers))
            self.ln = nn.LayerNorm(width)
            self.head = nn.Linear(width, vocab, bias=False)
            self.head.weight = self.tok.weight

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            t = idx.shape[1]
            x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

    model = gpt().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    lo = max(64, max_seq // 8)
    for step in range(steps):
        seq = rng.randrange(lo, max_seq + 1, 64) if max_seq >= lo + 64 else max_seq
        idx = torch.randint(0, vocab, (batch, seq + 1), device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(idx[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, vocab), idx[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"record_trace: demo step {step + 1}/{steps}: seq {seq}, loss {loss.item():.3f}",
              file=sys.stderr)


# --- Command line -------------------------------------------------------------


def main(argv: Optional[list] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args: list = []
    if "--" in argv:
        cut = argv.index("--")
        argv, script_args = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(
        prog="record_trace.py",
        description="Record a PyTorch program's GPU allocations as a fragctl CSV trace.",
        epilog="Examples:\n"
               "  record_trace.py --out t.csv.gz -- train.py --epochs 1\n"
               "  record_trace.py --out sample.trace.csv.gz --demo gpt --steps 3",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output trace (.csv, or .csv.gz to compress)")
    p.add_argument("--demo", choices=["gpt"], help="run a built-in demo instead of a script")
    p.add_argument("--steps", type=int, default=3, help="demo: training steps (default 3)")
    p.add_argument("--layers", type=int, default=12, help="demo: transformer layers (default 12)")
    p.add_argument("--width", type=int, default=768, help="demo: model width (default 768)")
    p.add_argument("--heads", type=int, default=12, help="demo: attention heads (default 12)")
    p.add_argument("--batch", type=int, default=8, help="demo: batch size (default 8)")
    p.add_argument("--max-seq", type=int, default=1024, help="demo: longest sequence (default 1024)")
    p.add_argument("--vocab", type=int, default=32768, help="demo: vocabulary size (default 32768)")
    p.add_argument("--seed", type=int, default=0, help="demo: random seed (default 0)")
    p.add_argument("--max-entries", type=int, default=DEFAULT_MAX_ENTRIES,
                   help=f"history ring buffer size (default {DEFAULT_MAX_ENTRIES})")
    p.add_argument("--device", type=int, default=None,
                   help="device whose trace to write (default: the first with events)")
    p.add_argument("--snapshot", default=None, help="also keep the raw snapshot (pickle) here")
    a = p.parse_args(argv)
    if (a.demo is None) == (not script_args):
        p.error("give either --demo NAME or '-- SCRIPT [ARGS...]'")
    if a.demo and a.width % a.heads != 0:
        p.error("--width must be a multiple of --heads")

    try:
        import torch  # noqa: F401  (fail early, with a message, where torch is missing)
    except ImportError:
        print("record_trace: PyTorch is not installed (pip install torch)", file=sys.stderr)
        return 1
    try:
        with record(a.out, max_entries=a.max_entries, device=a.device, snapshot_path=a.snapshot):
            if a.demo == "gpt":
                run_gpt_demo(a.steps, a.layers, a.width, a.heads, a.batch, a.max_seq, a.vocab,
                             a.seed)
            else:
                run_script(script_args[0], script_args[1:])
    except RuntimeError as e:
        if "no CUDA device" not in str(e):
            raise
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
