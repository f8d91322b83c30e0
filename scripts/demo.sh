#!/usr/bin/env bash
# Squall's main job on this machine: installs what is missing, builds, prints
# how fast the 1-bit codec runs next to the memory bandwidth it is bounded by,
# then measures the compressed allreduce against full precision: 4 local ranks
# on loopback, and (as root, with network namespaces) 2 ranks on a shaped
# 1 Gbit link. Both use the tcp transport. About 2-3 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

[[ -f build/build.ninja ]] || meson setup build >/dev/null
ninja -C build >/dev/null

build/tools/squall_info
echo
perf/bench.py codec --summary

echo
echo "== compressed (onebit) vs full-precision allreduce, 4 ranks on loopback (tcp) =="
echo "   loopback is far faster than the codec, so this is the compute-bound case"
perf/bench.py allreduce --ranks 4 -b 1M -e 64M -f 4 -n 5 -w 1 --transport tcp

echo
echo "== the same, 2 ranks on a shaped 1 Gbit link (network namespaces, tcp) =="
rc=0
perf/bench.py links --rates 1gbit --ranks 2 -b 16M -e 256M -f 4 -n 3 -w 1 --transport tcp \
  --no-bound || rc=$?
if ((rc == 77)); then
  echo "(shaped-link run skipped: see the reason above; shaped links need root and network namespaces)"
elif ((rc != 0)); then
  exit "$rc"
fi
