"""Real trainers under every allocator set-up, one process per run, and the
verdict: memory placement must not change the math, and should not cost time.

    python benchmarks/trainers/run_trainers.py --out DIR --preload build/libfragctl_preload.so
        [--models gpt2m,llama,resnet] [--steps 12] [--budget 330] [--runs native,arena,...]
    python benchmarks/trainers/run_trainers.py --livebytes --out DIR --preload ...   (issue 16's jobs and set-ups)
    python benchmarks/trainers/run_trainers.py --livebytes --models t5,lora,vit,kvgen --runs native,expandable,arena ...
        (issue 32's other kinds of job; jobs.py describes every job)

Per model the runs are: PyTorch's native allocator; expandable_segments:True;
fragctl.torch.enable with caching, arena, buckets:arena and warmup:arena
(profiled from the arena run's report); cudaMallocAsync (run name async)
the arena with wait_before_growing:false (arena-nowait) and the arena
without its steady-state plan, step_plan:false (arena-noplan), the arena
with spans of 16 MiB, map_chunk:16MiB (arena-16, the default since 2026-11-27)
and of 32 MiB, the default before (arena-32), the arena without lifetime
placement, lifetime_placement:false (arena-nolifetime), none in the default list;
LD_PRELOAD=libfragctl_preload.so with
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync; native runs three times
(first, in the middle and last): step times are compared with the median of
the native runs, and their spread is the run-to-run noise of step time.
--runs picks other runs and orders, e.g. native,arena,native,arena,... to
compare two set-ups in alternation. Every run is deterministic
(train_one.py) and its loss after every step is compared bit for bit with the
native run's. Writes DIR/trainers.json (every run) and DIR/trainers.md (the
table and the verdict) and prints the table. Runs that do not fit in
--budget seconds are skipped and listed. Exit status 1 when a loss differs,
a traced run handed out memory twice, or a run asked for did not finish;
a model run without a native run asked for (--runs arena, to measure
memory or driver calls alone) is listed as not compared, not failed.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GiB = float(1 << 30)
TIME_TOLERANCE = 0.02  # step time within 2% of native


def runs_for(model, out_dir, preload):
    arena_report = os.path.join(out_dir, "%s-arena.report.json" % model)

    def fragctl_run(policy, conf=""):
        report = arena_report if policy == "arena" and not conf else os.path.join(
            out_dir, "%s-%s%s.report.json" % (model, policy.replace(":", "-"), "-" + conf.replace(":", "-") if conf else ""))
        extra = ["--report", report]
        if policy.startswith("warmup"):
            extra += ["--warmup-profile", arena_report]
        return ("fragctl " + policy + (" " + conf if conf else ""), "fragctl", policy, extra,
                {"FRAGCTL_CONF": conf} if conf else {})

    preload_env = {
        "LD_PRELOAD": preload, "PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync", "FRAGCTL_POLICY": "arena",
        "FRAGCTL_REPORT": os.path.join(out_dir, "%s-preload.report.json" % model),
    }
    return {
        "native": ("native", "native", "", [], {}),
        "expandable": ("expandable_segments", "expandable", "", [], {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
        "async": ("cudaMallocAsync", "async", "", [], {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}),
        "caching": fragctl_run("caching"),
        "arena": fragctl_run("arena"),
        # the arena as before issue 16: creates memory rather than wait for frees in flight
        "arena-nowait": fragctl_run("arena", "wait_before_growing:false"),
        # the arena without its steady-state plan (issue 32): best fit for every block
        "arena-noplan": fragctl_run("arena", "step_plan:false"),
        # the arena with spans of 16 MiB (map_chunk; the default since 2026-11-27) and of 32 MiB (before)
        "arena-16": fragctl_run("arena", "map_chunk:16MiB"),
        "arena-32": fragctl_run("arena", "map_chunk:32MiB"),
        # the arena without lifetime placement (2026-11-28): best fit for blocks of sizes that lived long too
        "arena-nolifetime": fragctl_run("arena", "lifetime_placement:false"),
        "buckets:arena": fragctl_run("buckets:arena"),
        "warmup:arena": fragctl_run("warmup:arena"),
        "preload": ("LD_PRELOAD arena", "preload", "arena", [], preload_env),
    }


DEFAULT_RUNS = "native,expandable,caching,arena,native,buckets:arena,warmup:arena,preload,native"
# Issue 16's set-ups; the full set runs arena and native again (their spread is the run-to-run noise).
LIVEBYTES_QUICK_RUNS = "native,expandable,async,arena,arena-nowait,preload"
LIVEBYTES_RUNS = LIVEBYTES_QUICK_RUNS + ",arena,native"


def planned_runs(model, out_dir, preload, names):
    """The runs of --runs in order; a name's second and later runs are labelled "(2)", "(3)", ..."""
    menu = runs_for(model, out_dir, preload)
    unknown = [n for n in names if n not in menu]
    if unknown:
        raise SystemExit("--runs: unknown run %s (known: %s)" % (", ".join(unknown), ", ".join(menu)))
    seen, runs = {}, []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        label, mode, policy, extra, env = menu[n]
        runs.append(("%s (%d)" % (label, seen[n]) if seen[n] > 1 else label, mode, policy, extra, env))
    return runs


