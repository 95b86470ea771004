#!/usr/bin/env bash
# Robust rules on noisy group sums (issue 42 item 5; docs/benchmarks.md, "Robust rules on noisy
# group sums"): digits logistic, 100 silos in secure groups of 10, silo-level distributed DP
# (Skellam) or none, with and without sign-flipping silos, the rule across the ten group means.
# In-process. Usage:
#   scripts/bench_dp_robust.sh XSILO_BIN OUT_DIR "EPSILONS" "RULES" "ATTACKERS" "SEEDS" ROUNDS
# e.g. scripts/bench_dp_robust.sh build/tools/xsilo runs/dpr "none 8 3" "fedavg median trimmed_mean multi_krum" "0 5" "1 2 3" 10
# EPSILONS: "none" runs without DP (grouped secure aggregation only). Prints one line per run:
# name final_accuracy epsilon_spent seconds.
set -euo pipefail
bin=$1 out=$2 epsilons=$3 rules=$4 attackers_list=$5 seeds=$6 rounds=${7:-10}
mkdir -p "$out"
. "$(dirname "$0")/dp_bench_lib.sh"
# f counts groups: 2 of the 10 group means (5 attackers spoil about 4 groups, each diluted by its
# 9 honest members; f = 4 would leave Multi-Krum no room: n > 2f + 2).
aggregation() {
  case $1 in
    fedavg) echo '{"rule": "fedavg"}' ;;
    median) echo '{"rule": "median", "f": 2}' ;;
    trimmed_mean) echo '{"rule": "trimmed_mean", "f": 2}' ;;
    multi_krum) echo '{"rule": "multi_krum", "f": 2}' ;;
    centered_clip) echo '{"rule": "centered_clip", "f": 2}' ;;
  esac
}
for eps in $epsilons; do
  privacy=""
  [ "$eps" != none ] && privacy=", \"privacy\": {\"level\": \"silo\", \"mode\": \"distributed\", \"epsilon\": $eps, \"delta\": 1e-5, \"clip_norm\": 0.3, \"bits\": 20}"
  for attackers in $attackers_list; do
    attack=""
    [ "$attackers" -gt 0 ] && attack=", \"attack\": {\"silos\": $attackers, \"kind\": \"sign_flip\", \"scale\": 10}"
    for rule in $rules; do
      for seed in $seeds; do
        name="e${eps}_a${attackers}_${rule}_s${seed}"
        dp_sim "$name" "$(cat <<JSON
{"name": "$name", "federation": "sim", "silos": 100, "rounds": $rounds, "seed": $seed, "baseline": false,
 "data": {"dataset": "digits", "test_fraction": 0.2, "standardize": true, "split": "iid"},
 "model": {"kind": "logistic"},
 "training": {"local_epochs": 2, "batch_size": 32, "learning_rate": 0.05},
 "optimizer": {"kind": "fedavgm", "lr": 1.0, "momentum": 0.5},
 "selection": {"min_silos": 100, "min_updates": 100},
 "secure": {"mode": "grouped", "min_group": 10, "group_dropouts": 0, "modulus_bits": 32, "max_weight": 1},
 "aggregation": $(aggregation "$rule") $attack $privacy}
JSON
)"
      done
    done
  done
done
