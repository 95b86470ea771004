#!/usr/bin/env bash
# Record-level DP on the PyTorch (Opacus) example: examples/opacus/train.py as each silo's
# external trainer under a budget of epsilon E at delta 1e-5, against the same script's DP-SGD run
# centrally at the same epsilon and against both without DP (docs/benchmarks.md, "Record-level
# differential privacy", the PyTorch rows). Each silo's script chooses its own noise for its own
# data (`--epsilon E --total-epochs ROUNDS`), and the agent accounts and enforces the budget.
#
# Usage: scripts/bench_record_dp_torch.sh XSILO_BIN OUT_DIR "EPSILONS" "SEEDS" [PYTHON]
#   e.g. scripts/bench_record_dp_torch.sh build/tools/xsilo runs/dpt "1 3 8" "1 2 3" ~/.venvs/opacus/bin/python
# PYTHON is an interpreter with opacus and torch (examples/opacus/README.md says how to make one).
# Prints one line per run: name final_accuracy epsilon_spent.
set -euo pipefail
bin=$(realpath "$1") out=$2 epsilons=$3 seeds=$4 python=${5:-python3}
repo=$(cd "$(dirname "$0")/.." && pwd)
rounds=5
mkdir -p "$out"
out=$(realpath "$out")
venv_bin=$(dirname "$(command -v "$python")")

federated() {  # name seed privacy_json trainer_args...
  local name=$1 seed=$2 privacy=$3
  shift 3
  local args
  args=$(printf '"%s", ' "$@")
  cat > "$out/$name.json" <<JSON
{"name": "$name", "silos": 4, "rounds": $rounds, "seed": $seed, "baseline": false,
 "data": {"dataset": "digits", "test_fraction": 0.2, "split": "dirichlet", "alpha": 1.0},
 "trainer": {"command": ["python3", "$repo/examples/opacus/train.py", ${args%, }], "evaluate": true, "startup_s": 300},
 "training": {"local_epochs": 1, "batch_size": 32, "learning_rate": 0.1}
 $privacy}
JSON
  PATH="$venv_bin:$PATH" "$bin" sim --config "$out/$name.json" --out "$out/$name" > "$out/$name.log" 2>&1 || true
  python3 - "$out/$name/summary.json" "$name" <<'PY'
import json, sys
try:
    s = json.load(open(sys.argv[1]))
    print(sys.argv[2], s.get("final_accuracy"), s.get("epsilon_spent"))
except OSError as e:
    print(sys.argv[2], "failed:", e)
PY
}

central() {  # name seed trainer_args...
  local name=$1 seed=$2
  shift 2
  "$python" "$repo/examples/opacus/train.py" --epochs "$rounds" --seed "$seed" "$@" > "$out/$name.log" 2>&1 || true
  python3 - "$out/$name.log" "$name" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
acc = re.findall(r"central: \{[^}]*'eval_accuracy': ([0-9.]+)", text)
eps = re.findall(r"epsilon ([0-9.]+) at delta", text)
print(sys.argv[2], acc[-1] if acc else "none", eps[-1] if eps else "no DP")
PY
}

for seed in $seeds; do
  federated "fed_nodp_s$seed" "$seed" "" --no-dp --seed "$seed"
  central "central_nodp_s$seed" "$seed" --no-dp
  for eps in $epsilons; do
    federated "fed_e${eps}_s$seed" "$seed" ", \"privacy\": {\"level\": \"record\", \"max_epsilon\": $eps, \"delta\": 1e-5}" \
      --epsilon "$eps" --total-epochs "$rounds" --seed "$seed"
    central "central_e${eps}_s$seed" "$seed" --epsilon "$eps" --total-epochs "$rounds"
  done
done
