"""Holds device 0's memory so that the next trainer sees only CAP bytes free,
and samples the device's used memory meanwhile (capacity.py drives it).

Commands on stdin, one reply line each on stdout:

    hold CAP   frees what it held, waits until the device's free memory is
               steady (a trainer that just exited gives its memory back),
               then holds all but CAP bytes of it: "held FREE" (free bytes now)
    release    frees what it held: "released FREE"
    mark       restarts the peak: "mark USED"
    peak       "peak USED": the most used bytes (total - free, every process)
               seen since mark, sampled about every 10 ms

Held memory is cuMemAlloc'd in 1 GiB pieces and a remainder (a single
allocation of most of the device can fail where pieces fit). Needs only
libcuda.so.1; every CUDA call is on the main thread, stdin is read by another.
"""
import ctypes
import queue
import sys
import threading
import time

from memsampler import open_device

PIECE = 1 << 30


def main():
    cuda, used, total = open_device()
    held = []

    def free_bytes():
        return total - used()

    def release():
        """Frees every held piece; the driver's error code of the first that fails (0: none failed)."""
        failed = 0
        while held:
            rc = cuda.cuMemFree_v2(held.pop())
            failed = failed or rc
        return failed

    def hold(cap):
        if release():
            return None
        previous, now = -1, free_bytes()
        for _ in range(100):  # up to 5 s for an exited trainer's memory to come back
            if now == previous:
                break
            time.sleep(0.05)
            previous, now = now, free_bytes()
        remaining = max(0, now - cap)
        while remaining > 0:
            size = min(PIECE, remaining)
            pointer = ctypes.c_uint64()
            if cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size)) != 0:
                if size <= (2 << 20):
                    break
                remaining -= 2 << 20  # the driver's own overhead: hold a little less
                continue
            held.append(pointer.value)
            remaining -= size
        return free_bytes()

    commands = queue.Queue()
    threading.Thread(target=lambda: [commands.put(line.split()) for line in sys.stdin] + [commands.put(None)],
                     daemon=True).start()
    print("ready %d %d" % (used(), total), flush=True)
    peak = used()
    while True:
        try:
            command = commands.get(timeout=0.01)
        except queue.Empty:
            peak = max(peak, used())
            continue
        if command is None:
            break
        if command[0] == "hold":
            free = hold(int(command[1]))
            print("held %d" % free if free is not None else "error cuMemFree failed", flush=True)
        elif command[0] == "release":
            rc = release()
            print("released %d" % free_bytes() if rc == 0 else "error cuMemFree returned %d" % rc, flush=True)
        elif command[0] == "mark":
            peak = used()
            print("mark %d" % peak, flush=True)
        elif command[0] == "peak":
            peak = max(peak, used())
            print("peak %d" % peak, flush=True)
        else:
            print("error unknown command %s" % command[0], flush=True)
    release()


if __name__ == "__main__":
    main()
