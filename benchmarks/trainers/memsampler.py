"""Samples the device's used memory from the driver (cuMemGetInfo: total -
free) in a separate process, so the trainer it watches runs undisturbed and
every allocator is measured the same way.

Protocol: prints "ready <used_bytes> <total_bytes>" once it is sampling (the
baseline, taken before the trainer touches CUDA), then samples about every
10 ms until its stdin closes, then prints "peak <used_bytes>". Every
allocator measured holds its peak until the process ends (none returns memory
during these runs), so a coarse interval loses nothing, and a query every
10 ms rather than every 0.5 ms keeps the sampler's driver calls from
contending with the trainer's. Device 0 of
CUDA_VISIBLE_DEVICES, as the trainer sees it. Needs only libcuda.so.1.

The trainer's side: start() runs this script and waits for its baseline;
stop() ends it and returns its peak.
"""
import ctypes
import os
import subprocess
import sys
import threading
import time


def open_device():
    """(cuda, used, total): libcuda with device 0's primary context current in this process, a function
    returning the device's used bytes (total - free) now, and its total bytes. Exits with a message on error."""
    cuda = ctypes.CDLL("libcuda.so.1")
    # CUdeviceptr is 64 bits: without argtypes ctypes passes a Python int as a C int, masked to 32 bits, and
    # cuMemFree then fails and the memory stays held.
    cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    cuda.cuMemFree_v2.argtypes = [ctypes.c_uint64]

    def check(rc, what):
        if rc != 0:
            print("error %s returned %d" % (what, rc), flush=True)
            sys.exit(1)

    check(cuda.cuInit(0), "cuInit")
    device = ctypes.c_int()
    check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
    context = ctypes.c_void_p()
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    get_info = cuda.cuMemGetInfo_v2

    def used():
        get_info(ctypes.byref(free), ctypes.byref(total))
        return total.value - free.value
    used()
    return cuda, used, total.value


def start():
    """This script in its own process, without LD_PRELOAD (the sampler must
    not load the allocator under test): (process, baseline used bytes, total
    bytes) once it samples. Raises RuntimeError if it cannot."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    process = subprocess.Popen([sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, env=env)
    line = process.stdout.readline().split()
    if not line or line[0] != "ready":
        process.kill()
        process.wait()
        raise RuntimeError("memsampler failed: %s" % " ".join(line))
    return process, int(line[1]), int(line[2])


def stop(process):
    """The peak used bytes `process` (from start) saw, 0 if it reported
    none; the process is gone when this returns, whatever happened."""
    try:
        process.stdin.close()
        line = process.stdout.readline().split()
        process.wait(timeout=30)
        return int(line[1]) if line and line[0] == "peak" else 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def main():
    cuda, used, total = open_device()
    baseline = used()
    print("ready %d %d" % (baseline, total), flush=True)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    peak = baseline
    while not stop.is_set():
        peak = max(peak, used())
        time.sleep(0.01)
    print("peak %d" % max(peak, used()), flush=True)


if __name__ == "__main__":
    main()
