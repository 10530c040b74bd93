set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
source .devkit/devkit.sh unpack
export FRAGCTL_LIBRARY=$PWD/build-gpu/libfragctl.so PYTHONPATH=$PWD/python FRAGCTL_TORCH_BUILD_DIR=$PWD/build-gpu/torch-native
t0=$SECONDS; L=/tmp/logs2; mkdir -p $L/ms
F=$(ls build-gpu/tools/fragctl build-gpu/fragctl 2>/dev/null | head -1)
FRAGCTL_REPORT="$L/ms/run.{rank}.json" timeout 120 torchrun --nproc-per-node 2 tools/gpu/memsplit_check.py > $L/memsplit.log 2>&1; echo "[$((SECONDS - t0)) s] memsplit rc=$?"
grep -E "check|OOM message|group|used but|nvidia-smi|Error|error" $L/memsplit.log | cut -c1-700 | head -30
$F report $L/ms/run.*.json 2>&1 | head -80
cp $L/ms/run.0.json $OUT/ 2>/dev/null
echo "=== nccl_register"
OUT=$L/nr MODES="native-reg fragctl-reg native-pool fragctl-pool" timeout 300 bash benchmarks/interop/nccl_register.sh 2>&1 | grep -v "^ *[0-9]* .*NCCL INFO" | head -40
cp $L/nr/*.json $OUT/ 2>/dev/null; echo "[$((SECONDS - t0)) s] done"
