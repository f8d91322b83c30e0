#!/bin/bash
# run.sh's comparison where the link decides: 100 Mbit/s, 64 and 256 MiB.
# Usage: run100.sh NEW_BUILD OLD_BUILD OUT [REPEATS]
set -euo pipefail
new=$1 old=$2 out=$3 repeats=${4:-3}
here=$(cd "$(dirname "$0")/../../.." && pwd)
mkdir -p "$out"
uptime > "$out/uptime.txt"
for rep in $(seq 1 "$repeats"); do
  for size in 64M 256M; do
    for cell in hier:new hier:old flat:new; do
      mode=${cell%:*} build=${cell#*:}
      dir=$new; [[ $build == old ]] && dir=$old
      hierarchy=auto; [[ $mode == flat ]] && hierarchy=off
      name=$out/${mode}_${build}_100mbit_${size}_$rep
      SQUALL_HIERARCHY=$hierarchy "$here/perf/links.sh" --rate 100mbit --ranks 4 --ranks-per-host 2 -- \
        "$dir/perf/squall_perf" -b "$size" -e "$size" -n 3 -w 1 --transport tcp --json "$name.json" \
        > "$name.log" 2>&1
    done
  done
done
uptime >> "$out/uptime.txt"
