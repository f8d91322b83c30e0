#!/usr/bin/env bash
# The memory-floor run of docs/benchmarks.md: on shaped links (perf/links.sh,
# root), 256 MiB fp32 avg, every cell of {1, 10} Gbit/s x {2, 4} ranks, in
# interleaved repeats: the 1-bit compressed allreduce of this build and of a
# baseline build over tcp and ucx (squall_perf, which also prints the
# memory-traffic floor), gloo's fp32 allreduce (torch 1.13) and Squall's fp32
# ring (fp_bench). Raw files go to OUT; summarize.py makes the tables.
#
#   perf/results/memfloor/run.sh NEW_BUILD BASE_BUILD OUT [REPEATS]
set -euo pipefail
new=$1 base=$2 out=$3 repeats=${4:-3}
here=$(cd "$(dirname "$0")/../../.." && pwd)
links="$here/perf/links.sh"
mkdir -p "$out"
{ date -u; uptime; nproc; } >"$out/machine.txt"
for rep in $(seq 1 "$repeats"); do
  for rate in 1gbit 10gbit; do
    for n in 2 4; do
      for build in new base; do
        dir=$new
        [[ $build == base ]] && dir=$base
        for t in tcp ucx; do
          echo "== rep $rep $rate n=$n $build $t" >&2
          "$links" --rate "$rate" --ranks "$n" -- "$dir/perf/squall_perf" -b 256M -e 256M -n 5 -w 1 \
            --transport "$t" --json "$out/onebit_${build}_${t}_${rate}_n${n}_${rep}.json" \
            >"$out/onebit_${build}_${t}_${rate}_n${n}_${rep}.txt" 2>&1
        done
      done
      echo "== rep $rep $rate n=$n gloo" >&2
      "$links" --rate "$rate" --ranks "$n" -- env GLOO_SOCKET_IFNAME=eth0 /usr/bin/python3 \
        "$here/perf/benchlib/gloo_allreduce.py" -b 256M -e 256M -n 3 -w 1 \
        >"$out/gloo_${rate}_n${n}_${rep}.txt" 2>&1
      echo "== rep $rep $rate n=$n squall fp32" >&2
      "$links" --rate "$rate" --ranks "$n" -- "$new/perf/fp_bench" --lib squall -b 256M -e 256M -n 3 -w 1 \
        >"$out/fp32_${rate}_n${n}_${rep}.txt" 2>&1
    done
  done
done
uptime >>"$out/machine.txt"
