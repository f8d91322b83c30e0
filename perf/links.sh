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
# torchrun-style RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR
# (rank 0) and MASTER_PORT.
#
# --ranks-per-host K puts K consecutive ranks in each namespace (an emulated
# host of K ranks: they share its shaped NIC and reach each other over its
# loopback, as ranks of one machine do); --ranks must be a multiple of K.
# The default is one rank per namespace. At the end the script prints the
# bytes every host sent and received on its link (the veth counters), so a
# run's inter-host traffic is measured, not inferred. Everything is torn down on exit, also on failure or Ctrl-C:
# every process inside the run's namespaces, the namespaces, their veths and
# qdiscs; what a run killed with -9 left is removed by the next run that
# takes its subnet (a lock in /run/squall-links tells live runs from dead
# ones). Needs root, iproute2, network namespaces, veth and sch_tbf; prints
# why and exits 77 (skip) without root or namespaces, 1 without veth or tbf.
set -euo pipefail

rate=1gbit
ranks=2
per_host=1
burst=""
delay=""
case ${1:-} in -h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
usage() {
  echo "usage: $0 [--rate 1gbit|10gbit|...] [--ranks N] [--ranks-per-host K] [--delay 100us] [--burst 1250kb] -- command [args...]" >&2
  exit 2
}
while (($#)); do
  case $1 in
    --rate) rate=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --ranks-per-host) per_host=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --burst) burst=$2; shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
(($#)) || usage
[[ $ranks =~ ^[0-9]+$ ]] && ((ranks >= 1 && ranks <= 64)) || { echo "--ranks must be 1..64" >&2; exit 2; }
[[ $per_host =~ ^[0-9]+$ ]] && ((per_host >= 1 && ranks % per_host == 0)) ||
  { echo "--ranks-per-host must be at least 1 and divide --ranks" >&2; exit 2; }
hosts=$((ranks / per_host))

skip() { echo "links.sh: skipped: $*" >&2; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "needs root (network namespaces and qdiscs); run it with sudo"
command -v ip >/dev/null && command -v tc >/dev/null || skip "needs ip and tc (apt-get install iproute2)"
command -v flock >/dev/null || skip "needs flock (apt-get install util-linux)"

# A per-run subnet and name prefix. The lock makes it ours: a concurrent run
# holds the lock of its own prefix, so whatever carries a prefix whose lock
# we hold is ours or left by a run that died (kill -9, a crash) and can go.
lockdir=/run/squall-links
mkdir -p "$lockdir"
job=""
for ((try = 0; try < 200; try++)); do
  candidate=$(( ($$ + try) % 200 + 20 ))
  exec {lockfd}>"$lockdir/$candidate.lock"
  if flock -n "$lockfd"; then job=$candidate; break; fi
  exec {lockfd}>&-
done
[[ -n $job ]] || { echo "links.sh: 200 runs hold every subnet; wait for one to end" >&2; exit 1; }
prefix="sq${job}"
bridge_ns="${prefix}br"
pids=()
ours() {  # the namespaces and host-side links carrying our prefix
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${prefix}(r[0-9]+|br)$" || true
}
cleanup() {
  local p ns
  trap '' INT TERM  # a second Ctrl-C must not interrupt the cleanup
  # Processes first, every one inside our namespaces (the ranks and whatever
  # they started: a deleted namespace lives on while a process is inside
  # it), then the namespaces; deleting a namespace deletes its veth ends, the
  # peers and the qdiscs on them. A veth end still in this namespace (a
  # failure before it moved) is deleted by name.
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for ns in $(ours); do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill "$p" 2>/dev/null || true; done
  done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  for ns in $(ours); do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  for p in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
             grep -E "^${prefix}[he][0-9]+$"); do
    ip link del "$p" 2>/dev/null || true
  done
  if [[ -n $(ours) ]]; then
    echo "links.sh: could not delete namespaces $(ours | tr '\n' ' '); remove them with ip netns del" >&2
  fi
}
cleanup  # what a dead run with this prefix left behind
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# A setup step that fails says which one, then the EXIT trap cleans up.
trap 'echo "links.sh: failed (status $?) at line $LINENO: $BASH_COMMAND" >&2' ERR

if ! err=$(ip netns add "$bridge_ns" 2>&1); then
  skip "cannot create network namespaces here ($err)"
fi
if ! err=$(ip -n "$bridge_ns" link add "${prefix}probe" type veth peer name "${prefix}probe1" 2>&1); then
  echo "links.sh: cannot create veth pairs ($err); the kernel needs the veth module" >&2
  exit 1
fi
ip -n "$bridge_ns" link del "${prefix}probe"
# Token bucket depth: 10 ms of traffic at the rate (1.25 MB at 1 Gbit), so
# that TCP, which sends in bursts of up to 64 KiB GSO segments paced by ACKs,
# reaches the rate instead of stalling on an empty bucket; never below 64 KiB
# (one GSO segment must fit). --delay needs the netem qdisc (sch_netem).
[[ -n $burst ]] || case $rate in
  *gbit) burst=$(( ${rate%gbit} * 1250 ))kb ;;
  *mbit) burst=$(( ${rate%mbit} * 5 / 4 + 64 ))kb ;;
  *) echo "--rate takes Nmbit or Ngbit" >&2; exit 2 ;;
