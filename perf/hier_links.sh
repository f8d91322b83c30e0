#!/usr/bin/env bash
# The hierarchical compressed allreduce on emulated hosts: 2 hosts x 2 ranks
# (perf/links.sh --ranks-per-host 2: the ranks of a host share its shaped
# NIC), hierarchical vs flat compressed (SQUALL_HIERARCHY=off) vs the fp32
# allreduce, interleaved per repeat, with the bytes each host put on its link.
#
#   perf/hier_links.sh [--out DIR] [--rates "1gbit 10gbit"] [--sizes "64M 256M"]
#                      [--repeat 3] [--iters 3] [--hosts 2] [--per-host 2] [--transport tcp]
#
# Per repeat, rate and size, three runs of squall_perf: hier (default
# SQUALL_HIERARCHY=auto), flat (SQUALL_HIERARCHY=off), and flat with --vs none
# (its fp32 column is the baseline; its link bytes minus the flat run's are
# the fp32 allreduce's). Each run's link counters cover iters + 1 calls (one
# warmup) plus the bootstrap. Writes DIR/<mode>_<rate>_<size>_<run>.json and
# .log; perf/hier_table.py DIR prints the table. Run it at high priority
# (nice -n -15); needs root and network namespaces like links.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

out=perf-results/hier-$(date +%Y%m%d-%H%M%S)
rates="1gbit 10gbit"
sizes="64M 256M"
repeat=3
iters=3
hosts=2
per_host=2
transport=tcp
perf=build-cpu/perf/squall_perf
while (($#)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    --per-host) per_host=$2; shift 2 ;;
    --transport) transport=$2; shift 2 ;;
    --perf) perf=$2; shift 2 ;;
    *) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done
[[ -x $perf ]] || { echo "hier_links.sh: build $perf first" >&2; exit 1; }
mkdir -p "$out"
ranks=$((hosts * per_host))
echo "uptime before: $(uptime)" | tee "$out/uptime.txt"
for ((run = 0; run < repeat; run++)); do
  for rate in $rates; do
    for size in $sizes; do
      for mode in hier flat fp32; do
        name="$out/${mode}_${rate}_${size}_${run}"
        extra=()
        envs=(SQUALL_HIERARCHY=auto)
        [[ $mode == hier ]] || envs=(SQUALL_HIERARCHY=off)
        [[ $mode == fp32 ]] && extra=(--vs none)
        echo "== run $run $rate $size $mode" >&2
        env "${envs[@]}" perf/links.sh --rate "$rate" --ranks "$ranks" --ranks-per-host "$per_host" -- \
          "$perf" -b "$size" -e "$size" -n "$iters" -w 1 --transport "$transport" \
          --json "$name.json" "${extra[@]}" >"$name.log" 2>&1 ||
          { echo "hier_links.sh: $name failed:" >&2; tail -5 "$name.log" >&2; exit 1; }
      done
    done
  done
done
echo "uptime after: $(uptime)" | tee -a "$out/uptime.txt"
