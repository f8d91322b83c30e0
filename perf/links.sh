#!/usr/bin/env bash
# Runs one command per rank, each rank in its own network namespace behind a
# shaped link, to measure collectives on a slow network with one machine.
#
#   perf/links.sh --rate 1gbit --ranks 4 -- build/perf/squall_perf -b 256M -e 256M --vs none
#
# Topology: a private bridge namespace plays the switch; rank i lives in
# namespace <job>r<i> with address 10.77.<job>.<i+1>/24 on a veth whose both
# directions are shaped with tc tbf to --rate (so every rank has a NIC of that
# speed, as on a real cluster). These addresses exist only inside the
# namespaces this script creates; nothing leaves the machine. Each rank gets
# torchrun-style RANK, WORLD_SIZE, LOCAL_RANK=0, MASTER_ADDR (rank 0) and
# MASTER_PORT. Everything is torn down on exit, also on failure or Ctrl-C.
# Needs root and network namespaces; prints why and exits 77 (skip) otherwise.
set -euo pipefail

rate=1gbit
ranks=2
burst=""
delay=""
usage() {
  echo "usage: $0 [--rate 1gbit|10gbit|...] [--ranks N] [--delay 100us] -- command [args...]" >&2
  exit 2
}
while (($#)); do
  case $1 in
    --rate) rate=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
(($#)) || usage
[[ $ranks =~ ^[0-9]+$ ]] && ((ranks >= 1 && ranks <= 64)) || { echo "--ranks must be 1..64" >&2; exit 2; }

if [[ $(id -u) -ne 0 ]]; then echo "links.sh: skipped: needs root for network namespaces" >&2; exit 77; fi
command -v ip >/dev/null && command -v tc >/dev/null ||
  { echo "links.sh: skipped: needs ip and tc (apt-get install iproute2)" >&2; exit 77; }

job=$(( $$ % 200 + 20 ))   # a per-run subnet and name prefix, so runs never collide
prefix="sq${job}"
bridge_ns="${prefix}br"
cleanup() {
  for ((i = 0; i < ranks; i++)); do ip netns del "${prefix}r$i" 2>/dev/null || true; done
  ip netns del "$bridge_ns" 2>/dev/null || true
}
trap cleanup EXIT INT TERM

if ! ip netns add "$bridge_ns" 2>/dev/null; then
  echo "links.sh: skipped: cannot create network namespaces here" >&2
  exit 77
fi
# Token bucket depth: at least one 10 ms worth of traffic, so TCP can reach the rate.
case $rate in
  *gbit) burst=$(( ${rate%gbit} * 1250 ))kb ;;
  *mbit) burst=$(( ${rate%mbit} * 2 + 64 ))kb ;;
  *) burst=1mb ;;
esac

ip -n "$bridge_ns" link add br0 type bridge
ip -n "$bridge_ns" link set br0 up
ip -n "$bridge_ns" link set lo up
shape() {  # namespace device
  if [[ -n $delay ]]; then
    ip netns exec "$1" tc qdisc add dev "$2" root handle 1: netem delay "$delay"
    ip netns exec "$1" tc qdisc add dev "$2" parent 1:1 handle 10: tbf rate "$rate" burst "$burst" latency 100ms
  else
    ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$rate" burst "$burst" latency 100ms
  fi
}
for ((i = 0; i < ranks; i++)); do
  ns="${prefix}r$i"
  ip netns add "$ns"
  ip link add "${prefix}h$i" type veth peer name "${prefix}e$i"
  ip link set "${prefix}h$i" netns "$bridge_ns"
  ip link set "${prefix}e$i" netns "$ns"
  ip -n "$bridge_ns" link set "${prefix}h$i" master br0 up
  ip -n "$ns" link set "${prefix}e$i" name eth0
  ip -n "$ns" addr add "10.77.$job.$((i + 1))/24" dev eth0
  ip -n "$ns" link set eth0 mtu 9000 up
  ip -n "$bridge_ns" link set "${prefix}h$i" mtu 9000
  ip -n "$ns" link set lo up
  shape "$ns" eth0
  shape "$bridge_ns" "${prefix}h$i"
done

port=$(( 20000 + RANDOM % 20000 ))
echo "links.sh: $ranks ranks, $rate per rank${delay:+, +$delay latency}, master 10.77.$job.1:$port" >&2
pids=()
for ((i = 0; i < ranks; i++)); do
  ip netns exec "${prefix}r$i" env RANK=$i WORLD_SIZE=$ranks LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
    MASTER_ADDR="10.77.$job.1" MASTER_PORT=$port SQUALL_SOCKET_IFNAME=eth0 UCX_NET_DEVICES=eth0 \
    "$@" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit $rc
