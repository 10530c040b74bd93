# Sourced by tools/gpu/bench.sh and tools/gpu/fastpath.sh, from the repository root.
#
# describe_machine prints the date, GPU, CUDA, PyTorch, CPU, compiler and commit, one a line.
describe_machine() {
  date -u +"date: %Y-%m-%d %H:%M UTC"
  echo "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
  echo "cuda: $(nvcc --version 2>/dev/null | tail -1)"
  echo "torch: $(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null)"
  echo "cpu: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  echo "compiler: $(g++ --version | head -1)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (modified)')"
}

# start_replay_inputs TRACES LOGS BUILD SECONDS starts in the background, each under
# `timeout`, what their replays need besides the traces in the repository: the recording
# of gpt_wide (the GPT demo with 8 layers of width 1536, batch 4, sequences up to 2048)
# and llama1b (benchmarks/torch_replay/train_model.py --model llama) into TRACES, for
# SECONDS each, and the build of benchmarks/torch_replay into BUILD/torch_replay (40
# seconds more); logs go to LOGS. Sets the array `pids` to their pids; reads torch_dir
# and torch_abi (python3 -c 'import torch ...', as the scripts set them). Without
# PyTorch (torch_dir empty) starts nothing and returns 1.
start_replay_inputs() {
  local traces=$1 logs=$2 build=$3 limit=$4
  pids=()
  [ -n "$torch_dir" ] || return 1
  timeout "$limit" python3 tools/record_trace.py --out "$traces/gpt_wide.trace.csv.gz" --demo gpt \
    --layers 8 --width 1536 --heads 12 --batch 4 --max-seq 2048 --steps 4 \
    > "$logs/record-gpt_wide.log" 2>&1 &
  pids+=($!)
  timeout "$limit" python3 tools/record_trace.py --out "$traces/llama1b.trace.csv.gz" -- \
    benchmarks/torch_replay/train_model.py --model llama --steps 4 > "$logs/record-llama1b.log" 2>&1 &
  pids+=($!)
  timeout $((limit + 40)) bash -c "cmake -S benchmarks/torch_replay -B '$build/torch_replay' -G Ninja \
      -DCMAKE_BUILD_TYPE=Release -DTORCH_DIR='$torch_dir' -DTORCH_CXX11_ABI='${torch_abi:-1}' &&
      cmake --build '$build/torch_replay'" > "$logs/build-torch_replay.log" 2>&1 &
  pids+=($!)
}
