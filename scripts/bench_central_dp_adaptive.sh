#!/usr/bin/env bash
# Silo-level central DP on digits, 10 silos, in-process: a fixed clip norm against adaptive
# clipping (its count noised and accounted) at the same epsilon (docs/benchmarks.md, "Silo-level
# central DP"). Usage:
#   scripts/bench_central_dp_adaptive.sh XSILO_BIN OUT_DIR "EPSILONS" "SEEDS" MODEL ROUNDS CLIP "INITIALS"
# e.g. scripts/bench_central_dp_adaptive.sh build/tools/xsilo runs/cdp-adaptive "8" "1 2 3" logistic 10 0.3 "0.3 1"
# Prints one line per run: name final_accuracy epsilon_spent seconds.
set -euo pipefail
bin=$1 out=$2 epsilons=$3 seeds=$4 model=${5:-logistic} rounds=${6:-10} clip=${7:-0.3} initials=${8:-"0.3 1"}
mkdir -p "$out"
. "$(dirname "$0")/dp_bench_lib.sh"
model_json='{"kind": "logistic"}'
[ "$model" = mlp ] && model_json='{"kind": "mlp", "hidden": [64]}'
run() {  # name privacy_json aggregation_json seed
  local name=$1 privacy=$2 aggregation=$3 seed=$4
  dp_sim "$name" "$(cat <<JSON
{"name": "$name", "federation": "sim", "silos": 10, "rounds": $rounds, "seed": $seed, "baseline": false,
 "data": {"dataset": "digits", "test_fraction": 0.2, "standardize": true, "split": "dirichlet", "alpha": 0.5},
 "model": $model_json,
 "training": {"local_epochs": 2, "batch_size": 32, "learning_rate": 0.05},
 "optimizer": {"kind": "fedavgm", "lr": 1.0, "momentum": 0.5}
 $aggregation, "privacy": $privacy}
JSON
)"
}
for eps in $epsilons; do
  for seed in $seeds; do
    run "fixed_e${eps}_c${clip}_s${seed}" "{\"level\": \"silo\", \"mode\": \"central\", \"epsilon\": $eps, \"delta\": 1e-5, \"clip_norm\": $clip}" "" "$seed"
    for init in $initials; do
      run "adaptive_e${eps}_i${init}_s${seed}" "{\"level\": \"silo\", \"mode\": \"central\", \"epsilon\": $eps, \"delta\": 1e-5}" \
        ", \"aggregation\": {\"adaptive_clip\": {\"quantile\": 0.5, \"lr\": 0.2, \"initial\": $init}}" "$seed"
    done
  done
done
