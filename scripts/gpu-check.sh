#!/usr/bin/env bash
# The GPU checks of docs/collectives.md, as one script for a machine with CUDA GPUs: builds
# xsilo with CUDA and NCCL, runs the NCCL correctness test against the exact sums the CPU
# backends are held to, measures NCCL all-reduce bus bandwidth for 1..min(GPUs, 8) ranks, and
# measures the hierarchical all-reduce with NCCL inside each host against TCP there, runs the
# PyTorch example on CUDA (NCCL between 2 workers per silo when there are 2 GPUs).
# Usage: bash scripts/gpu-check.sh [OUT_DIR]   (figures go to OUT_DIR/gpu-check.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-check}
mkdir -p "$out"
nvidia-smi -L | tee "$out/gpu-check.txt"
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DXSILO_CUDA=ON -DXSILO_NATIVE=OFF >/dev/null
cmake --build build-gpu -j"$(nproc)" --target xsilo collective_test
./build-gpu/tools/xsilo --version | tee -a "$out/gpu-check.txt"
XSILO_BIN=$PWD/build-gpu/tools/xsilo XSILO_DATA_DIR=$PWD/data \
  ./build-gpu/tests/collective_test --gtest_filter='*Nccl*:Collective.*' | tee -a "$out/gpu-check.txt"
gpus=$(nvidia-smi -L | wc -l)
ranks=()
for n in 1 2 4 8; do [ "$n" -le "$gpus" ] && ranks+=("$n"); done
./build-gpu/tools/xsilo bench allreduce --backend nccl ring --ranks "${ranks[@]}" --no-peers \
  --bytes 4096 1048576 67108864 268435456 | tee -a "$out/gpu-check.txt"

# NCCL inside the hierarchical path (issue 44 item 4): two "hosts" of min(GPUs, 4) workers each,
# each worker of a host on its own GPU. The exact-sum test (it skips, saying why, with fewer than
# 2 GPUs), then the hierarchical all-reduce with the intra-host phases on NCCL against the same
# on the TCP mesh.
echo "== hierarchical with NCCL inside the hosts" | tee -a "$out/gpu-check.txt"
XSILO_BIN=$PWD/build-gpu/tools/xsilo ./build-gpu/tests/collective_test \
  --gtest_filter='Collective.HierarchicalWithNcclInsideTheHostsIsExactOnTheGpus:Collective.HierarchicalInsideTheHosts*' \
  | tee -a "$out/gpu-check.txt"
per_host=$(( gpus < 4 ? gpus : 4 ))
if [ "$per_host" -ge 2 ]; then
  for intra in tcp nccl; do
    ./build-gpu/tools/xsilo bench allreduce --backend hierarchical --ranks $(( 2 * per_host )) \
      --ranks-per-host "$per_host" --intra-host "$intra" --no-peers --bytes 1048576 67108864 \
      | sed "s/^/intra-host $intra: /" | tee -a "$out/gpu-check.txt"
  done
else
  echo "hierarchical bench with NCCL inside the hosts skipped: $gpus GPU(s), a host needs 2" | tee -a "$out/gpu-check.txt"
fi

# The PyTorch example (examples/pytorch) on CUDA, with the user's own torch: 2 silos, each with
# 2 workers over NCCL when there are two GPUs (NCCL needs one GPU per worker), else 1 worker on
# the GPU. The trainer's log says which device and backend it used.
py=${XSILO_PYTHON:-python3}
"$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.device_count(), 'GPU(s)')" \
  | tee -a "$out/gpu-check.txt"
pt_workers=1
[ "$gpus" -ge 2 ] && pt_workers=2
"$py" - "$pt_workers" "$py" "$PWD" > build-gpu/pytorch-gpu.json <<'PY'
import json, sys
workers, python, repo = int(sys.argv[1]), sys.argv[2], sys.argv[3]
cfg = json.load(open(f"{repo}/examples/pytorch/sim.json"))
cfg.update({"name": "pytorch-digits-cnn-gpu", "silos": 2, "rounds": 5, "local": {"workers": workers}})
cfg["model"]["path"] = f"{repo}/build-gpu/pytorch-init.safetensors"
cfg["trainer"].update({"command": [python, "train.py"], "init": [python, "train.py", "--init", "{path}"],
                       "cwd": f"{repo}/examples/pytorch"})
print(json.dumps(cfg))
PY
rm -f build-gpu/pytorch-init.safetensors
./build-gpu/tools/xsilo sim --config build-gpu/pytorch-gpu.json --out "$out/pytorch-gpu" | tee -a "$out/gpu-check.txt"
grep -h "worker 0 of" "$out"/pytorch-gpu/silos/*/state/trainer/rank-0.log | tee -a "$out/gpu-check.txt"
