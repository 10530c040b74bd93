"""CUDA IPC of fragctl's memory (docs/interop.md, "Sharing tensors between
processes"; issue 30, item 1).

A producer fills 100 CUDA tensors of mixed sizes (1 element to 36 MiB), one
of them made with Tensor.share_memory_(), and sends them through a
torch.multiprocessing (spawn) Queue. The consumer checks every element,
negates every tensor in place and says so; the producer checks that it sees
the writes. Then the producer drops its references and allocates as many
bytes again, filled with another value: PyTorch's reference counting must
keep the shared blocks from being handed out while the consumer maps them,
so the consumer, checking again, still reads its values (this fails when
the counting is defeated: the new tensors would land on the blocks). Then
the consumer drops its tensors; the producer collects (torch.cuda.
ipc_collect) and its allocated bytes return to where they were before the
tensors existed, and empty_cache gives the memory back.

    python3 benchmarks/interop/ipc_share.py [--producer arena|caching|native]
                                            [--consumer fragctl|native]

`native` is PyTorch's own allocator (no fragctl.torch.enable in that
process). Prints one JSON line; exit status 0 when every check passed.
"""
import argparse
import gc
import json
import sys
import time

N = 100
SIZES = [1, 100, 4096, 65536, 1 << 20, 3 << 20, 9 << 20, 257, 600_000, 5 << 20]  # int32 elements


def expected(torch, i, n, device):
    return (torch.arange(n, dtype=torch.int32, device=device) * 7 + i) % 1_000_003


def enable(kind):
    if kind in ("arena", "caching", "fragctl"):
        import fragctl.torch
        fragctl.torch.enable("arena" if kind == "fragctl" else kind)


def consumer(kind, to_consumer, to_producer):
    import torch
    result = {"consumer": kind}
    try:
        enable(kind)
        tensors = to_consumer.get()
        bad = [i for i, t in enumerate(tensors) if not torch.equal(t, expected(torch, i, t.numel(), t.device))]
        for t in tensors:
            t.neg_()
        torch.cuda.synchronize()
        result.update(read_ok=not bad, bad=bad[:5], allocated_in_consumer=torch.cuda.memory_allocated())
        to_producer.put(("written", result))
        assert to_consumer.get() == "check again"
        again = [i for i, t in enumerate(tensors) if not torch.equal(t, -expected(torch, i, t.numel(), t.device))]
        result.update(kept_while_shared=not again, overwritten=again[:5])
        del tensors, t
        gc.collect()
        torch.cuda.synchronize()
        to_producer.put(("released", result))
    except Exception as e:  # reported by the producer
        result["error"] = f"{type(e).__name__}: {e}"[:400]
        to_producer.put(("error", result))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--producer", default="arena", choices=["arena", "caching", "native"])
    ap.add_argument("--consumer", default="fragctl", choices=["fragctl", "native"])
    args = ap.parse_args()
    import torch
    import torch.multiprocessing as mp
    enable(args.producer)
    dev = torch.device("cuda", 0)
    torch.cuda.synchronize()
    out = {"producer": args.producer, "consumer": args.consumer, "gpu": torch.cuda.get_device_name(0),
           "tensors": N}
    base_allocated = torch.cuda.memory_allocated()
    tensors = [expected(torch, i, SIZES[i % len(SIZES)] + (i // len(SIZES)) * 512, dev) for i in range(N)]
    shared = torch.empty(3 << 20, dtype=torch.int32, device=dev)
    shared.copy_(expected(torch, N, shared.numel(), dev))
    shared.share_memory_()
    out["share_memory_is_shared"] = bool(shared.is_shared())
    tensors.append(shared)
    torch.cuda.synchronize()
    out["bytes_shared"] = sum(t.numel() * 4 for t in tensors)
    live_allocated = torch.cuda.memory_allocated()

    ctx = mp.get_context("spawn")
    to_consumer, to_producer = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=consumer, args=(args.consumer, to_consumer, to_producer))
    proc.start()
    t0 = time.perf_counter()
    to_consumer.put(tensors)
    what, result = to_producer.get(timeout=300)
    out["send_and_check_s"] = round(time.perf_counter() - t0, 3)
    out.update(result)
    ok = what == "written" and result.get("read_ok", False)
    if what == "written":
        seen = [i for i, t in enumerate(tensors) if not torch.equal(t, -expected(torch, i, t.numel(), dev))]
        out["producer_sees_writes"] = not seen
        ok = ok and not seen
        # Drop our references while the consumer still maps the blocks, then
        # allocate as much again: nothing may land on a shared block.
        del tensors, shared
        gc.collect()
        out["allocated_after_producer_drop"] = torch.cuda.memory_allocated()
        garbage = [torch.full((SIZES[i % len(SIZES)] + (i // len(SIZES)) * 512,), 0x77, dtype=torch.int32, device=dev)
                   for i in range(N)]
        torch.cuda.synchronize()
        to_consumer.put("check again")
        what, result = to_producer.get(timeout=300)
        out.update(result)
        ok = ok and what == "released" and result.get("kept_while_shared", False)
        del garbage
    proc.join(timeout=60)
    out["consumer_exit"] = proc.exitcode
    # The consumer dropped everything: PyTorch's collector frees the blocks.
    for _ in range(50):
        torch.cuda.ipc_collect()
        gc.collect()
        if torch.cuda.memory_allocated() <= base_allocated:
            break
        time.sleep(0.1)
    out["allocated_before"] = base_allocated
    out["allocated_live"] = live_allocated
    out["allocated_after_release"] = torch.cuda.memory_allocated()
    reserved_before_empty = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    out["reserved_before_empty_cache"] = reserved_before_empty
    out["reserved_after_empty_cache"] = torch.cuda.memory_reserved()
    out["memory_returned"] = (out["allocated_after_release"] <= base_allocated
                              and out["reserved_after_empty_cache"] < reserved_before_empty)
    ok = ok and out["memory_returned"] and out["share_memory_is_shared"] and proc.exitcode == 0
    out["ok"] = bool(ok)
    print(json.dumps(out))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