def run(model, label, mode, policy, extra, env_extra, args, deadline):
    slug = "%s-%s" % (model, label.replace(" ", "_").replace(":", "-").replace("(", "").replace(")", ""))
    out = os.path.join(args.out, slug + ".json")
    remaining = deadline - time.time()
    if remaining < 20:
        return {"model": model, "label": label, "mode": mode, "policy": policy, "error": "skipped: out of time budget"}
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    env.update(env_extra)
    command = [sys.executable, os.path.join(HERE, "train_one.py"), "--model", model, "--mode", mode,
               "--steps", str(args.steps), "--out", out] + (["--policy", policy] if policy else []) + extra
    if args.eval_every:
        command += ["--eval-every", str(args.eval_every), "--eval-batches", str(args.eval_batches)]
    if args.accumulate > 1:
        command += ["--accumulate", str(args.accumulate)]
    if args.fixed_shapes:
        command.append("--fixed-shapes")
    started = time.time()
    with open(os.path.join(args.out, slug + ".log"), "w") as log:
        try:
            subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=min(180, remaining))
        except subprocess.TimeoutExpired:
            pass
    try:
        with open(out) as f:
            result = json.load(f)
    except (OSError, ValueError):
        result = {"model": model, "mode": mode, "policy": policy, "error": "no result (crashed or timed out; see %s.log)"
                  % slug}
    result["label"] = label
    result["wall_s"] = time.time() - started
    print("  %-22s %-22s %s" % (model, label, result.get("error") or "%.1f ms/step, loss %.6f, %.1f s"
                                % (1e3 * result["mean_step_s"], result["losses"][-1], result["wall_s"])),
          flush=True)
    return result


