#!/usr/bin/env bash
# One GPU: bench_vmm with --threads (each virtual-memory phase shared among 1, 2, 4 and 8 host
# threads), 8 GiB as handles of 2, 16 and 64 MiB, median of 3 rounds. Needs the devkit with
# Google Benchmark's debs. Results on stdout.
set -uo pipefail
source .devkit/devkit.sh unpack
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cmake -S . -B /tmp/bk7 -G Ninja -DCMAKE_BUILD_TYPE=Release -DFRAGCTL_BUILD_TESTS=OFF -DFRAGCTL_BUILD_BENCHMARKS=ON \
  -DFRAGCTL_WERROR=OFF > /tmp/bk7.log 2>&1 && cmake --build /tmp/bk7 --target bench_vmm >> /tmp/bk7.log 2>&1 ||
  { grep -E "error|Error|FAILED|benchmark" /tmp/bk7.log | head -20; exit 1; }
echo "commit: $(cat .carry/commit 2>/dev/null)"
/tmp/bk7/benchmarks/bench_vmm --backend=cuda --total=8GiB --chunks=2MiB,16MiB,64MiB --repeat=3 --threads=1,2,4,8 2>/dev/null
