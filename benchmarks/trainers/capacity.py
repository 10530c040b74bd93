"""Capacity: the smallest free device memory at which a job completes its
steps, per job and allocator set-up, all set-ups side by side in one run.

    python benchmarks/trainers/capacity.py --preload build/libfragctl_preload.so [--out DIR]
        [--models declm,moe,frozen] [--setups native,expandable,async,arena,preload]
        [--steps 6] [--rounds 6] [--precision 0.01] [--quick] [--budget SECONDS]

A ballast process (ballast.py) holds all but CAP bytes of the device's free
memory; the job then runs in a fresh process (forked from a per-set-up
zygote that has imported torch and transformers but never touched CUDA, so a
trial costs CUDA start, model build and the steps, not the imports) and
passes if it completes every step. The CAP counts everything the trainer's
process needs: its CUDA context, libraries' workspaces and the allocator's
cache.

Per job, one unconstrained native run measures the live bytes L (peak
allocated) and the process's overhead O (peak device used - peak reserved).
No allocator can pass below L + O, and every good one passes well below
1.35 (L + O). Per set-up, the tops 1.02, 1.06, 1.15 and 1.35 (L + O) are
probed in turn until one passes; the bracket between it and the last
failing cap (L + O below the first) is then bisected until it is at most
--precision (1%) of the passing cap wide, or --rounds times. A set-up that
fails at 1.35 (L + O) is reported as needing more. The table gives the
smallest passing CAP, its ratio to native's and expandable segments', and the
median step time at that CAP. Writes DIR/capacity.json and DIR/capacity.md.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GiB = float(1 << 30)
MiB = 1 << 20
# The brackets' tops over live bytes + overhead, probed in turn until one passes: set-ups near the live bytes are
# bisected in a narrow bracket (one round to 1%); one that fails at the last is "> TOPS[-1]".
TOPS = (1.02, 1.06, 1.15, 1.35)

# name -> (label, train_one mode, environment)
SETUPS = {
    "native": ("native", "native", {}),
    "expandable": ("expandable_segments", "expandable", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    "async": ("cudaMallocAsync", "async", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}),
    "arena": ("fragctl.torch.enable(arena)", "fragctl", {}),
    "arena-nowait": ("fragctl arena, wait_before_growing:false", "fragctl", {"FRAGCTL_CONF": "wait_before_growing:false"}),
    "preload": ("LD_PRELOAD arena", "preload",
                {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync", "FRAGCTL_POLICY": "arena"}),
}


class Helper:
    """A child process spoken to in lines: command() sends one and returns the reply's words."""

    def __init__(self, argv, env=None, what=""):
        self.what = what
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.first = self.read()

    def read(self):
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("%s exited (rc %s)" % (self.what, self.process.poll()))
        return line.split()

    def command(self, line):
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        return self.read()

    def close(self):
        try:
            self.process.stdin.close()
            self.process.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()