def native_baseline(runs):
    """(median of the native runs' mean step times, their spread (max - min) / median), or (None, None)."""
    times = sorted(r["mean_step_s"] for r in runs if r["mode"] == "native" and not r.get("error"))
    if not times:
        return None, None
    median = times[len(times) // 2] if len(times) % 2 else (times[len(times) // 2 - 1] + times[len(times) // 2]) / 2
    return median, (times[-1] - times[0]) / median if len(times) > 1 else None


def same_math(run, native):
    """Whether a run's training and evaluation losses equal native's bit for bit."""
    return run["losses_hex"] == native["losses_hex"] and run.get("eval_losses_hex") == native.get("eval_losses_hex")


def verdict(results):
    """Per model: bitwise loss equality with native, step time against native, memory."""
    lines, ok_math, time_notes, compared = [], True, [], 0
    for model in dict.fromkeys(r["model"] for r in results):
        runs = [r for r in results if r["model"] == model]
        native = next((r for r in runs if r["label"] == "native" and not r.get("error")), None)
        if native is None:
            if any(r["label"] == "native" for r in runs):
                lines.append("- %s: no native run finished, nothing to compare" % model)
                ok_math = False
            else:  # none asked for (--runs arena, to measure memory or calls alone)
                lines.append("- %s: no native run asked for: losses and step times not compared" % model)
            continue
        compared += 1
        baseline, spread = native_baseline(runs)
        spread_text = "%.1f%%" % (100 * spread) if spread is not None else "not measured"
        lines.append("- %s: native step time %.1f ms (median of %d native runs; their spread %s)"
                     % (model, 1e3 * baseline, sum(1 for r in runs if r["mode"] == "native" and not r.get("error")),
                        spread_text))
        for r in runs:
            if r is native or r.get("error"):
                continue
            if not same_math(r, native):
                ok_math = False
                if r["losses_hex"] != native["losses_hex"]:
                    first = next(i for i, (a, b) in enumerate(zip(r["losses_hex"], native["losses_hex"])) if a != b)
                    lines.append("- %s / %s: loss differs from native from step %d (%r vs %r)"
                                 % (model, r["label"], first, r["losses"][first], native["losses"][first]))
                else:
                    lines.append("- %s / %s: an evaluation's losses differ from native's" % (model, r["label"]))
            if r["mode"] == "native":
                continue
            ratio = r["mean_step_s"] / baseline
            if ratio > 1 + TIME_TOLERANCE:
                noise = spread is not None and ratio <= 1 + spread
                time_notes.append("- %s / %s: step time %.1f%% above native (%s native's own spread, %s)"
                                  % (model, r["label"], 100 * (ratio - 1), "within" if noise else "beyond",
                                     spread_text))
        nondeterministic = sorted({op for r in runs for op in r.get("nondeterministic_ops", [])})
        if nondeterministic:
            lines.append("- %s: ops without a deterministic implementation ran: %s" % (model, ", ".join(nondeterministic)))
    skipped = [r for r in results if r.get("error")]
    for r in skipped:
        lines.append("- %s / %s: %s" % (r["model"], r["label"], r["error"]))
    if not ok_math or skipped:
        outcome = "FAIL or incomplete"
    elif compared == 0:
        outcome = "not compared: no native run asked for"
    else:
        outcome = "PASS: every run's loss after every step equals native's bit for bit"
    head = "**Verdict: %s**" % outcome
    head += "; step time %s" % ("within 2% of native everywhere" if not time_notes
                                else "above native's by more than 2% somewhere")
    return [head, ""] + lines + time_notes, ok_math and not skipped


def table(results):
    rows = ["| model | run | mean step (ms) | median step (ms) | vs native | peak device used (GiB) | allocator peak reserved / requested (GiB) | ratio | device memory calls (in timed steps) | loss after last step | = native bitwise |",
            "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |"]
    natives = {r["model"]: r for r in results if r["label"] == "native" and not r.get("error")}
    baselines = {m: native_baseline([r for r in results if r["model"] == m])[0] for m in natives}
    for r in results:
        if r.get("error"):
            rows.append("| %s | %s | %s | | | | | | | | |" % (r["model"], r["label"], r["error"]))
            continue
        native = natives.get(r["model"])
        baseline = baselines.get(r["model"])
        vs = "%+.1f%%" % (100 * (r["mean_step_s"] / baseline - 1)) if baseline else ""
        same = ("yes" if same_math(r, native) else "**no**") if native else ""
        peaks, ratio, calls = "", "", ""
        if "fragctl" in r:
            f = r["fragctl"]
            peaks = "%.2f / %.2f (fragctl %s)" % (f["peak_reserved_bytes"] / GiB, f["peak_requested_bytes"] / GiB,
                                                  f["allocator"])
            ratio = "%.3f" % f["reserved_over_requested"]
            calls = str(f["memory_calls"])
            if "memory_calls_timed" in f:
                calls += " (%d%s)" % (f["memory_calls_timed"], "; %.1f per step" % f["memory_calls_per_timed_step"]
                                      if "memory_calls_per_timed_step" in f else "")
        elif "torch_allocator" in r:
            t = r["torch_allocator"]
            peaks = "%.2f / %.2f (torch)" % (t["peak_reserved_bytes"] / GiB, t["peak_allocated_bytes"] / GiB)
            ratio = "%.3f" % (t["peak_reserved_bytes"] / max(1, t["peak_allocated_bytes"]))
        rows.append("| %s | %s | %.1f | %.1f | %s | %.2f | %s | %s | %s | %.6f | %s |" % (
            r["model"], r["label"], 1e3 * r["mean_step_s"], 1e3 * r["median_step_s"], vs,
            (r.get("peak_device_used_bytes") or 0) / GiB, peaks, ratio, calls, r["losses"][-1], same))
    return rows


# GPU lags (trace microseconds) at which the fidelity check replays each traced live run on sim.
FIDELITY_LAGS_US = (0, 500, 2000, 10000)


def traced(runs, out_dir, model):
    """Adds FRAGCTL_TRACE to the first `fragctl arena` run of runs; returns the trace path (or None)."""
    for i, (label, mode, policy, extra, env) in enumerate(runs):
        if mode == "fragctl" and policy == "arena" and not env:
            path = os.path.join(out_dir, "%s-arena.trace.csv.gz" % model)
            runs[i] = (label, mode, policy, extra, dict(env, FRAGCTL_TRACE=path))
            return path
    return None


def fidelity(results, traces, cli):
    """Replays each traced live run on sim (policy arena, the device's size, each lag of FIDELITY_LAGS_US) and
    compares peak reserved / peak requested with the live run's own. Returns the markdown lines."""
    lines = ["## Replay fidelity: each traced live run replayed on sim", "",
             "| model | live reserved / requested | trace rows = live allocations | " +
             " | ".join("sim, lag %d us" % lag for lag in FIDELITY_LAGS_US) + " | nearest |",
             "| --- | ---: | --- |" + " ---: |" * len(FIDELITY_LAGS_US) + " --- |"]
    for model, path in traces.items():
        live = next((r for r in results if r["model"] == model and r.get("traced") and not r.get("error")), None)
        if live is None or not os.path.exists(path):
            lines.append("| %s | no traced live run |" % model + " |" * (len(FIDELITY_LAGS_US) + 1))
            continue
        f = live["fragctl"]
        capacity = str(live.get("device_total_bytes") or (80 << 30))
        cells, nearest = [], None
        allocations = None
        for lag in FIDELITY_LAGS_US:
            done = subprocess.run([cli, "replay", path, "--backend", "sim", "--policy", "arena", "--capacity", capacity,
                                   "--gpu-lag-us", str(lag), "--json"], capture_output=True, text=True, timeout=300)
            try:
                replayed = json.loads(done.stdout)[0]
            except (ValueError, IndexError):
                cells.append("failed: " + (done.stderr.strip().splitlines() or ["?"])[-1])
                continue
            ratio = replayed["reserved_over_requested"]
            allocations = replayed.get("stats", {}).get("allocations", allocations)
            error = ratio / f["reserved_over_requested"] - 1
            cells.append("%.3f (%+.1f%%)" % (ratio, 100 * error))
            if nearest is None or abs(error) < abs(nearest[1]):
                nearest = (lag, error)
        counted = f.get("allocations")
        rows = "%s = %s" % (allocations, counted) if counted is not None else str(allocations)
        verdict = ("lag %d us, %+.1f%% (%s 1%%)" % (nearest[0], 100 * nearest[1],
                                                   "within" if abs(nearest[1]) <= 0.01 else "**outside**")
                   if nearest else "")
        lines.append("| %s | %.3f | %s | %s | %s |" % (model, f["reserved_over_requested"], rows, " | ".join(cells),
                                                       verdict))
    return lines + [""]


def overlaps(traces, cli):
    """Checks each traced live run's own addresses (`fragctl info`): a block that meets another live block is
    memory the allocator handed out twice. Returns the markdown lines and whether every trace is clean."""
    lines, clean = ["## Memory handed out twice: each traced live run's addresses (`fragctl info`)", ""], True
    for model, path in traces.items():
        if not os.path.exists(path):
            continue
        done = subprocess.run([cli, "info", path, "--json"], capture_output=True, text=True, timeout=300)
        try:
            summary = json.loads(done.stdout)[0]
        except (ValueError, IndexError):
            clean = False
            lines.append("- %s: not read (%s)" % (model, (done.stderr.strip().splitlines() or ["?"])[-1]))
            continue
        count = summary.get("overlapping_allocs", 0)
        clean = clean and count == 0
        lines.append("- %s: %s" % (model, "none" if count == 0 else "**%d allocations meet a live block** (the "
                                   "first is event %s)" % (count, summary.get("first_overlap_event"))))
    return lines + [""], clean


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-results"))
    parser.add_argument("--preload", required=True, help="path of libfragctl_preload.so")
    parser.add_argument("--models", default="gpt2m,llama,resnet")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--runs", default=DEFAULT_RUNS,
                        help="runs per model, in order, repeats allowed (names: native, expandable, async, caching, "
                             "arena, buckets:arena, warmup:arena, preload); warmup:arena needs an arena run before it")
    parser.add_argument("--budget", type=float, default=330, help="seconds for all runs")
    parser.add_argument("--eval-every", type=int, default=0,
                        help="training jobs evaluate after every Nth step (train_one.py --eval-every)")
    parser.add_argument("--eval-batches", type=int, default=4, help="forward passes of one evaluation")
    parser.add_argument("--accumulate", type=int, default=1,
                        help="micro-batches per optimizer step of a training job (train_one.py --accumulate)")
    parser.add_argument("--fixed-shapes", action="store_true",
                        help="every step takes the shape of the job's first draw (train_one.py --fixed-shapes)")
    parser.add_argument("--livebytes", action="store_true",
                        help="the live-bytes set: --models declm,moe,frozen and, in alternation, --runs " + LIVEBYTES_RUNS
                             + " (unless given)")
    parser.add_argument("--quick", action="store_true", help="with --livebytes: 6 steps, each set-up once")
    parser.add_argument("--cli", default="", help="with --livebytes: the fragctl CLI; the first arena run of each "
                                                  "model is traced (FRAGCTL_TRACE) and replayed on sim")
    args = parser.parse_args()
    if args.livebytes:
        given = set(a.split("=")[0] for a in sys.argv[1:])
        if "--models" not in given:
            args.models = "declm,moe,frozen"
        if "--runs" not in given:
            args.runs = LIVEBYTES_QUICK_RUNS if args.quick else LIVEBYTES_RUNS
        if "--steps" not in given:
            args.steps = 6 if args.quick else 10
    args.out = os.path.abspath(args.out)
    os.makedirs(args.out, exist_ok=True)
    preload = os.path.abspath(args.preload)
    deadline = time.time() + args.budget

    results, traces = [], {}
    for model in args.models.split(","):
        runs = planned_runs(model, args.out, preload, args.runs.split(","))
        if args.livebytes and args.cli:
            path = traced(runs, args.out, model)
            if path:
                traces[model] = path
        for label, mode, policy, extra, env_extra in runs:
            results.append(run(model, label, mode, policy, extra, env_extra, args, deadline))
            results[-1]["traced"] = "FRAGCTL_TRACE" in env_extra

    rows = table(results)
    lines, passed = verdict(results)
    first = next((r for r in results if not r.get("error")), {})
    header = ["# Real trainers under fragctl", "",
              "GPU: %s; torch %s; %d steps per run (the first 2 untimed), deterministic mode, "
              "CUBLAS_WORKSPACE_CONFIG=:4096:8; peak device used = max(total - free) from the driver, sampled "
              "every 10 ms from another process, minus the idle baseline." % (
                  first.get("gpu", "?"), first.get("torch", "?"), args.steps), ""]
    if args.fixed_shapes:
        header[-1:-1] = ["Fixed shapes: every step has the shape of the job's first draw (--fixed-shapes)."]
    replayed = fidelity(results, traces, os.path.abspath(args.cli)) if traces else []
    twice, clean = overlaps(traces, os.path.abspath(args.cli)) if traces else ([], True)
    if not clean:
        passed = False
        lines[0] = "**Verdict: FAIL: a traced arena run handed out memory twice** (below); " + lines[0]
    text = "\n".join(header + rows + [""] + lines + [""] + replayed + twice) + "\n"
    with open(os.path.join(args.out, "trainers.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "trainers.json"), "w") as f:
        json.dump({"steps": args.steps, "runs": results, "passed": passed}, f, indent=1)
    print()
    print(text)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
