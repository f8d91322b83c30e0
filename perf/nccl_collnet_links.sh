#!/usr/bin/env bash
# CollNet iallreduce time of each codec against `none` on the same shaped link
# (perf/links.sh), back to back in one run. One JSON line per measurement.
#
#   perf/nccl_collnet_links.sh [build-dir] [rate] [ranks...]   (default: build 1gbit 2 4)
#
# Needs root and network namespaces; exits 77 (skip) with the reason otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rate=${2:-1gbit}
shift 2 || true
ranks=("$@")
((${#ranks[@]})) || ranks=(2 4)
bench=$build/plugin/nccl/nccl_collnet_bench
[[ -x $bench ]] || { echo "nccl_collnet_links.sh: $bench not built (meson -Dperf=true)" >&2; exit 2; }
for n in "${ranks[@]}"; do
  for codec in none bf16 fp16 int8; do
    out=$(SQUALL_COLLNET_CODEC=$codec SQUALL_TRANSPORT=tcp perf/links.sh --rate "$rate" --ranks "$n" -- \
      "$bench" --mib 64 --iters 3 2>/dev/null) || {
      rc=$?
      ((rc == 77)) && { echo "nccl_collnet_links.sh: skipped (links.sh cannot shape links here)" >&2; exit 77; }
      echo "nccl_collnet_links.sh: $codec at $n ranks failed ($rc)" >&2; exit 1; }
    echo "{\"rate\": \"$rate\", ${out#\{}"
  done
done
