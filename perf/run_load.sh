#!/usr/bin/env bash
# The compressed allreduce on shaped links, quiet and under a controlled load,
# against the full-precision ring in the same run, for one or more builds
# (e.g. before and after a change), then perf/load_table.py's table.
#
#   perf/run_load.sh [--out DIR] [--builds "new=build"] [--rates "1gbit 10gbit"]
#                    [--ranks "2 4"] [-b 64M] [-e 256M] [--iters 5] [--repeat 5]
#                    [--busy 2] [--ucx "4:1gbit"] [--no-fp32] [--fp32-max 64M]
#                    [--tcp-builds "new"] [--first-repeat 1]
#
# One repeat runs every cell once, in this order, so that a burst of load from
# elsewhere lands on one repeat of every cell, not on every repeat of one:
#   for load in quiet loaded:
#     codec_bench (the codec's rates in those conditions)
#     for each rate, rank count: the compressed run (tcp) of every build named
#       in --tcp-builds (default all), then the fp32 ring (the first build,
#       --vs none, 3 iterations, sizes up to --fp32-max, default -e)
#     for each --ucx ranks:rate: every build's compressed run over ucx
# --first-repeat numbers the repeats from there (to add repeats to a DIR).
# "quiet" runs everything at nice -15 (other work on the machine at nice 0 or
# above barely gets the CPU); "loaded" starts --busy busy-loop processes at
# nice 0 and runs the benchmark at nice 0 too, so it gets its fair share and
# no more. Writes DIR/<load>_<build>_<rate>_n<ranks>_<transport>_<repeat>.json
# (squall_perf --json; the build "fp32" is the ring baseline),
# DIR/codec_<load>_<repeat>.json, DIR/machine.txt (uptime and vmstat before
# and after) and DIR/table.md. Needs root and network namespaces (perf/links.sh;
# exits 77 otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."

out=perf-results/load-$(date +%Y%m%d-%H%M%S)
builds="new=build"
rates="1gbit 10gbit"
ranks_list="2 4"
min=64M
max=256M
iters=5
repeat=5
busy=2
ucx="4:1gbit"
fp32=1
fp32_max=
tcp_builds=
first_repeat=1
while (($#)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    --builds) builds=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --ranks) ranks_list=$2; shift 2 ;;
    -b) min=$2; shift 2 ;;
    -e) max=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --busy) busy=$2; shift 2 ;;
    --ucx) ucx=$2; shift 2 ;;
    --no-fp32) fp32=0; shift ;;
    --fp32-max) fp32_max=$2; shift 2 ;;
    --tcp-builds) tcp_builds=$2; shift 2 ;;
    --first-repeat) first_repeat=$2; shift 2 ;;
    *) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done
first=
for b in $builds; do
  dir=${b#*=}
  [[ -x $dir/perf/squall_perf && -x $dir/perf/codec_bench ]] ||
    { echo "run_load.sh: $dir has no perf/squall_perf and perf/codec_bench (build it first)" >&2; exit 1; }
  [[ -n $first ]] || first=$dir
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
machine() { { echo "== $1: $(date -u)"; uptime; vmstat 1 5; } >>"$out/machine.txt"; }

pids=()
stop_load() {
  if ((${#pids[@]})); then
    kill "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
  fi
  pids=()
}
trap stop_load EXIT
start_load() {
  for ((i = 0; i < busy; i++)); do
    nice -n 0 bash -c 'while :; do :; done' &
    pids+=($!)
  done
}

# cell LOAD BUILD DIR RATE N TRANSPORT REPEAT ARGS...
cell() {
  local load=$1 build=$2 dir=$3 rate=$4 n=$5 transport=$6 rep=$7
  shift 7
  local name=${load}_${build}_${rate}_n${n}_${transport}_$rep prio=-15 rc=0 top=$max
  [[ $build == fp32 && -n $fp32_max ]] && top=$fp32_max
  [[ $load == quiet ]] || prio=0
  nice -n "$prio" perf/links.sh --rate "$rate" --ranks "$n" -- "$dir/perf/squall_perf" \
    -b "$min" -e "$top" -f 4 --transport "$transport" --json "$out/$name.json" --times "$@" \
    >"$out/$name.txt" 2>"$out/$name.err" || rc=$?
  ((rc == 77)) && exit 77
  ((rc == 0)) || { echo "run_load.sh: $name failed ($rc)" >&2; tail -5 "$out/$name.err" >&2; }
  echo "run_load.sh: $name: $(grep -E '^ +[0-9]' "$out/$name.txt" | awk '{printf "%s us  ", $5}')" >&2
}

machine start
for ((rep = first_repeat; rep < first_repeat + repeat; rep++)); do
  for load in quiet loaded; do
    [[ $load == loaded ]] && start_load
    prio=-15
    [[ $load == quiet ]] || prio=0
    nice -n "$prio" "$first/perf/codec_bench" --sizes=16M --impl=avx2,avx512 --iters=5 --json \
      >"$out/codec_${load}_$rep.json"
    for rate in $rates; do
      for n in $ranks_list; do
        for b in $builds; do
          [[ -z $tcp_builds || " $tcp_builds " == *" ${b%%=*} "* ]] || continue
          cell "$load" "${b%%=*}" "${b#*=}" "$rate" "$n" tcp "$rep" -n "$iters" -w 1
        done
        ((fp32)) && cell "$load" fp32 "$first" "$rate" "$n" tcp "$rep" -n 3 -w 0 --vs none
      done
    done
    for cellspec in $ucx; do
      for b in $builds; do
        cell "$load" "${b%%=*}" "${b#*=}" "${cellspec#*:}" "${cellspec%%:*}" ucx "$rep" \
          -n "$iters" -w 1
      done
    done
    stop_load
  done
  machine "after repeat $rep"
done
python3 perf/load_table.py "$out" | tee "$out/table.md"
echo "run_load.sh: results in $out" >&2
