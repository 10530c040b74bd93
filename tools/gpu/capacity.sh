#!/usr/bin/env bash
# On a GPU machine with PyTorch and transformers: builds libfragctl.so and
# libfragctl_preload.so, installs the Python package, and runs the capacity
# benchmark (benchmarks/trainers/capacity.py): for the decoder LM with
# gradient checkpointing, the mixture-of-experts LM and the frozen base +
# trainable head, under native, expandable segments, cudaMallocAsync,
# fragctl.torch.enable("arena") and LD_PRELOAD arena, the smallest free
# device memory at which the job completes its steps (bisection, a ballast
# process holding the rest of the device) and the step time there. Results in
# ${OUT:-gpu-results}: capacity.md (the table for docs/benchmarks.md),
# capacity.json, one log per probe. About 8 minutes on an H100 (past 500 s
# from the start, each remaining set-up gets one probe); --quick (3 rounds
# of 4 steps) about 6.
#   tools/gpu/capacity.sh [--quick] [capacity.py options, e.g. --models declm --setups native,arena]
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/trainers_setup.sh capacity
# Whatever the build took, stop bisecting so that the script ends within 10 minutes.
budget=$(( 500 - ($(date +%s) - start) ))
"$python" benchmarks/trainers/capacity.py --out "$out" --preload "$build/libfragctl_preload.so" --budget "$budget" "$@"
rc=$?
echo "capacity: exit $rc, total $(( $(date +%s) - start )) s; table in $out/capacity.md"
exit $rc
