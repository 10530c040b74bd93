#!/usr/bin/env bash
# One GPU: i3.sh again at 51c0a91 (call_cost.py then timed torch.cuda.memory_allocated() too, after
# the pool state stopped reading every granule). Results: $OUT/i4.tar.gz.
NAME=i4 exec bash "$(dirname "$0")/i3.sh"
