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
                                            [--consumer fragctl|native] [--control]

`native` is PyTorch's own allocator (no fragctl.torch.enable in that
process). Prints one JSON line; exit status 0 when every check passed.

--control is the negative control, the proof that the check can fail: the
producer (arena or caching) shares each tensor's block through fragctl's C
API instead of torch.multiprocessing (fragctl_export_block; the consumer
maps it with fragctl_import_block and reads it as a tensor through
__cuda_array_interface__), so PyTorch counts no reference. When the
producer drops its tensors the blocks go back to its allocator while the
consumer still maps them, the tensors allocated next land on them, and the
consumer sees its memory overwritten: the run reports "control": true,
"kept_while_shared": false, the overwritten tensors' indices in
"overwritten", "ok": false, and exits 1.
"""
import argparse
import ctypes
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


class _device_view:
    """int32 elements at a device address, for torch.as_tensor (no copy, no owner)."""

    def __init__(self, address, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<i4", "data": (address, False), "version": 3}


def export_blocks(tensors):
    """--control: each tensor's block described by fragctl_export_block (handle bytes, offset, elements),
    plain bytes that PyTorch's reference counting never sees."""
    import fragctl
    from fragctl import _capi
    lib, allocator = _capi.library(), fragctl.default_allocator(0)._handle
    out = []
    for t in tensors:
        size, offset = ctypes.c_size_t(), ctypes.c_size_t()
        ptr, nbytes = ctypes.c_void_p(t.data_ptr()), t.numel() * t.element_size()
        _capi.check(lib.fragctl_export_block(allocator, ptr, nbytes, None, 0, ctypes.byref(size), ctypes.byref(offset)))
        handle = ctypes.create_string_buffer(size.value)
        _capi.check(lib.fragctl_export_block(allocator, ptr, nbytes, handle, size.value, ctypes.byref(size),
                                             ctypes.byref(offset)))
        out.append((handle.raw[:size.value], offset.value, t.numel()))
    return out


def import_blocks(torch, exported):
    """--control, in the consumer: the exported blocks mapped here, as tensors; and the mappings to close."""
    import fragctl
    from fragctl import _capi
    lib, allocator = _capi.library(), fragctl.default_allocator(0)._handle
    tensors, bases = [], []
    for handle, offset, n in exported:
        base = ctypes.c_void_p()
        _capi.check(lib.fragctl_import_block(allocator, handle, len(handle), ctypes.byref(base)))
        bases.append(base)
        tensors.append(torch.as_tensor(_device_view(base.value + offset, n), device="cuda"))
    return tensors, lambda: [_capi.check(lib.fragctl_close_block(allocator, b)) for b in bases]


def consumer(kind, control, to_consumer, to_producer):
    import torch
    result = {"consumer": kind}
    try:
        enable(kind)
        received = to_consumer.get()
        tensors, close = import_blocks(torch, received) if control else (received, lambda: None)
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
        close()
        to_producer.put(("released", result))
    except Exception as e:  # reported by the producer
        result["error"] = f"{type(e).__name__}: {e}"[:400]
        to_producer.put(("error", result))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--producer", default="arena", choices=["arena", "caching", "native"])
    ap.add_argument("--consumer", default="fragctl", choices=["fragctl", "native"])
    ap.add_argument("--control", action="store_true",
                    help="negative control: share through fragctl's C API, bypassing PyTorch's reference counting")
    args = ap.parse_args()
    if args.control and args.producer == "native":
        ap.error("--control shares fragctl's blocks: the producer must be arena or caching")
    import torch
    import torch.multiprocessing as mp
    enable(args.producer)
    dev = torch.device("cuda", 0)
    torch.cuda.synchronize()
    out = {"producer": args.producer, "consumer": args.consumer, "gpu": torch.cuda.get_device_name(0),
           "tensors": N, "control": args.control}
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
    proc = ctx.Process(target=consumer, args=(args.consumer, args.control, to_consumer, to_producer))
    proc.start()
    t0 = time.perf_counter()
    to_consumer.put(export_blocks(tensors) if args.control else tensors)
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
