#!/usr/bin/env bash
# One GPU: whether the virtual-memory calls a growing arena makes run in parallel from several
# host threads (k4_vmm_threads.cpp, a standalone probe calling the driver directly; at e67ec4b in
# git, removed since: bench_vmm --threads measures the same through fragctl's backend, k7.sh),
# at 16 MiB and 2 MiB handles, 8 GiB.
set -uo pipefail
d=tools/gpu/runs/2026-11-27
g++ -O2 -std=c++17 -I/usr/local/cuda/include $d/k4_vmm_threads.cpp -o /tmp/k4 -ldl -lpthread || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
/tmp/k4 16 8192; /tmp/k4 2 4096; /tmp/k4 64 8192
