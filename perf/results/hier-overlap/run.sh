#!/bin/bash
# The hierarchical allreduce with its phases overlapped against the build
# before (OLD) and the flat compressed allreduce, interleaved, on 2 emulated
# hosts x 2 ranks (root: perf/links.sh).
#   run.sh NEW_BUILD OLD_BUILD OUT [REPEATS]
# RATES (default "1gbit 10gbit") and SIZES (default 256M) pick the cells;
# benchmarks section 6 also ran RATES=100mbit SIZES="64M 256M".
set -euo pipefail
new=$1 old=$2 out=$3 repeats=${4:-3}
here=$(cd "$(dirname "$0")/../../.." && pwd)
mkdir -p "$out"
uptime >> "$out/uptime.txt"
for rep in $(seq 1 "$repeats"); do
  for rate in ${RATES:-1gbit 10gbit}; do
    for size in ${SIZES:-256M}; do
      for cell in hier:new hier:old flat:new; do
        mode=${cell%:*} build=${cell#*:}
        dir=$new; [[ $build == old ]] && dir=$old
        hierarchy=auto; [[ $mode == flat ]] && hierarchy=off
        name=$out/${mode}_${build}_${rate}_${size}_$rep
        SQUALL_HIERARCHY=$hierarchy "$here/perf/links.sh" --rate "$rate" --ranks 4 --ranks-per-host 2 -- \
          "$dir/perf/squall_perf" -b "$size" -e "$size" -n 3 -w 1 --transport tcp --json "$name.json" \
          > "$name.log" 2>&1
      done
    done
  done
done
uptime >> "$out/uptime.txt"
