#!/usr/bin/env bash
# The kill-storm soak (issue 17): a small federation (4 silos, 2 edges, logistic regression on
# breast_cancer) run by `xsilo sim` for --rounds rounds while the sim SIGKILLs and restarts a
# process drawn from --seed (server, an edge or a silo) every 3-5 rounds, as a round starts or
# as its first upload is granted. Then scripts/kill_storm_check.py checks the evidence (no
# committed round lost or repeated, reasons for every failure, the audit log with every silo's
# witness, server RSS and descriptors) and prints the summary table. docs/benchmarks.md,
# "Kill storm", has the figures.
#
#   scripts/kill-storm.sh [--rounds 2000] [--seed 1] [--every 3,5] [--out runs/kill-storm] [--xsilo build/tools/xsilo]
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=2000 seed=1 every=3,5 out=runs/kill-storm xsilo=build/tools/xsilo
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --every) every=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --xsilo) xsilo=$2; shift 2 ;;
    *) echo "usage: $0 [--rounds N] [--seed N] [--every MIN,MAX] [--out DIR] [--xsilo PATH]" >&2; exit 2 ;;
  esac
done
[ -x "$xsilo" ] || { echo "$xsilo: not built (cmake --build build)" >&2; exit 2; }

mkdir -p "$out"
config="$out/storm.json"
cat > "$config" <<EOF
{
  "name": "kill-storm",
  "silos": 4, "edges": 2, "rounds": $rounds, "seed": 3, "baseline": false,
  "data": {"dataset": "breast_cancer", "split": "iid"},
  "model": {"kind": "logistic"},
  "training": {"local_epochs": 1, "batch_size": 16, "learning_rate": 0.1},
  "selection": {"min_silos": 2, "min_updates": 2},
  "deadlines": {"join_s": 5, "train_s": 5, "upload_s": 5},
  "kill_storm": {"seed": $seed, "every_rounds": [$every], "targets": ["server", "edges", "silos"]}
}
EOF

start=$(date +%s)
set +e
"$xsilo" sim --config "$config" --out "$out/run" > "$out/sim.log" 2>&1
sim_code=$?
set -e
secs=$(( $(date +%s) - start ))
echo "xsilo sim exited $sim_code after $secs s ($(grep -c '^round' "$out/sim.log") rounds reported); log: $out/sim.log"
check=0
/usr/bin/python3 scripts/kill_storm_check.py "$out/run" --rounds "$rounds" --xsilo "$xsilo" || check=$?
[ "$sim_code" -eq 0 ] && exit "$check"
exit 1
