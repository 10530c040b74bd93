#!/usr/bin/env python3
"""Markdown tables from the raw results of tools/gpu/bench.sh.

    python3 benchmarks/bench_tables.py RAW_DIR > bench.md
    python3 benchmarks/bench_tables.py --summary RAW_DIR   # a few lines per section

RAW_DIR holds what bench.sh writes (any file may be missing; its section says
so): micro-cuda.json, micro-sim.json (Google Benchmark JSON of bench_micro),
replay-*.json (arrays in the shape of `fragctl replay --json`, from fragctl
and torch_replay), stress-*.json ({"largest": [...], "smallest": [...]} from
bench_stress and torch_replay stress). Also writes RAW_DIR/stress-series.csv:
the per-step byte series of every stress run.

Only the standard library is used.
"""

from __future__ import annotations

import csv
import glob
import json
import os
import sys
from typing import Any, Dict, List, Optional

GiB = 1 << 30


def load(path: str) -> Optional[Any]:
    """The JSON document in `path`; a document cut short by a time limit
    (torch_replay prints results as they finish) is closed and read."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        print(f"bench_tables: {path}: {e}", file=sys.stderr)
        return None
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError as e:
        error = e
    body = text.rstrip().rstrip(",")
    for ending in ("]", "\n]}", "]}", "}"):
        try:
            doc = json.loads(body + ending)
            print(f"bench_tables: {path}: truncated; read what was finished", file=sys.stderr)
            return doc
        except ValueError:
            pass
    print(f"bench_tables: {path}: {error}", file=sys.stderr)
    return None


def gib(n: Optional[float]) -> str:
    return "-" if n is None else f"{n / GiB:.2f} GiB"


def ns(x: Optional[float]) -> str:
    if x is None:
        return "-"
    return f"{x:.0f}" if x < 100_000 else f"{x / 1000:.0f} us"


def ms(x: Optional[float]) -> str:
    if x is None:
        return "-"
    return f"{x / 1e3:.0f} us" if x < 1e6 else f"{x / 1e6:.2f} ms"


def table(header: List[str], rows: List[List[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


# --- microbenchmarks -------------------------------------------------------------


def allocator_cell(e: Dict[str, Any]) -> str:
    note = " (cap not enforced: runs above it count as failures)" if e.get("cap_enforced") is False else ""
    return f"`{e['allocator']}`{note}"


def micro_section(doc: Optional[Dict[str, Any]], backend: str) -> str:
    out = [f"## Microbenchmarks on `{backend}` (bench_micro)\n"]
    if doc is None:
        return out[0] + "\nNo results (the run failed or was skipped; see logs/).\n"
    ctx = doc.get("context", {})
    out.append(f"Host: {ctx.get('num_cpus', '?')} CPUs at {ctx.get('mhz_per_cpu', '?')} MHz, "
               f"{ctx.get('date', '')}. Nanoseconds per operation (one malloc or one free): "
               "wall time of the timed loop over all threads together divided by the operations "
               "(8 threads: total throughput, so below the 1-thread figure only if they run in "
               "parallel). Small sizes: median of 3 runs.\n")
    cells: Dict[str, Dict[str, Dict[str, str]]] = {}
    order: List[str] = []
    for b in doc.get("benchmarks", []):
        name = b.get("run_name") or b["name"]
        agg = b.get("aggregate_name")
        if agg not in (None, "", "median"):
            continue
        parts = name.split("/")
        if len(parts) < 4:
            continue
        alloc, pattern, sizes, streams = parts[0], parts[1], parts[2], parts[3]
        threads = b.get("threads", 1)
        col = f"{streams.split(':')[-1]} stream{'s' if streams != 'streams:1' else ''}, {threads} thr"
        key = f"{pattern}/{sizes}"
        if b.get("error_occurred"):
            val = "skipped"
        else:
            t = b.get("real_time", 0.0)
            unit = b.get("time_unit", "ns")
            scale = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}.get(unit, 1)
            val = ns(t * scale / 2)
        cells.setdefault(key, {}).setdefault(alloc, {})[col] = val
        if alloc not in order:
            order.append(alloc)
    errors = sorted({(b["name"].split("/")[0], b.get("error_message", ""))
                     for b in doc.get("benchmarks", []) if b.get("error_occurred")})
    cols = ["1 stream, 1 thr", "4 streams, 1 thr", "1 stream, 8 thr", "4 streams, 8 thr"]
    titles = {
        "pairs/large": "malloc + free pairs, 512 B..1 GiB (log-uniform)",
        "working_set/large": "16 live blocks per thread, 512 B..1 GiB, one replaced per iteration",
        "pairs/small": "malloc + free pairs, 512 B..64 KiB",
        "working_set/small": "256 live blocks per thread, 512 B..64 KiB",
    }
    for key, title in titles.items():
        if key not in cells:
            continue
        out.append(f"\n### {title} (ns/op)\n")
        rows = [[f"`{a}`"] + [cells[key].get(a, {}).get(c, "-") for c in cols] for a in order if a in cells[key]]
        out.append(table(["allocator"] + cols, rows))
    if errors:
        out.append("\nSkipped: " + "; ".join(f"`{a}`: {m}" for a, m in errors[:6]) + "\n")
    return "\n".join(out)


# --- replay ----------------------------------------------------------------------


def replay_section(results: List[Dict[str, Any]]) -> str:
    out = ["## Trace replay: PyTorch's allocator and every fragctl policy, on the GPU\n",
           "Each trace replayed once per allocator in a fresh process or stack; every malloc and "
           "free timed alone with `steady_clock` (clock overhead included). `torch-*` rows are "
           "PyTorch's CUDACachingAllocator replayed from C++ (benchmarks/torch_replay); "
           "backend calls are its cudaMalloc/cudaFree (or map/unmap) count "
           "(num_device_alloc + num_device_free).\n"]
    if not results:
        return out[0] + "\nNo results.\n"
    by_trace: Dict[str, List[Dict[str, Any]]] = {}
    for r in results:
        by_trace.setdefault(r["trace"], []).append(r)
    for name, rows in by_trace.items():
        live = max((r.get("peak_requested", 0) for r in rows), default=0)
        out.append(f"\n### {name} (peak requested {gib(live)})\n")
        body = []
        rows.sort(key=lambda r: 0 if r["policy"].startswith("torch") else 1)  # stable: run order otherwise
        for r in rows:
            body.append([f"`{r['policy']}`", gib(r.get("peak_reserved")),
                         f"{r.get('reserved_over_requested', 0):.3f}", ns(r.get("median_ns")),
                         ns(r.get("p99_ns")),
                         f"{r['total_ms']:.1f}" if r.get("total_ms") is not None else "-",
                         str(r.get("backend_memory_calls", "-")), str(r.get("ooms", 0))])
        out.append(table(["allocator", "peak reserved", "reserved/requested", "median ns/op", "p99 ns/op",
                          "total ms", "backend calls", "OOMs"], body))
    return "\n".join(out)


# --- stress ----------------------------------------------------------------------


def stress_sections(docs: List[Dict[str, Any]], raw_dir: str) -> str:
    largest = [e for d in docs for e in d.get("largest", [])]
    smallest = [e for d in docs for e in d.get("smallest", [])]
    out = ["## Fragmentation stress under a fixed capacity\n",
           "Synthetic training workloads (benchmarks/stress/workload_generators.hpp). The cap is on "
           "*reserved* bytes: fragctl's policies run on a capped backend (byte searches on `sim`, whose "
           "byte figures equal cuda's; timings on the GPU), PyTorch under "
           "`setMemoryFraction` on the GPU.\n"]
    if largest:
        cap = largest[0].get("cap", 0)
        out.append(f"\n### Largest workload completed under a {gib(cap)} cap\n")
        out.append("Scale multiplies the tokens per step (1.0: llm_varlen batch 8, zero3 4096 tokens); "
                   "found by doubling and bisection to 1%.\n")
        by: Dict[str, List[Dict[str, Any]]] = {}
        for e in largest:
            by.setdefault(e["scenario"], []).append(e)
        for scenario, rows in by.items():
            body = []
            for e in rows:
                run = e.get("run") or {}
                body.append([allocator_cell(e), e.get("backend", ""),
                             f"{e['largest_scale']:.3f}" if e.get("found") else "none",
                             gib(run.get("peak_live")), gib(run.get("peak_reserved")),
                             f"{run.get('reserved_over_requested', 0):.3f}", str(e.get("probes", ""))])
            out.append(f"\n#### {scenario}\n")
            out.append(table(["allocator", "searched on", "largest scale", "peak live there",
                              "peak reserved there", "reserved/requested", "probes"], body))
    if smallest:
        out.append("\n### Smallest cap completing the workload at scale 1, and the allocator time per step there\n")
        out.append("Cap found by bisection to 2 MiB. Step time: median over steps 2..n of the summed "
                   "malloc/free wall time of one step (no kernels run), uncapped and at the smallest cap, "
                   "both on the GPU.\n")
        by = {}
        for e in smallest:
            by.setdefault(e["scenario"], []).append(e)
        for scenario, rows in by.items():
            body = []
            for e in rows:
                unc = e.get("uncapped") or {}
                timing = e.get("timing") or {}
                tu, tc = timing.get("uncapped") or {}, timing.get("capped") or {}
                change = "-"
                if tu.get("step_ns_median") and tc.get("step_ns_median") and tc.get("completed"):
                    change = f"{100 * (tc['step_ns_median'] / tu['step_ns_median'] - 1):+.1f}%"
                elif "error" in tu or "error" in tc:
                    change = "GPU run failed"
                elif tc and not tc.get("completed", True):
                    change = "OOM on GPU"
                body.append([allocator_cell(e), gib(e.get("peak_live")),
                             f"{unc.get('reserved_over_requested', 0):.3f}",
                             gib(e.get("smallest_cap")) if e.get("found") else "none",
                             f"{e.get('cap_over_peak_live', 0):.3f}", ms(tu.get("step_ns_median")),
                             ms(tc.get("step_ns_median")), change, str(tc.get("retries", "-")),
                             f"{tu.get('backend_memory_calls', '-')} / {tc.get('backend_memory_calls', '-')}"])
            out.append(f"\n#### {scenario}\n")
            out.append(table(["allocator", "peak live", "uncapped reserved/requested", "smallest cap",
                              "cap / peak live", "step time uncapped", "step time at cap", "change",
                              "retries at cap", "backend calls (uncapped / cap)"], body))
        write_series(smallest, os.path.join(raw_dir, "stress-series.csv"))
        out.append("\nPer-step series (peak reserved and requested within each step, uncapped and at the "
                   "cap): `raw/stress-series.csv`.\n")
    if len(out) == 1:
        out.append("\nNo results.\n")
    return "\n".join(out)


def write_series(smallest: List[Dict[str, Any]], path: str) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["scenario", "allocator", "run", "cap", "step", "requested_peak", "reserved_peak",
                    "requested_end", "reserved_end", "alloc_ns"])
        for e in smallest:
            runs = [("search-uncapped", e.get("uncapped"))]
            timing = e.get("timing") or {}
            runs += [("gpu-uncapped", timing.get("uncapped")), ("gpu-at-cap", timing.get("capped"))]
            for label, run in runs:
                for row in (run or {}).get("series", []) or []:
                    w.writerow([e["scenario"], e["allocator"], label, (run or {}).get("cap", 0)] + row)


def summary(raw: str, replay: List[Dict[str, Any]], stress: List[Dict[str, Any]]) -> str:
    lines = ["replay (reserved/requested, median ns/op):"]
    by_trace: Dict[str, List[str]] = {}
    for r in replay:
        by_trace.setdefault(r["trace"], []).append(
            f"{r['policy']} {r.get('reserved_over_requested', 0):.3f} {ns(r.get('median_ns'))}")
    lines += [f"  {t}: " + " | ".join(v) for t, v in by_trace.items()]
    lines.append("stress, largest scale under the cap:")
    for d in stress:
        for e in d.get("largest", []):
            lines.append(f"  {e['scenario']:<16} {e['allocator']:<22} "
                         f"{e['largest_scale']:.3f}" if e.get("found") else f"  {e['scenario']} {e['allocator']} none")
    lines.append("stress, smallest cap / peak live, step time change at the cap:")
    for d in stress:
        for e in d.get("smallest", []):
            timing = e.get("timing") or {}
            tu, tc = timing.get("uncapped") or {}, timing.get("capped") or {}
            change = "-"
            if tu.get("step_ns_median") and tc.get("step_ns_median"):
                change = f"{100 * (tc['step_ns_median'] / tu['step_ns_median'] - 1):+.1f}%"
            lines.append(f"  {e['scenario']:<16} {e['allocator']:<22} {e.get('cap_over_peak_live', 0):.3f} "
                         f"{ms(tu.get('step_ns_median'))} -> {ms(tc.get('step_ns_median'))} ({change})")
    for backend in ("cuda", "sim"):
        doc = load(os.path.join(raw, f"micro-{backend}.json")) if os.path.exists(
            os.path.join(raw, f"micro-{backend}.json")) else None
        if doc is None:
            continue
        lines.append(f"micro on {backend} (ns/op, 1 stream, 1 thread): small pairs | large working set")
        picked: Dict[str, Dict[str, str]] = {}
        for b in doc.get("benchmarks", []):
            name = b.get("run_name") or b["name"]
            if b.get("threads", 1) != 1 or "/streams:1" not in name or b.get("aggregate_name") not in (None, "", "median"):
                continue
            parts = name.split("/")
            if f"{parts[1]}/{parts[2]}" not in ("pairs/small", "working_set/large"):
                continue
            val = "skipped" if b.get("error_occurred") else ns(b.get("real_time", 0) / 2)
            picked.setdefault(parts[0], {})[f"{parts[1]}/{parts[2]}"] = val
        lines += [f"  {a:<22} {v.get('pairs/small', '-')} | {v.get('working_set/large', '-')}"
                  for a, v in picked.items()]
    return "\n".join(lines)


def main(argv: List[str]) -> int:
    short = "--summary" in argv
    argv = [a for a in argv if a != "--summary"]
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    raw = argv[1]
    sections = []
    for backend in ("cuda", "sim"):
        path = os.path.join(raw, f"micro-{backend}.json")
        sections.append(micro_section(load(path) if os.path.exists(path) else None, backend))
    replay: List[Dict[str, Any]] = []
    for path in sorted(glob.glob(os.path.join(raw, "replay-*.json"))):
        doc = load(path)
        if isinstance(doc, list):
            replay += doc
    sections.insert(0, replay_section(replay))
    stress = [d for d in (load(p) for p in sorted(glob.glob(os.path.join(raw, "stress-*.json")))) if isinstance(d, dict)]
    if short:
        print(summary(raw, replay, stress))
        return 0
    sections.insert(1, stress_sections(stress, raw))
    print("\n".join(sections))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
