#!/usr/bin/env python3
"""Writes the pickled PyTorch-snapshot test files in tests/data/.

tiny_snapshot_pickled.p{2,3,4,5}.pickle are what
torch.cuda.memory._dump_snapshot() writes (pickle.dump of the snapshot dict)
at each protocol, tiny_snapshot_pickled.p4.pickle.gz the same gzip-compressed,
and tiny_snapshot_pickled.json is json.dump of the same dict: the reader must
give the same JSON for all. The dict has the snapshot's shape (segments with
blocks, device_traces with frames) and values that exercise the reader: one
frames list shared by two events (the memo), tuples, a float, True, None,
negative and 64-bit integers. Run from anywhere; it writes next to itself.
"""
import gzip
import json
import os
import pickle

HERE = os.path.dirname(os.path.abspath(__file__))
BASE = 139637976727552


def snapshot():
    shared_frames = [{"filename": "train.py", "line": 12, "name": "forward"}]
    events = [
        {"action": "segment_alloc", "addr": BASE, "size": 2097152, "stream": 0,
         "time_us": 1700000000000100, "frames": shared_frames},
        {"action": "alloc", "addr": BASE, "size": 512, "stream": 0,
         "time_us": 1700000000000101, "frames": shared_frames},
        {"action": "alloc", "addr": BASE + 512, "size": 1536, "stream": 94558913184032,
         "time_us": 1700000000000102, "frames": []},
        {"action": "free_requested", "addr": BASE, "size": 512, "stream": 0,
         "time_us": 1700000000000103, "frames": []},
        {"action": "free_completed", "addr": BASE, "size": 512, "stream": 0,
         "time_us": 1700000000000104, "frames": []},
        {"action": "alloc", "addr": 2**64 - 4096, "size": 4096, "stream": 0,
         "time_us": 1700000000000105, "frames": []},
    ]
    # Filled after it is referenced, as the pickler's memo sees it.
    shared_frames.append({"filename": "model.py", "line": 7, "name": "linear"})
    return {
        "segments": [
            {"device": 0, "address": BASE, "total_size": 2097152, "stream": 0,
             "segment_type": "small", "allocated_size": 512, "requested_size": 512,
             "frames": shared_frames,
             "blocks": [{"size": 512, "requested_size": 512, "state": "active_allocated",
                         "frames": shared_frames},
                        {"size": 2096640, "state": "inactive", "frames": []}]},
        ],
        "device_traces": [events, [
            {"action": "alloc", "addr": 140000000000000, "size": 4096, "stream": 0,
             "time_us": 5, "frames": []}]],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": None, "expandable_segments": True,
                               "garbage_collection_threshold": 0.8, "max_split_size": -1,
                               "roundup_power2_divisions": (1, 2, (4, 8))},
    }


def main():
    data = snapshot()
    with open(os.path.join(HERE, "tiny_snapshot_pickled.json"), "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    for protocol in (2, 3, 4, 5):
        with open(os.path.join(HERE, f"tiny_snapshot_pickled.p{protocol}.pickle"), "wb") as f:
            pickle.dump(data, f, protocol=protocol)
    with gzip.GzipFile(os.path.join(HERE, "tiny_snapshot_pickled.p4.pickle.gz"), "wb", mtime=0) as f:
        pickle.dump(data, f, protocol=4)


if __name__ == "__main__":
    main()
