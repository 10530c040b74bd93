"""Peer access to fragctl's memory on two GPUs (docs/interop.md, "Peer
access"; issue 30).

Under fragctl.torch.enable("arena") a tensor on cuda:0 lives in mapped
(cuMemMap) memory. A cast to another dtype on cuda:1 makes PyTorch run a
copy kernel on cuda:1 that reads cuda:0's memory directly once peer access
is enabled (PyTorch's get_p2p_access calls the allocator's
enablePeerAccess); that kernel faults on memory not granted to cuda:1.
Checks sizes that span several arena spans, memory mapped before and after
the first cross-device copy, and the reverse direction.
    python3 benchmarks/interop/peer_access.py [--no-enable]
With --preload the script runs under the LD_PRELOAD shim instead of
enable() (PyTorch's cudaMallocAsync backend makes every tensor a
cudaMallocAsync the shim serves, and the grants come from the shim's
cudaDeviceEnablePeerAccess); it checks that fragctl's arena holds the
tensors (the process-default allocators the shim serves from):
    PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync python3 -m fragctl run --policy arena -- \
        python3 benchmarks/interop/peer_access.py --preload
Prints one JSON line; exit status 0 when every copy is exact.
"""
import json
import sys


def main():
    import torch
    preload = "--preload" in sys.argv
    enable = "--no-enable" not in sys.argv and not preload
    if enable:
        import fragctl.torch
        fragctl.torch.enable("arena")
    assert torch.cuda.device_count() >= 2, "needs two GPUs"
    can = torch.cuda.can_device_access_peer(1, 0) and torch.cuda.can_device_access_peer(0, 1)
    torch.manual_seed(0)
    results = []
    before = [torch.randn(n, device="cuda:0") for n in (1 << 10, 3 << 20, 40 << 20)]  # mapped before
    for k, x in enumerate(before):
        y = x.to("cuda:1", dtype=torch.float16)  # a kernel on cuda:1 reads cuda:0 (p2p)
        torch.cuda.synchronize(1)
        results.append({"case": "mapped before, 0 -> 1", "elements": x.numel(),
                        "exact": bool(torch.equal(y.cpu(), x.cpu().half()))})
    after = [torch.randn(n, device="cuda:0") for n in (5 << 20, 64 << 20)]  # mapped after access was granted
    for x in after:
        y = x.to("cuda:1", dtype=torch.float16)
        torch.cuda.synchronize(1)
        results.append({"case": "mapped after, 0 -> 1", "elements": x.numel(),
                        "exact": bool(torch.equal(y.cpu(), x.cpu().half()))})
    back = torch.randn(7 << 20, device="cuda:1")
    z = back.to("cuda:0", dtype=torch.float16)
    torch.cuda.synchronize(0)
    results.append({"case": "1 -> 0", "elements": back.numel(), "exact": bool(torch.equal(z.cpu(), back.cpu().half()))})
    ok = all(r["exact"] for r in results)
    out = {"enable": enable, "preload": preload, "gpus": [torch.cuda.get_device_name(i) for i in range(2)],
           "can_access_peer": can, "ok": ok, "results": results}
    if preload:  # the tensors must be fragctl's arena memory, or the check proves nothing
        import fragctl
        served = {}
        for d in (0, 1):
            a = fragctl.default_allocator(d, create=False)
            stats = a.stats() if a is not None else {}
            served[d] = {"allocator": stats.get("allocator"),
                         "live_bytes": stats.get("requested_bytes", {}).get("current", 0)}
        out["fragctl"] = served
        out["ok"] = ok = ok and all(v["allocator"] == "arena" and v["live_bytes"] > 0 for v in served.values())
    print(json.dumps(out))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
