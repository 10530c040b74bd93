"""Does a virtual-memory driver call wait for the GPU?

Each call (cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease
on a 32 MiB handle no kernel touches) is timed twice: on an idle GPU and
right after a spin kernel of about --busy-ms was queued on the current
stream. A call that returns in microseconds while the GPU is busy does
not wait for it; one that takes about --busy-ms does (an implicit device
synchronization, which in a training step leaves the GPU idle while the
CPU queues work again). Prints one JSON object per call kind.

python3 benchmarks/vmm/vmm_busy.py [--busy-ms 100] [--repeat 5] [--mib 32]
"""
import argparse
import ctypes
import json
import statistics
import time

import torch


class Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class AllocProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", AllocFlags)]


class AccessDesc(ctypes.Structure):
    _fields_ = [("location", Location), ("flags", ctypes.c_int)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--busy-ms", type=float, default=100)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--mib", type=int, default=32)
    a = ap.parse_args()
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # the primary context, current on this thread
    dev = torch.cuda.current_device()
    cu = ctypes.CDLL("libcuda.so.1")
    u64 = ctypes.c_uint64

    def check(r, what):
        if r != 0:
            raise RuntimeError(f"{what} failed: CUresult {r}")

    prop = AllocProp(type=1, requestedHandleTypes=0, location=Location(1, dev))
    gran = ctypes.c_size_t()
    check(cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0), "granularity")
    size = (a.mib << 20) // gran.value * gran.value
    base = u64()
    check(cu.cuMemAddressReserve(ctypes.byref(base), ctypes.c_size_t(size * 4), ctypes.c_size_t(0), u64(0),
                                 u64(0)), "reserve")
    access = AccessDesc(Location(1, dev), 3)

    # Cycles for the spin kernel, calibrated on this GPU once its clocks are
    # up (a first spin at idle clocks runs slower per cycle), then measured.
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def spin_ms(n):
        start.record()
        torch.cuda._sleep(n)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    spin_ms(100_000_000)  # warm-up
    cycles = int(10_000_000 * a.busy_ms / spin_ms(10_000_000))
    measured_busy_ms = spin_ms(cycles)

    h = u64()
    calls = {
        "create": lambda: check(cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(size), ctypes.byref(prop), u64(0)),
                                "create"),
        "map": lambda: check(cu.cuMemMap(base, ctypes.c_size_t(size), ctypes.c_size_t(0), h, u64(0)), "map"),
        "set_access": lambda: check(cu.cuMemSetAccess(base, ctypes.c_size_t(size), ctypes.byref(access),
                                                      ctypes.c_size_t(1)), "set_access"),
        "unmap": lambda: check(cu.cuMemUnmap(base, ctypes.c_size_t(size)), "unmap"),
        "release": lambda: check(cu.cuMemRelease(h), "release"),
    }
    times = {k: {"idle": [], "busy": [], "busy_left": []} for k in calls}
    for _ in range(a.repeat):
        for busy in (False, True):
            for name, call in calls.items():
                torch.cuda.synchronize()
                if busy:
                    torch.cuda._sleep(cycles)
                    time.sleep(0.001)  # the kernel is running, not only queued
                t0 = time.perf_counter()
                call()
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                times[name]["busy" if busy else "idle"].append((t1 - t0) * 1e6)
                if busy:
                    times[name]["busy_left"].append((t2 - t1) * 1e3)
    print(json.dumps({"device": torch.cuda.get_device_name(), "busy_ms": a.busy_ms,
                      "measured_busy_ms": round(measured_busy_ms, 1), "bytes": size}))
    for name, t in times.items():
        print(json.dumps({"call": name, "idle_us_median": round(statistics.median(t["idle"]), 1),
                          "busy_us_median": round(statistics.median(t["busy"]), 1),
                          "busy_us_max": round(max(t["busy"]), 1),
                          "gpu_left_after_call_ms_median": round(statistics.median(t["busy_left"]), 1)}))


if __name__ == "__main__":
    main()
