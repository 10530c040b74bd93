"""Driver memory calls per training step of a traced live run, replayed on `sim`.

    python3 benchmarks/trainers/step_calls.py TRACE RUN_JSON [--policy arena] [--capacity 141GiB]
                                              [--conf key=value ...] [--all]

TRACE is the run's FRAGCTL_TRACE file (tools/gpu/trainers.sh --livebytes
writes MODEL-arena.trace.csv.gz), RUN_JSON the run's JSON
(MODEL-fragctl_arena.json), whose "shapes" name each step's input: a step
starts at the first allocation of its input batch after the last step's
start (tokens x 8 bytes of int64 ids for the language models; batch x 3 x
side^2 x 4 bytes for vit's images) nearest in time to where the step
before ends by the time the run measured for it (its step_times_s; a block
of that size within a step is not a start). The trace is fed to
fragctl.Allocator(POLICY, backend="sim") with no GPU lag (fragctl replay
--gpu-lag-us models it; its calls per step are not told apart), and the
backend's driver memory calls are read at every step start. Printed: the
ratio and calls of the whole replay, then a row per step (steps 1-10 and
every later step with calls, replayed or live; --all: every step): its
shape, its first allocation's index, the replay's calls and the live run's
(the run's memory_calls_after_step). With FRAGCTL_LOG_LEVEL=debug the
arena's plan logs its decisions (docs/policies/arena.md, "Reading the
plan's decisions") between the "-- step N" lines on stderr, in order.

Needs libfragctl.so (FRAGCTL_LIBRARY, or the installed package) and no GPU.
"""
import argparse
import gzip
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import fragctl  # noqa: E402


def input_bytes(shape, batch):
    """The bytes of a step's input batch, from its shape in the run's JSON."""
    if "tokens" in shape:
        return shape["tokens"] * 8
    if "image_px" in shape:
        return batch * 3 * shape["image_px"] ** 2 * 4
    raise ValueError(f"no input size known for the shape {shape}")


def live_calls_per_step(run):
    """The live run's driver memory calls in each step (memory_calls_after_step)."""
    f = run.get("fragctl") or {}
    after = f.get("memory_calls_after_step") or []
    before = (f.get("memory_calls_before_step") or [0])[0]
    return [after[i] - (after[i - 1] if i else before) for i in range(len(after))]


def rows_of(trace):
    """The trace's allocation and free rows: (is_alloc, addr, size, stream, time_us). A fragctl trace
    CSV (FRAGCTL_TRACE; docs/traces.md), plain or gzip; a trace without an end row after its last
    allocation or free (its writer was killed) is read as far as it goes, with a warning."""
    opener = gzip.open if trace.endswith(".gz") else open
    ended = False
    with opener(trace, "rt") as f:
        if f.readline().strip() != "action,addr,size,stream,time_us":
            raise ValueError(f"{trace}: not a fragctl trace CSV (its first line is not the trace header)")
        for line in f:
            fields = line.rstrip("\n").split(",")
            if fields[0] in ("alloc", "free_requested"):
                ended = False
                yield fields[0] == "alloc", int(fields[1]), int(fields[2]), int(fields[3]), int(fields[4])
            elif fields[0] == "end":
                ended = True
    if not ended:
        print(f"step_calls: {trace} has no end row after its last allocation or free: cut, read as far as "
              "it goes", file=sys.stderr)


def step_starts(trace, wanted, step_times):
    """Each step's first allocation (its index among the allocations): of the
    allocations of the step's input size (wanted[k]) after the last step's
    start, the one nearest in time to where the step before ends: its
    start plus the time the run measured for it (step_times[k - 1], from
    just before its input is made to its loss read; the next input comes
    about a millisecond later). A block of that size within a step is not a
    start, however many allocations the steps make."""
    at = {size: [] for size in wanted}
    allocations = 0
    for is_alloc, _, size, _, time_us in rows_of(trace):
        if is_alloc:
            if size in at:
                at[size].append((allocations, time_us))
            allocations += 1
    starts, start_time = [], 0
    for k, size in enumerate(wanted):
        after = [c for c in at[size] if not starts or c[0] > starts[-1]]
        if not after:
            break
        if k == 0 or k > len(step_times):
            index, start_time = after[0]
        else:
            end = start_time + step_times[k - 1] * 1e6
            index, start_time = min(after, key=lambda c: (abs(c[1] - end), c[0]))
        starts.append(index)
    return starts


