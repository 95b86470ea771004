#!/usr/bin/env bash
# Fuzzes one target (or `all`, one after the other) for SECONDS each with libFuzzer:
#   bash scripts/fuzz.sh TARGET SECONDS [libFuzzer options...]
# Targets: frame safetensors config coordinator relay session compression packed trainer secagg (fuzz/*.cpp). Builds with clang
# and ASan into build-fuzz/ (CUDA off; UBSan runs over the corpora in the test suite, see
# fuzz/CMakeLists.txt). Starts from the checked-in seeds in fuzz/corpus/TARGET; the corpus it
# grows stays in build-fuzz/corpus/TARGET; a crash is saved to build-fuzz/crashes/TARGET/ and
# the script exits 1 naming it: fix the bug, then add the input to fuzz/corpus/TARGET, where
# the test Fuzz.TARGET replays it from then on. Prints executions and coverage; -jobs=N
# -workers=N runs N processes over the one corpus and adds up their executions. With
# FUZZ_ASAN=0 it builds without ASan into build-fuzz-noasan/ (several times the inputs a
# second, for runs of 10 million) and then replays the corpus it grew under ASan.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(frame safetensors config coordinator relay session compression packed trainer secagg)
if [ $# -lt 2 ]; then
  echo "usage: bash scripts/fuzz.sh TARGET|all SECONDS [libFuzzer options]; targets: ${targets[*]}" >&2
  exit 2
fi
target=$1
seconds=$2
shift 2
bash scripts/install-deps.sh clang >&2
# build_fuzzer DIR ASAN(ON|OFF) TARGET...: configures (every time, cheap once cached: a target added
# since the last run needs it) and builds these targets' fuzzers, all in one build (their links
# run side by side).
build_fuzzer() {
  local dir=$1 asan=$2 t
  shift 2
  local wanted=()
  for t in "$@"; do wanted+=(--target "fuzz_$t"); done
  CC=clang CXX=clang++ cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DXSILO_FUZZ=ON -DXSILO_CUDA=OFF \
    -DXSILO_FUZZ_ASAN="$asan" -DBUILD_TESTING=OFF >&2
  cmake --build "$dir" -j"${JOBS:-2}" "${wanted[@]}" >&2
}
if [ "$target" = all ]; then
  # Every fuzzer built first, together, then each run without building again.
  if [ "${FUZZ_ASAN:-1}" = 0 ]; then dir=${BUILD_DIR:-build-fuzz-noasan}; on=OFF; else dir=${BUILD_DIR:-build-fuzz}; on=ON; fi
  build_fuzzer "$dir" "$on" "${targets[@]}"
  for t in "${targets[@]}"; do FUZZ_BUILT=1 bash "$0" "$t" "$seconds" "$@"; done
  exit 0
fi
case " ${targets[*]} " in *" $target "*) ;; *) echo "fuzz: no target $target; targets: ${targets[*]}" >&2; exit 2 ;; esac
# failed LOG WHAT: says what failed and the sanitizer's summary from LOG, then exits 1.
failed() {
  echo "fuzz: $target $2 (log $1):" >&2
  grep -aE 'ERROR|SUMMARY|Test unit written|==[0-9]+==' "$1" | head -n 20 >&2
  exit 1
}
# FUZZ_ASAN=0: a build without ASan (build-fuzz-noasan/), for long runs; the corpus it grows is
# then replayed under ASan with the ASan build (below), so a memory bug among the inputs it kept
# still fails the run.
asan=${FUZZ_ASAN:-1}
if [ "$asan" = 0 ]; then build=${BUILD_DIR:-build-fuzz-noasan}; asan_option=OFF; else build=${BUILD_DIR:-build-fuzz}; asan_option=ON; fi
[ "${FUZZ_BUILT:-}" = 1 ] || build_fuzzer "$build" "$asan_option" "$target"

corpus=$build/corpus/$target
crashes=$build/crashes/$target
mkdir -p "$corpus" "$crashes"
log=$build/fuzz_$target.log
echo "fuzz: $target for ${seconds}s (log $log)"
# -jobs=N -workers=N (libFuzzer's parallel mode: N processes sharing the one corpus directory,
# each running the whole -runs): each job writes fuzz-JOB.log into the current directory and the
# parent copies it into its own output when the job ends, so the run happens in $jobdir and this
# run's log holds every job's lines and final stats.
root=$PWD
jobdir=$build/jobs_$target
rm -rf "$jobdir"
mkdir -p "$jobdir"
set +e
# -rss_limit_mb: the targets hold small models; more is a leak or an unchecked length.
# -close_fd_mask=1: the cores' log lines (stdout) go to /dev/null, formatted but not written, or
# an hour's run writes tens of GB of them; libFuzzer's lines and the sanitizers' go to stderr.
(cd "$jobdir" && "$root/$build/fuzz/fuzz_$target" "$root/$corpus" "$root/fuzz/corpus/$target" \
  -max_total_time="$seconds" -print_final_stats=1 -rss_limit_mb=2048 -artifact_prefix="$root/$crashes/" \
  -timeout=10 -close_fd_mask=1 "$@") >"$log" 2>&1
rc=$?
set -e
# Inputs run: the final stats of every process (one, or one per job); -fork=N prints none, and its
# last status line counts all its processes' inputs.
runs=$(grep -ao 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' |
  awk '{ n += $1 } END { if (NR) print n }' || true)
processes=$(grep -ac 'stat::number_of_executed_units' "$log" || true)
last=$(grep -aE '^#[0-9]+' "$log" | sort -t' ' -k1.2n | tail -n 1 || true)
[ -n "$runs" ] || runs=$(grep -aoE '^#[0-9]+' <<<"$last" | tr -d '#' || true)
# Coverage: the most any process reached (each counts its own; one process's lines only grow).
cov=$(grep -ao 'cov: [0-9]*' "$log" | grep -o '[0-9]*' | sort -n | tail -n 1 || true)
ft=$(grep -ao 'ft: [0-9]*' "$log" | grep -o '[0-9]*' | sort -n | tail -n 1 || true)
in_processes=""
if [ "${processes:-0}" -gt 1 ]; then in_processes=" (in $processes processes)"; fi
echo "fuzz: $target: ${runs:-?} executions$in_processes, coverage ${cov:-?} edges, ${ft:-?} features, corpus $(ls "$corpus" | wc -l) inputs"
if [ $rc -ne 0 ]; then failed "$log" "FAILED (exit $rc)"; fi
if [ "$asan" = 0 ]; then
  # Every input the run kept, once more under ASan: -runs=0 runs the corpus and stops at the first crash.
  build_fuzzer build-fuzz ON "$target"
  replay_log=$build/fuzz_${target}_asan_replay.log
  if ! build-fuzz/fuzz/fuzz_$target "$corpus" -runs=0 -rss_limit_mb=2048 -timeout=10 \
      -artifact_prefix="$crashes/" >"$replay_log" 2>&1; then
    failed "$replay_log" "FAILED under ASan on an input of its corpus"
  fi
  echo "fuzz: $target: the corpus's $(ls "$corpus" | wc -l) inputs replayed under ASan without a finding"
fi
