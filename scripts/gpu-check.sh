#!/usr/bin/env bash
# The GPU checks of docs/collectives.md, as one script for a machine with CUDA GPUs: builds
# xsilo with CUDA and NCCL, runs the NCCL correctness test against the exact sums the CPU
# backends are held to, and measures NCCL all-reduce bus bandwidth for 1..min(GPUs, 8) ranks.
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