def zygote():
    """Runs as a set-up's zygote: imports the trainer's modules, then for every line
    `<out.json> <timeout_s> <train_one arguments...>` forks a child that trains and writes out.json, and
    answers `done <exit status>` (`done timeout` when it was killed)."""
    sys.path.insert(0, HERE)
    import torch  # noqa: F401  (imported before the fork, CUDA untouched)
    import transformers  # noqa: F401
    for optional in ("peft", "timm"):  # the lora and vit jobs' libraries, where installed
        try:
            __import__(optional)
        except ImportError:
            pass
    import train_one
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        out, timeout, argv = words[0], float(words[1]), words[2:]
        pid = os.fork()
        if pid == 0:
            status = 1
            try:  # the child's output goes to out.log: the zygote's stdout carries the protocol
                log = os.open(out + ".log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(log, 1)
                os.dup2(log, 2)
                args = train_one.arguments(argv + ["--out", out, "--no-sampler"])
                result = {"model": args.model, "mode": args.mode, "error": None}
                try:
                    train_one.train(args, result)
                    status = 0
                except Exception as e:  # an out-of-memory error is the expected failure
                    result["error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
                with open(out, "w") as f:
                    json.dump(result, f)
            finally:
                sys.stdout.flush()
                os._exit(status)
        deadline = time.time() + timeout
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                print("done %d" % os.waitstatus_to_exitcode(status), flush=True)
                break
            if time.time() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                print("done timeout", flush=True)
                break
            time.sleep(0.05)


def trial(ballast, zygote_process, model, mode, steps, cap, out, timeout):
    """One run of model under the zygote's set-up with cap bytes free (None: the whole device); its result."""
    if cap is None:
        reply = ballast.command("release")
    else:
        reply = ballast.command("hold %d" % cap)
        # The ballast holds in 1 GiB pieces less the driver's own overhead: the cap must hold within 256 MiB, or
        # the probe would measure another cap than it says.
        if reply[0] == "held" and abs(int(reply[1]) - cap) > 256 * MiB:
            raise RuntimeError("ballast: asked to leave %d bytes free, %s are" % (cap, reply[1]))
    if reply[0] not in ("held", "released"):
        raise RuntimeError("ballast: " + " ".join(reply))
    base = int(ballast.command("mark")[1])
    started = time.time()
    if os.path.exists(out):
        os.remove(out)
    reply = zygote_process.command("%s %d --model %s --mode %s --steps %d --timed-from 1"
                                   % (out, timeout, model, mode, steps))
    peak = int(ballast.command("peak")[1])
    try:
        with open(out) as f:
            result = json.load(f)
    except (OSError, ValueError):
        result = {"error": "no result (%s)" % " ".join(reply)}
    result.update({"cap_bytes": cap, "peak_device_used_bytes": peak - base, "wall_s": time.time() - started,
                   "passed": not result.get("error") and reply == ["done", "0"]})
    return result


def bisect(run, low, tops, rounds, deadline=None, precision=0.0):
    """The smallest passing cap found: `low` is taken to fail; the caps of `tops` (increasing) are probed in turn
    until one passes, then the bracket between it and the last failing cap is bisected until it is at most
    `precision` of the passing cap wide, at most `rounds` times (fewer once time.time() passes `deadline`). A
    set-up that fails at every top costs len(tops) probes and gives None. Returns (cap or None, its result, every
    probe)."""
    probes, best = [], None
    for top in tops:
        result = run(top)
        probes.append(result)
        if result["passed"]:
            high, best = top, result
            break
        low = top
    if best is None:
        return None, None, probes
    for _ in range(rounds):
        if deadline is not None and time.time() > deadline:
            break
        if high - low <= precision * high:
            break
        middle = (low + high) // 2 // MiB * MiB
        result = run(middle)
        probes.append(result)
        if result["passed"]:
            high, best = middle, result
        else:
            low = middle
    return best["cap_bytes"], best, probes


def markdown(results, gpu, command):
    rows = ["Capacity (%s; %s): the smallest free device memory at which each job completes its steps, found by "
            "bisection with a ballast process holding the rest of the device; command `%s`." % (
                gpu, time.strftime("%Y-%m-%d", time.gmtime()), command), "",
            "| job | set-up | smallest free memory that completes (GiB) | vs native | vs expandable segments | "
            "median step there (ms) | probes (pass/total) |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for model in dict.fromkeys(r["model"] for r in results):
        runs = {r["setup"]: r for r in results if r["model"] == model}
        for r in runs.values():
            cap = r.get("cap_bytes")
            if cap is None:
                rows.append("| %s | %s | %s | | | | %d/%d |" % (
                    model, r["label"], r.get("error") or "> %.2f (failed at every probe)" % (TOPS[-1] * r["live_bytes"] / GiB),
                    r["passed_probes"], r["probes"]))
                continue

            def versus(other):
                o = runs.get(other, {}).get("cap_bytes")
                return "%+.1f%%" % (100 * (cap / o - 1)) if o else ""
            rows.append("| %s | %s | %.2f | %s | %s | %.1f | %d/%d |" % (
                model, r["label"], cap / GiB, versus("native"), versus("expandable"),
                1e3 * r["median_step_s"], r["passed_probes"], r["probes"]))
        live = next((r["live_bytes"] for r in runs.values() if r.get("live_bytes")), None)
        if live:
            rows.append("| %s | live bytes (peak allocated) + process overhead | %.2f | | | | |" % (model, live / GiB))
    return "\n".join(rows) + "\n"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--zygote", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-results"))
    parser.add_argument("--preload", default="", help="path of libfragctl_preload.so (needed by the preload set-up)")
    parser.add_argument("--models", default="declm,moe,frozen")
    parser.add_argument("--setups", default="native,expandable,async,arena,preload",
                        help="of: " + ", ".join(SETUPS))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=6, help="most bisection rounds per set-up")
    parser.add_argument("--precision", type=float, default=0.01,
                        help="stop bisecting once the bracket is this fraction of the passing cap wide")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 4 steps")
    parser.add_argument("--timeout", type=float, default=90, help="seconds per probe")
    parser.add_argument("--budget", type=float, default=0,
                        help="seconds: past this, each set-up stops after its first probe (0: no limit)")
    args = parser.parse_args()
    if args.zygote:
        return zygote()
    if args.quick:
        args.rounds, args.steps = min(args.rounds, 3), min(args.steps, 4)
    setups = args.setups.split(",")
    unknown = [s for s in setups if s not in SETUPS]
    if unknown or ("preload" in setups and not args.preload):
        raise SystemExit("--setups: unknown %s, or preload without --preload (known: %s)" % (unknown, ", ".join(SETUPS)))
    args.out = os.path.abspath(args.out)
    os.makedirs(args.out, exist_ok=True)
    started = time.time()

    base_env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTORCH_CUDA_ALLOC_CONF")}
    base_env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    ballast = Helper([sys.executable, os.path.join(HERE, "ballast.py")], base_env, "ballast")
    zygotes = {}
    for name in setups:
        env = dict(base_env, **SETUPS[name][2])
        if name == "preload":
            env["LD_PRELOAD"] = os.path.abspath(args.preload)
        zygotes[name] = Helper([sys.executable, os.path.abspath(__file__), "--zygote"], env, "zygote " + name)

    results, gpu = [], "?"
    try:
        for model in args.models.split(","):
            probe_out = os.path.join(args.out, "capacity-probe.json")
            free = trial(ballast, zygotes["native"] if "native" in zygotes else zygotes[setups[0]], model,
                         SETUPS["native"][1] if "native" in zygotes else SETUPS[setups[0]][1], args.steps, None,
                         probe_out, args.timeout)
            gpu = free.get("gpu", gpu)
            if not free["passed"]:
                results += [{"model": model, "setup": s, "label": SETUPS[s][0], "error": "unconstrained run failed: %s"
                             % free.get("error"), "probes": 1, "passed_probes": 0} for s in setups]
                continue
            torch_peaks = free.get("torch_allocator") or {}
            fragctl_peaks = free.get("fragctl") or {}
            live = torch_peaks.get("peak_allocated_bytes") or fragctl_peaks.get("peak_requested_bytes", 0)
            reserved = torch_peaks.get("peak_reserved_bytes") or fragctl_peaks.get("peak_reserved_bytes", 0)
            overhead = max(0, free["peak_device_used_bytes"] - reserved)
            low = live + overhead
            print("%s: unconstrained peak device used %.2f GiB, live %.2f GiB, process overhead %.2f GiB"
                  % (model, free["peak_device_used_bytes"] / GiB, live / GiB, overhead / GiB), flush=True)
            for name in setups:
                label, mode, _ = SETUPS[name]

                def run(cap):
                    r = trial(ballast, zygotes[name], model, mode, args.steps, cap,
                              os.path.join(args.out, "capacity-probe.json"), args.timeout)
                    print("  %-8s %-30s cap %6.2f GiB: %s" % (model, label, (cap or 0) / GiB,
                                                              "pass" if r["passed"] else r.get("error")), flush=True)
                    return r
                cap, best, probes = bisect(run, low, [int(t * low) // MiB * MiB for t in TOPS], args.rounds,
                                           started + args.budget if args.budget else None, args.precision)
                results.append({"model": model, "setup": name, "label": label, "cap_bytes": cap,
                                "live_bytes": low, "median_step_s": best["median_step_s"] if best else None,
                                "probes": len(probes), "passed_probes": sum(p["passed"] for p in probes),
                                "probe_results": [{k: p.get(k) for k in ("cap_bytes", "passed", "error",
                                                                          "median_step_s", "peak_device_used_bytes")}
                                                  for p in probes]})
    finally:
        for z in zygotes.values():
            z.close()
        ballast.close()

    command = "python3 benchmarks/trainers/capacity.py " + " ".join(sys.argv[1:])
    text = markdown(results, gpu, command)
    with open(os.path.join(args.out, "capacity.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "capacity.json"), "w") as f:
        json.dump({"steps": args.steps, "rounds": args.rounds, "precision": args.precision, "results": results}, f,
                  indent=1)
    print()
    print(text)
    print("capacity: %.0f s" % (time.time() - started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
