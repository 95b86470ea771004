#!/usr/bin/env bash
# Silo-level distributed DP (Skellam) against central DP on digits, 10 silos, in-process
# (docs/benchmarks.md, "Silo-level distributed DP"). Usage:
#   scripts/bench_distributed_dp.sh XSILO_BIN OUT_DIR "EPSILONS" "BITS" "SEEDS" MODEL ROUNDS CLIP
# e.g. scripts/bench_distributed_dp.sh build/tools/xsilo runs/ddp "1 3 8" "12 16 20" "1 2 3" logistic 10 0.3
# Environment: SILOS (default 10), THRESHOLD (the Shamir threshold as a fraction of the group,
# default 2/3; n_min, the survivors the noise is sized for, follows it) and SPLIT (default
# "dirichlet"; 100 silos of digits need "iid": a Dirichlet split leaves silos under 8 rows), e.g.
# the 100-silo rows:
#   SILOS=100 THRESHOLD=0.9 SPLIT=iid scripts/bench_distributed_dp.sh build/tools/xsilo runs/ddp100 "1 3 8" "12 16 20" "1 2 3"
# An epsilon of "none" runs the same federation without DP. RANDOM_K=F adds random-k compression
# of fraction F to the distributed runs (secure random-k; real processes, which it needs), e.g.
#   RANDOM_K=0.1 scripts/bench_distributed_dp.sh build/tools/xsilo runs/ddp_rk "8" "20" "1 2 3"
# ADAPTIVE="INITIALS" also runs each distributed configuration with adaptive clipping (quantile
# 0.5, lr 0.2) from each initial C, its count word noised by the silos and accounted (issue 42),
# at the same epsilon, e.g.
#   ADAPTIVE="0.3 1" scripts/bench_distributed_dp.sh build/tools/xsilo runs/ddp_adaptive "8" "20" "1 2 3"
# Prints one line per run: name final_accuracy epsilon_spent seconds.
set -euo pipefail
bin=$1 out=$2 epsilons=$3 bits_list=$4 seeds=$5 model=${6:-logistic} rounds=${7:-10} clip=${8:-0.3}
silos=${SILOS:-10} threshold=${THRESHOLD:-0.6666666666666666} split=${SPLIT:-dirichlet}
mkdir -p "$out"
. "$(dirname "$0")/dp_bench_lib.sh"
model_json='{"kind": "logistic"}'
[ "$model" = mlp ] && model_json='{"kind": "mlp", "hidden": [64]}'
run() {  # name privacy_json secure_json
  local name=$1 privacy=$2 secure=$3 seed=$4
  local privacy_member=""
  [ -n "$privacy" ] && privacy_member=", \"privacy\": $privacy"
  dp_sim "$name" "$(cat <<JSON
{"name": "$name", "federation": "sim", "silos": $silos, "rounds": $rounds, "seed": $seed, "baseline": false,
 "data": {"dataset": "digits", "test_fraction": 0.2, "standardize": true, "split": "$split", "alpha": 0.5},
 "model": $model_json,
 "training": {"local_epochs": 2, "batch_size": 32, "learning_rate": 0.05},
 "optimizer": {"kind": "fedavgm", "lr": 1.0, "momentum": 0.5}
 $secure$privacy_member}
JSON
)"
}
for eps in $epsilons; do
  for seed in $seeds; do
    if [ "$eps" = none ]; then  # the same federation without DP (plain rounds)
      run "nodp_s${seed}" "" "" "$seed"
      continue
    fi
    run "central_e${eps}_s${seed}" "{\"level\": \"silo\", \"mode\": \"central\", \"epsilon\": $eps, \"delta\": 1e-5, \"clip_norm\": $clip}" "" "$seed"
    for bits in $bits_list; do
      # A 16-bit wire ring for bits <= 16; fraction_bits is the fixed-point codec's, unused by the
      # Skellam encoding, lowered only so that the codec's own overflow check passes.
      ring=32 frac=16; [ "$bits" -le 16 ] && ring=16 frac=8
      compression="" kind=distributed
      if [ -n "${RANDOM_K:-}" ]; then
        compression=", \"compression\": {\"scheme\": \"random_k\", \"fraction\": $RANDOM_K}" kind=randomk${RANDOM_K}
      fi
      secure=", \"secure\": {\"mode\": \"global\", \"min_group\": 3, \"threshold\": $threshold, \"modulus_bits\": $ring, \"fraction_bits\": $frac, \"max_weight\": 1"
      DP_SIM_PROCESSES=${RANDOM_K:+1} run "${kind}_e${eps}_b${bits}_s${seed}" \
        "{\"level\": \"silo\", \"mode\": \"distributed\", \"epsilon\": $eps, \"delta\": 1e-5, \"clip_norm\": $clip, \"bits\": $bits}" \
        "$secure}$compression" "$seed"
      for init in ${ADAPTIVE:-}; do  # secure.clip_norm caps the adaptive C: set well above it
        DP_SIM_PROCESSES=${RANDOM_K:+1} run "adaptive_i${init}_e${eps}_b${bits}_s${seed}" \
          "{\"level\": \"silo\", \"mode\": \"distributed\", \"epsilon\": $eps, \"delta\": 1e-5, \"bits\": $bits}" \
          "$secure, \"clip_norm\": 10}$compression, \"aggregation\": {\"adaptive_clip\": {\"quantile\": 0.5, \"lr\": 0.2, \"initial\": $init}}" "$seed"
      done
    done
  done
done
