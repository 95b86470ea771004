#!/usr/bin/env bash
# Hosts of a silo's cluster, made of network namespaces on this machine, for the tests and the
# benchmark of workers on several hosts (docs/collectives.md, "Several hosts"):
#   bash scripts/netns-hosts.sh up PREFIX HOSTS RATE_MBIT    # prints one line: the hosts' addresses
#   bash scripts/netns-hosts.sh down PREFIX
# Host i is namespace PREFIX-10.79.0.<i+1> (so a launcher "ip netns exec PREFIX-{host}" reaches
# it by its address); its link to the others is a veth into a bridge in namespace PREFIX-sw,
# shaped both ways by a token bucket (tc tbf) at RATE_MBIT, while its own workers talk over
# its loopback: the inter-host ring is the slow one. This machine reaches the hosts at
# 10.79.0.254 (a veth into the same bridge), where the agent's coordinator listens.
# Needs root; exits 3 with "skipped: ..." where namespaces cannot be made. `down` removes all
# that `up` made (deleting a namespace deletes its veth ends and their peers).
set -euo pipefail

usage="usage: bash scripts/netns-hosts.sh up PREFIX HOSTS RATE_MBIT | down PREFIX"
skip() { echo "netns-hosts: skipped: $*" >&2; exit 3; }
down() {
  local prefix=$1
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${prefix}-" || true); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || echo "netns-hosts: could not delete namespace $ns" >&2
  done
  ip link del "${prefix}r" 2>/dev/null || true
}

case ${1:-} in
  down) [ $# -eq 2 ] || { echo "$usage" >&2; exit 2; }; down "$2"; exit 0 ;;
  up) [ $# -eq 4 ] || { echo "$usage" >&2; exit 2; } ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
prefix=$2 hosts=$3 rate=$4
[[ $prefix =~ ^[a-z][a-z0-9]{0,9}$ ]] || { echo "netns-hosts: PREFIX must be 1-10 lowercase letters and digits" >&2; exit 2; }
[[ $hosts =~ ^[1-9][0-9]*$ && $hosts -le 50 ]] || { echo "netns-hosts: HOSTS must be 1..50" >&2; exit 2; }
[[ $rate =~ ^[1-9][0-9]*$ ]] || { echo "netns-hosts: RATE_MBIT must be a positive integer" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || skip "needs root to make network namespaces"
command -v ip >/dev/null && command -v tc >/dev/null || skip "needs ip and tc (Debian package iproute2)"
trap 'rc=$?; [ $rc -eq 0 ] || down "$prefix"; exit $rc' EXIT

sw=$prefix-sw
ip netns add "$sw" 2>/dev/null || skip "cannot make network namespace $sw (no CAP_SYS_ADMIN?)"
ip -n "$sw" link set lo up
ip -n "$sw" link add br0 type bridge
ip -n "$sw" link set br0 up
ip link add "${prefix}r" type veth peer name up0 netns "$sw"
ip -n "$sw" link set up0 master br0 up
ip addr add 10.79.0.254/24 dev "${prefix}r"
ip link set "${prefix}r" up
# A token bucket at the link rate: bursts of 10 ms (at least 64 KiB), at most 50 ms of queue.
burst=$(( rate * 1250 > 65536 ? rate * 1250 : 65536 ))
shape() { ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "${rate}mbit" burst "$burst" latency 50ms ||
  skip "cannot shape $2 with tc tbf (kernel module sch_tbf?)"; }
addrs=()
for ((i = 0; i < hosts; i++)); do
  addr=10.79.0.$((i + 1))
  ns=$prefix-$addr
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip -n "$sw" link add "h$i" type veth peer name eth0 netns "$ns"
  ip -n "$sw" link set "h$i" master br0 up
  ip -n "$ns" addr add "$addr/24" dev eth0
  ip -n "$ns" link set eth0 up
  shape "$ns" eth0     # host -> the others
  shape "$sw" "h$i"    # the others -> host
  addrs+=("$addr")
done
echo "${addrs[*]}"
