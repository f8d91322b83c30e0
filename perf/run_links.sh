#!/usr/bin/env bash
# The shaped-link measurement matrix: compressed (onebit) vs full-precision
# allreduce over the tcp transport, for each link rate and rank count, each
# rank in its own network namespace (perf/links.sh), then the bound analysis
# (perf/bound.py) against codec_bench's rates from the same run.
#
#   perf/run_links.sh [--out DIR] [--rates "1gbit 10gbit"] [--ranks "2 4"]
#                     [-b 16M] [-e 256M] [--iters 5] [--repeat 1] [--transport tcp]
#
# Writes DIR/codec_<run>.json (codec_bench --json before each run) and
# DIR/codec_shared_<run>_<core>.json (one codec_bench per core, at once), DIR/<rate>_n<ranks>_<run>.json (squall_perf --json),
# DIR/<rate>_n<ranks>_<run>.txt (its table), DIR/bound.md and DIR/bound.json.
# --repeat R runs the whole matrix R times (interleaved, so that a burst of
# load from elsewhere hits one run of each cell, not every run of one);
# bound.py reports the median over the runs of each run's median.
# Needs root and network namespaces (exits 77 otherwise, like links.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

out=perf-results/links-$(date +%Y%m%d-%H%M%S)
rates="1gbit 10gbit"
ranks_list="2 4"
min=16M
max=256M
iters=5
repeat=1
transport=tcp
while (($#)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --ranks) ranks_list=$2; shift 2 ;;
    -b) min=$2; shift 2 ;;
    -e) max=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --transport) transport=$2; shift 2 ;;
    *) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done
perf=build/perf/squall_perf
[[ -x $perf && -x build/perf/codec_bench ]] || { echo "run_links.sh: build first (ninja -C build)" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)

runs=()
codecs=()
{ date; uptime; nproc; } >"$out/machine.txt"
# Progress: cell k of N, elapsed, and an ETA from the mean time per cell so far.
n_rates=$(wc -w <<<"$rates")
n_ranks=$(wc -w <<<"$ranks_list")
cells=$((repeat * n_rates * n_ranks))
cell=0
t_start=$SECONDS
clock() { printf '%d:%02d:%02d' $(($1 / 3600)) $(($1 / 60 % 60)) $(($1 % 60)); }
progress() {
  local spent=$((SECONDS - t_start)) eta="unknown (after the first cell)"
  ((cell > 0)) && eta=$(clock $((spent * (cells - cell) / cell)))
  echo "run_links.sh: [cell $((cell + 1))/$cells] $1; elapsed $(clock "$spent"), ETA $eta" >&2
}
for ((run = 1; run <= repeat; run++)); do
  # The codec's rates in the same conditions as the run that follows.
  echo "run_links.sh: codec rates (codec_bench, 64M elements)" >&2
  build/perf/codec_bench --sizes=64M --impl=avx2,avx512 --iters=5 --json >"$out/codec_$run.json"
  codecs+=(--codec "$out/codec_$run.json")
  # And one instance per core at once: the ranks share memory bandwidth too.
  cpids=()
  for ((c = 1; c <= $(nproc); c++)); do
    build/perf/codec_bench --sizes=64M --impl=avx2,avx512 --iters=5 --json \
      >"$out/codec_shared_${run}_$c.json" &
    cpids+=($!)
    codecs+=(--codec-shared "$out/codec_shared_${run}_$c.json")
  done
  wait "${cpids[@]}"
  for rate in $rates; do
    for n in $ranks_list; do
      name=${rate}_n${n}_$run
      progress "$name: sizes $min..$max (x4), $iters iterations, transport $transport"
      rc=0
      perf/links.sh --rate "$rate" --ranks "$n" -- "$perf" -b "$min" -e "$max" -f 4 -n "$iters" \
        -w 1 --vs none --transport "$transport" --json "$out/$name.json" >"$out/$name.txt" || rc=$?
      ((rc == 77)) && exit 77
      ((rc == 0)) || { echo "run_links.sh: $name failed ($rc)" >&2; cat "$out/$name.txt" >&2; exit 1; }
      cat "$out/$name.txt"
      runs+=("$out/$name.json")
      cell=$((cell + 1))
    done
  done
done
uptime >>"$out/machine.txt"
python3 perf/bound.py "${codecs[@]}" --json "$out/bound.json" "${runs[@]}" | tee "$out/bound.md"
echo "run_links.sh: results in $out" >&2
