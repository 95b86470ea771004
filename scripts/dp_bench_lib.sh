# Sourced by the in-process DP benchmarks (scripts/bench_distributed_dp.sh,
# bench_central_dp_adaptive.sh, bench_dp_robust.sh), which set $bin (the xsilo binary) and $out.
#
# dp_sim NAME CONFIG_JSON: writes $out/NAME.json, runs `xsilo sim --in-process` on it (output in
# $out/NAME, log in $out/NAME.log; a failed run is reported, not fatal) and prints one line:
# NAME, the last committed round's accuracy, the epsilon spent (or "none") and the seconds taken.
# With DP_SIM_PROCESSES=1 the sim runs real processes over TLS instead (what the in-process sim
# refuses, compressed uploads among them, needs it).
dp_sim() {
  local name=$1 config=$2 start end mode=--in-process
  [ "${DP_SIM_PROCESSES:-}" = 1 ] && mode=--quiet
  printf '%s\n' "$config" > "$out/$name.json"
  start=$(date +%s.%N)
  "$bin" sim $mode --config "$out/$name.json" --out "$out/$name" > "$out/$name.log" 2>&1 || true
  end=$(date +%s.%N)
  python3 - "$out/$name.log" "$name" "$start" "$end" "$out/$name/summary.json" <<'PY'
import json, os, re, sys
text = open(sys.argv[1]).read()
acc = re.findall(r"accuracy ([0-9.]+)", text)
eps = re.findall(r"epsilon ([0-9.]+) of", text)
if os.path.exists(sys.argv[5]):  # real processes: their summary
    s = json.load(open(sys.argv[5]))
    acc = ["%.4f" % s["final_accuracy"]] if s.get("rounds_committed") else []
    eps = ["%.3f" % s["epsilon_spent"]] if "epsilon_spent" in s else []
print(sys.argv[2], acc[-1] if acc else "none", eps[-1] if eps else "none", "%.1f" % (float(sys.argv[4]) - float(sys.argv[3])))
PY
}