def replay(trace, run, policy="arena", capacity="141GiB", options=None, log=None):
    """Replays TRACE; returns (stats, [(step, shape, first allocation, replay calls, live calls)], the calls
    made before the first step). Raises ValueError for a run whose JSON records no step shapes."""
    shapes = run.get("shapes")
    if not shapes:
        raise ValueError(f"the run JSON records no step shapes (the {run.get('model', '?')} job writes none), so "
                         "its steps' starts cannot be found")
    starts = step_starts(trace, [input_bytes(s, run.get("batch", 1)) for s in shapes], run.get("step_times_s", []))
    live = live_calls_per_step(run)
    a = fragctl.Allocator(policy, backend="sim", sim_capacity=capacity, **(options or {}))
    calls = lambda: a.stats()["backend_counters"]["memory_calls"]  # noqa: E731
    at_start, blocks = [], {}
    allocations = 0
    for is_alloc, addr, size, stream, _ in rows_of(trace):
        if not is_alloc:
            block = blocks.pop(addr, None)
            if block is not None:  # on the stream the free names, as fragctl replay frees
                a.free(block[0], block[1], stream)
            continue
        step = len(at_start)
        if step < len(starts) and allocations == starts[step]:
            at_start.append(calls())
            if log is not None:
                if step:
                    print(f"-- step {step} made {at_start[-1] - at_start[-2]} calls", file=log, flush=True)
                print(f"-- step {step + 1} {shapes[step]} starts at allocation {allocations}", file=log, flush=True)
        blocks[addr] = (a.malloc(size, stream), size, stream)
        allocations += 1
    stats = a.stats()
    at_start.append(stats["backend_counters"]["memory_calls"])
    rows = [(k + 1, shapes[k], starts[k], at_start[k + 1] - at_start[k], live[k] if k < len(live) else None)
            for k in range(len(starts))]
    for ptr, size, stream in blocks.values():
        a.free(ptr, size, stream)
    a.close()
    return stats, rows, at_start[0]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace")
    p.add_argument("run_json")
    p.add_argument("--policy", default="arena")
    p.add_argument("--capacity", default="141GiB", help="the simulated device's size (default: an H200's)")
    p.add_argument("--conf", nargs="*", default=[], metavar="KEY=VALUE", help="allocator options")
    p.add_argument("--all", action="store_true", help="a row for every step")
    args = p.parse_args(argv)
    with open(args.run_json) as f:
        run = json.load(f)
    options = dict(kv.split("=", 1) for kv in args.conf)
    try:
        stats, rows, _ = replay(args.trace, run, args.policy, args.capacity, options, log=sys.stderr)
    except ValueError as e:
        print(f"step_calls.py: {args.run_json}: {e}", file=sys.stderr)
        return 2
    print(f"replay: reserved/requested {stats['derived']['reserved_over_requested']:.4f}, "
          f"driver memory calls {stats['backend_counters']['memory_calls']}, steps found {len(rows)} "
          f"of {len(run['shapes'])}")
    print("| step | shape | first allocation | calls, replay | calls, live |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for step, shape, first, calls, live in rows:
        if args.all or step <= 10 or calls or live:
            print(f"| {step} | {', '.join(f'{k} {v}' for k, v in shape.items())} | {first} | {calls} | "
                  f"{'' if live is None else live} |")
    return 0 if len(rows) == len(run["shapes"]) else 1


if __name__ == "__main__":
    sys.exit(main())
