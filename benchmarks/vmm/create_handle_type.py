"""What a shareable handle type costs on the allocation path (issue 30,
item 1; docs/benchmarks.md, "CUDA IPC").

fragctl's cuda backend creates physical memory with
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR so that any handle can later be
exported to another process. This times, straight through the driver
(ctypes over libcuda.so.1), each call of the arena's growth and shrink
(create, map, set access, unmap, release; `count` handles per phase) with
requestedHandleTypes 0 and with the POSIX descriptor type, the two in
alternating order from round to round so that drift and warm-up hit both
alike.

    python3 benchmarks/vmm/create_handle_type.py [--device 0] [--rounds 15] [--count 64]

Prints one JSON line: the median (and minimum) microseconds per handle of
each phase, size and handle type.
"""
import argparse
import ctypes as c
import json
import statistics
import time

PINNED, LOCATION_DEVICE, POSIX_FD, READ_WRITE = 1, 1, 1, 3


class Location(c.Structure):
    _fields_ = [("type", c.c_int), ("id", c.c_int)]


class Prop(c.Structure):
    _fields_ = [("type", c.c_int), ("requestedHandleTypes", c.c_int), ("location", Location),
                ("win32HandleMetaData", c.c_void_p), ("compressionType", c.c_ubyte),
                ("gpuDirectRDMACapable", c.c_ubyte), ("usage", c.c_ushort), ("reserved", c.c_ubyte * 4)]


class AccessDesc(c.Structure):
    _fields_ = [("location", Location), ("flags", c.c_int)]


def check(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what} failed: CUresult {rc}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--count", type=int, default=64, help="handles per round and case")
    args = ap.parse_args()
    cu = c.CDLL("libcuda.so.1")
    check(cu.cuInit(0), "cuInit")
    dev, ctx = c.c_int(), c.c_void_p()
    check(cu.cuDeviceGet(c.byref(dev), args.device), "cuDeviceGet")
    check(cu.cuDevicePrimaryCtxRetain(c.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    name = c.create_string_buffer(128)
    check(cu.cuDeviceGetName(name, 128, dev), "cuDeviceGetName")
    driver = c.c_int()
    check(cu.cuDriverGetVersion(c.byref(driver)), "cuDriverGetVersion")
    cu.cuMemAddressReserve.argtypes = [c.POINTER(c.c_uint64), c.c_size_t, c.c_size_t, c.c_uint64, c.c_uint64]
    cu.cuMemMap.argtypes = [c.c_uint64, c.c_size_t, c.c_size_t, c.c_uint64, c.c_uint64]
    cu.cuMemSetAccess.argtypes = [c.c_uint64, c.c_size_t, c.POINTER(AccessDesc), c.c_size_t]
    cu.cuMemUnmap.argtypes = [c.c_uint64, c.c_size_t]
    cu.cuMemCreate.argtypes = [c.POINTER(c.c_uint64), c.c_size_t, c.POINTER(Prop), c.c_uint64]
    cu.cuMemRelease.argtypes = [c.c_uint64]

    def prop(handle_type):
        p = Prop()
        p.type, p.requestedHandleTypes = PINNED, handle_type
        p.location.type, p.location.id = LOCATION_DEVICE, dev.value
        return p

    props = {"none": prop(0), "posix_fd": prop(POSIX_FD)}
    access = AccessDesc()
    access.location.type, access.location.id, access.flags = LOCATION_DEVICE, dev.value, READ_WRITE
    sizes = {"2MiB": 2 << 20, "32MiB": 32 << 20, "64MiB": 64 << 20}  # the granule; map_chunk's default until 80dc410 (16 MiB since); more
    va = c.c_uint64()
    check(cu.cuMemAddressReserve(c.byref(va), args.count * (64 << 20), 0, 0, 0), "cuMemAddressReserve")
    phases = ("create", "map", "access", "unmap", "release")
    samples = {f"{phase} {size} {kind}": [] for phase in phases + ("total",) for size in sizes for kind in props}
    handles = [0] * args.count
    one = c.c_uint64()
    kinds = list(props)
    for r in range(args.rounds):
        for size_name, size in sizes.items():
            for kind in (kinds if r % 2 == 0 else kinds[::-1]):  # alternate which goes first
                p = props[kind]
                t = [time.perf_counter()]
                for i in range(args.count):
                    check(cu.cuMemCreate(c.byref(one), size, c.byref(p), 0), "cuMemCreate")
                    handles[i] = one.value
                t.append(time.perf_counter())
                for i in range(args.count):
                    check(cu.cuMemMap(va.value + i * size, size, 0, handles[i], 0), "cuMemMap")
                t.append(time.perf_counter())
                for i in range(args.count):
                    check(cu.cuMemSetAccess(va.value + i * size, size, c.byref(access), 1), "cuMemSetAccess")
                t.append(time.perf_counter())
                for i in range(args.count):
                    check(cu.cuMemUnmap(va.value + i * size, size), "cuMemUnmap")
                t.append(time.perf_counter())
                for i in range(args.count):
                    check(cu.cuMemRelease(handles[i]), "cuMemRelease")
                t.append(time.perf_counter())
                for k, phase in enumerate(phases):
                    samples[f"{phase} {size_name} {kind}"].append((t[k + 1] - t[k]) / args.count * 1e6)
                samples[f"total {size_name} {kind}"].append((t[-1] - t[0]) / args.count * 1e6)
    print(json.dumps({"gpu": name.value.decode(), "driver": driver.value, "rounds": args.rounds,
                      "handles_per_round": args.count,
                      "median_us_per_handle": {k: round(statistics.median(v), 2) for k, v in samples.items()},
                      "min_us_per_handle": {k: round(min(v), 2) for k, v in samples.items()}}))


if __name__ == "__main__":
    main()