esac

ip -n "$bridge_ns" link add br0 type bridge
ip -n "$bridge_ns" link set br0 up
ip -n "$bridge_ns" link set lo up
if ! err=$(ip netns exec "$bridge_ns" tc qdisc add dev br0 root tbf rate "$rate" burst "$burst" latency 100ms 2>&1); then
  echo "links.sh: cannot shape with tbf at $rate ($err); the kernel needs sch_tbf" >&2
  exit 1
fi
ip netns exec "$bridge_ns" tc qdisc del dev br0 root
if [[ -n $delay ]]; then  # probe on the bridge, which carries no shaping of its own
  if ! ip netns exec "$bridge_ns" tc qdisc add dev br0 root netem delay "$delay" 2>/dev/null; then
    echo "links.sh: --delay needs the netem qdisc (kernel module sch_netem), which this kernel lacks" >&2
    exit 2
  fi
  ip netns exec "$bridge_ns" tc qdisc del dev br0 root
fi
shape() {  # namespace device
  if [[ -n $delay ]]; then
    ip netns exec "$1" tc qdisc add dev "$2" root handle 1: netem delay "$delay"
    ip netns exec "$1" tc qdisc add dev "$2" parent 1:1 handle 10: tbf rate "$rate" burst "$burst" latency 100ms
  else
    ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$rate" burst "$burst" latency 100ms
  fi
}
for ((i = 0; i < hosts; i++)); do
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

# Bytes on host h's link, as the switch side counts them: what it receives
# is what the host sent.
link_bytes() {  # host -> "sent received"
  local stats=/sys/class/net/${prefix}h$1/statistics
  ip netns exec "$bridge_ns" cat "$stats/rx_bytes" "$stats/tx_bytes" | tr '\n' ' '
}
declare -a before
for ((h = 0; h < hosts; h++)); do before[h]=$(link_bytes "$h"); done

port=$(( 20000 + RANDOM % 20000 ))
# One random secret for the job's ranks: nobody else can join, init has nothing to warn about.
export SQUALL_JOB_SECRET="${SQUALL_JOB_SECRET:-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}"
echo "links.sh: $ranks ranks on $hosts hosts ($per_host per host), $rate per host${delay:+, +$delay latency}, master 10.77.$job.1:$port" >&2
for ((i = 0; i < ranks; i++)); do
  ip netns exec "${prefix}r$((i / per_host))" env RANK=$i WORLD_SIZE=$ranks \
    LOCAL_RANK=$((i % per_host)) LOCAL_WORLD_SIZE=$per_host \
    MASTER_ADDR="10.77.$job.1" MASTER_PORT=$port SQUALL_SOCKET_IFNAME=eth0 UCX_NET_DEVICES=eth0 \
    "$@" &
  pids+=($!)
done
# The first rank to fail stops the others (they would wait for it until
# SQUALL_TIMEOUT_S otherwise); the exit status is the first failure's.
rc=0
live=("${pids[@]}")
while ((${#live[@]})); do
  status=0
  done_pid=""
  wait -n -p done_pid "${live[@]}" || status=$?
  live=("${live[@]/#$done_pid/}")
  live=(${live[@]})
  if ((status != 0 && rc == 0)); then
    rc=$status
    echo "links.sh: a rank exited with status $status; stopping the others" >&2
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  fi
done
pids=()
for ((h = 0; h < hosts; h++)); do
  read -r s0 r0 <<<"${before[h]}"
  read -r s1 r1 <<<"$(link_bytes "$h")"
  echo "links.sh: host $h link: sent $((s1 - s0)) bytes, received $((r1 - r0)) bytes" >&2
done
exit $rc
