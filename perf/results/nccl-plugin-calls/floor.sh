#!/bin/bash
# The net plane's calls against the kernel's own: nccl_net_bench in raw mode
# (blocking send/recv of 256 KiB, then of 64 KiB, each call timed) and in
# plugin mode, one after the other, on loopback, ROUNDS times. One JSON row
# per run is appended to OUT, with the VM's steal time during the run.
#   floor.sh BUILD OUT [ROUNDS]      (PLANE=tcp|ucx, default tcp)
set -euo pipefail
build=$1 out=$2 rounds=${3:-3}
bench=$build/plugin/nccl/nccl_net_bench
export SQUALL_SOCKET_IFNAME=lo UCX_NET_DEVICES=lo SQUALL_NET_TRANSPORT=${PLANE:-tcp}
export MASTER_ADDR=127.0.0.1
steal() { awk '/^cpu /{print $9}' /proc/stat; }
run() {  # TAG ARGS...
  local tag=$1 row s0 s1
  shift
  export MASTER_PORT=$((29500 + RANDOM % 2000))
  s0=$(steal)
  RANK=0 timeout 180 "$bench" --bytes 1024 --cpu-times 1 "$@" > "$out.row" &
  sleep 0.3
  RANK=1 timeout 180 "$bench" --bytes 1024 --cpu-times 1 "$@" > /dev/null
  wait
  s1=$(steal)
  row=$(cat "$out.row")
  # USER_HZ ticks to ms
  echo "{\"run\": \"$tag\", \"steal_ms\": $(((s1 - s0) * 10)), \"row\": $row}" >> "$out"
}
for r in $(seq 1 "$rounds"); do
  run "raw256-$r" --mode raw --chunk 256
  run "raw64-$r" --mode raw --chunk 64
  run "plugin-$r"
done
rm -f "$out.row"
