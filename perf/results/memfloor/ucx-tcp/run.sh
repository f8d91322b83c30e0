#!/bin/bash
# UCX against tcp for the compressed allreduce (onebit, 256 MiB, avg), every
# cell of {1, 10} Gbit/s x {2, 4} ranks, 4 repeats, the order of the two
# transports alternating per repeat (root: perf/links.sh), with the release
# build in build/.
#   perf/results/memfloor/ucx-tcp/run.sh OUT
set -uo pipefail
out=$(mkdir -p "${1:?usage: run.sh OUT}" && cd "$1" && pwd)
cd "$(dirname "$0")/../../../.."
for rep in 1 2 3 4; do
  for rate in 1gbit 10gbit; do
    for n in 2 4; do
      order="tcp ucx"
      ((rep % 2 == 0)) && order="ucx tcp"
      for t in $order; do
        name=$out/${t}_${rate}_n${n}_$rep
        perf/links.sh --rate $rate --ranks $n -- build/perf/squall_perf -b 256M -e 256M -n 5 -w 1 \
          --transport $t --json "$name.json" >"$name.txt" 2>&1 || echo "failed: $t $rate $n ranks, repeat $rep"
      done
    done
  done
done
