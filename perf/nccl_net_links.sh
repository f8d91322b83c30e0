#!/usr/bin/env bash
# The NCCL plugin's net throughput, over its TCP and its UCX data plane
# (SQUALL_NET_TRANSPORT; UCX only when built in), against a raw TCP stream, 1
# and 4 connections, on shaped 1 Gbit/s and 10 Gbit/s links (perf/links.sh: two
# network namespaces behind tc tbf), each pair measured back to back in the
# same run. Prints one JSON line per measurement.
#
#   perf/nccl_net_links.sh [build-dir] [rates...]      (default: build, 1gbit 10gbit)
#
# Needs root and network namespaces; exits 77 (skip) with the reason otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
rates=("$@")
((${#rates[@]})) || rates=(1gbit 10gbit)
bench=$build/plugin/nccl/nccl_net_bench
[[ -x $bench ]] || { echo "nccl_net_links.sh: $bench not built (meson -Dperf=true)" >&2; exit 2; }
for rate in "${rates[@]}"; do
  case $rate in 1gbit) mib=256 ;; *) mib=1024 ;; esac
  for conns in 1 4; do
    for plane in raw tcp ucx; do
      mode=plugin
      [[ $plane == raw ]] && mode=raw
      out=$(SQUALL_NET_TRANSPORT=${plane/raw/tcp} perf/links.sh --rate "$rate" --ranks 2 -- "$bench" --mode "$mode" --conns "$conns" --bytes "$mib" 2>/dev/null) || {
        rc=$?
        ((rc == 77)) && { echo "nccl_net_links.sh: skipped (links.sh cannot shape links here)" >&2; exit 77; }
        [[ $plane == ucx ]] && { echo "nccl_net_links.sh: no UCX plane ($rc); skipping it" >&2; continue; }
        echo "nccl_net_links.sh: $plane $conns at $rate failed ($rc)" >&2; exit 1; }
      echo "{\"rate\": \"$rate\", \"plane\": \"$plane\", ${out#\{}"
    done
  done
done
