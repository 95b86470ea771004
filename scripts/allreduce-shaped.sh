#!/usr/bin/env bash
# The local workers' all-reduce on a shaped link: float32 ring against the 8-bit all-reduce
# (local.compression "int8"), docs/benchmarks.md:
#   bash scripts/allreduce-shaped.sh [--rate-mbit 1000] [--ranks 4] [--bytes 67108864]
# Needs root. `xsilo bench allreduce` runs inside a network namespace of its own whose loopback
# is shaped by a token bucket (tc tbf) to the rate: every worker's traffic shares it, as workers
# on one host share its NIC (or several hosts one uplink). The namespace is removed on exit, on
# failure and on Ctrl-C. Exits 0 with "skipped: ..." where namespaces cannot be made.
set -euo pipefail
cd "$(dirname "$0")/.."

rate=1000 ranks=4 bytes=67108864
usage="usage: bash scripts/allreduce-shaped.sh [--rate-mbit N] [--ranks K] [--bytes B]"
while [ $# -gt 0 ]; do
  case $1 in -h | --help) echo "$usage"; exit 0 ;; esac
  [ $# -ge 2 ] || { echo "allreduce-shaped: $1 needs a value; $usage" >&2; exit 2; }
  case $1 in
    --rate-mbit) rate=$2 ;;
    --ranks) ranks=$2 ;;
    --bytes) bytes=$2 ;;
    *) echo "allreduce-shaped: unknown option $1; $usage" >&2; exit 2 ;;
  esac
  shift 2
done
for v in "$rate" "$ranks" "$bytes"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "allreduce-shaped: '$v' is not a positive integer; $usage" >&2; exit 2; }
done
[ "$ranks" -ge 2 ] && [ "$ranks" -le 16 ] || { echo "allreduce-shaped: --ranks must be 2..16" >&2; exit 2; }

skip() { echo "allreduce-shaped: skipped: $*"; exit 0; }
[ "$(id -u)" -eq 0 ] || skip "needs root to make a network namespace (run it with sudo)"
command -v ip >/dev/null && command -v tc >/dev/null || skip "needs ip and tc (Debian package iproute2)"

ns=xar$$
made=false
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  if $made; then
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || echo "allreduce-shaped: could not delete namespace $ns" >&2
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'echo "allreduce-shaped: interrupted" >&2; exit 130' INT
trap 'echo "allreduce-shaped: terminated" >&2; exit 143' TERM

echo "allreduce-shaped: building (scripts/build.sh)" >&2
build_dir=$(BUILD_TARGET=xsilo bash scripts/build.sh | tail -n 1)
ip netns add "$ns" 2>/dev/null || skip "cannot make network namespace $ns (ip netns add failed; no CAP_SYS_ADMIN?)"
made=true
ip -n "$ns" link set lo up
# Bursts of 10 ms at the rate, at least one 64 KiB loopback segment; at most 50 ms of queue.
burst=$(( rate * 1250 > 65536 ? rate * 1250 : 65536 ))
ip netns exec "$ns" tc qdisc replace dev lo root tbf rate "${rate}mbit" burst "$burst" latency 50ms 2>/dev/null ||
  skip "cannot shape lo with tc tbf (kernel module sch_tbf?)"
echo "allreduce-shaped: $ranks ranks sharing a ${rate} Mbit/s loopback, ${bytes} bytes" >&2
ip netns exec "$ns" "$build_dir/tools/xsilo" bench allreduce --ranks "$ranks" --bytes "$bytes" --backend ring int8 --no-peers
