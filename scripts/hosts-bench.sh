#!/usr/bin/env bash
# All-reduce across several hosts, for real: network namespaces as the hosts of a silo's
# cluster (scripts/netns-hosts.sh), their links to each other shaped to --rate-mbit while the
# ranks of one host talk over its loopback, ranks started with `ip netns exec` the way an agent
# starts them with ssh (local.launcher). Runs `xsilo bench allreduce` for the flat ring and the
# hierarchical ring on the same hosts (docs/benchmarks.md, "All-reduce across hosts"):
#   bash scripts/hosts-bench.sh [--hosts 2] [--ranks-per-host 2] [--rate-mbit 1000] [--bytes 4194304 ...]
#                               [--backend ring hierarchical hierarchical+tree ...]
# Needs root; exits 0 with "skipped: ..." where namespaces cannot be made.
set -euo pipefail
cd "$(dirname "$0")/.."

hosts=2 per_host=2 rate=1000 bytes=(1048576 16777216 67108864) backends=(ring hierarchical)
usage="usage: bash scripts/hosts-bench.sh [--hosts N] [--ranks-per-host N] [--rate-mbit N] [--bytes B ...] [--backend NAME ...]"
while [ $# -gt 0 ]; do
  case $1 in
    -h | --help) echo "$usage"; exit 0 ;;
    --hosts) hosts=$2; shift 2 ;;
    --ranks-per-host) per_host=$2; shift 2 ;;
    --rate-mbit) rate=$2; shift 2 ;;
    --bytes) shift; bytes=(); while [ $# -gt 0 ] && [[ $1 != --* ]]; do bytes+=("$1"); shift; done ;;
    --backend) shift; backends=(); while [ $# -gt 0 ] && [[ $1 != --* ]]; do backends+=("$1"); shift; done ;;
    *) echo "hosts-bench: unknown option $1; $usage" >&2; exit 2 ;;
  esac
done
for v in "$hosts" "$per_host" "$rate" "${bytes[@]}"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "hosts-bench: '$v' is not a positive integer; $usage" >&2; exit 2; }
done

echo "hosts-bench: building (scripts/build.sh)" >&2
build_dir=$(BUILD_TARGET=xsilo bash scripts/build.sh | tail -n 1)
prefix=xhb$$
trap 'bash scripts/netns-hosts.sh down "$prefix"' EXIT
set +e
addrs=$(bash scripts/netns-hosts.sh up "$prefix" "$hosts" "$rate")
code=$?
set -e
[ $code -eq 3 ] && { echo "hosts-bench: skipped (see above)"; exit 0; }
[ $code -eq 0 ] || exit $code
read -r -a host_list <<<"$addrs"
# Rank k runs on host k % hosts: every host gets per_host ranks.
ranks=$((hosts * per_host))
echo "hosts-bench: $hosts hosts (${host_list[*]}) at ${rate} Mbit/s between them, $per_host ranks each" >&2
"$build_dir/tools/xsilo" bench allreduce --no-peers --ranks "$ranks" --backend "${backends[@]}" \
  --bytes "${bytes[@]}" --hosts "${host_list[@]}" --listen-host 10.79.0.254 --launcher ip netns exec "$prefix-{host}"
