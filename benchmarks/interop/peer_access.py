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
Prints one JSON line; exit status 0 when every copy is exact.
"""
import json
import sys


def main():
    import torch
    enable = "--no-enable" not in sys.argv
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
    print(json.dumps({"enable": enable, "gpus": [torch.cuda.get_device_name(i) for i in range(2)],
                      "can_access_peer": can, "ok": ok, "results": results}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
