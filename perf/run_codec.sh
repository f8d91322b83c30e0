#!/usr/bin/env bash
# The codec's measurements for docs/benchmarks.md, all in one run so every
# figure has its baseline from the same run:
#   * the implementation calibration, repeated (what SQUALL_CODEC_ISA=auto picks);
#   * AVX2 against AVX-512, interleaved and paired, streaming (64M elements)
#     and cache-resident (1M);
#   * the multi-threaded codec at 1, 2, 4 and 8 threads (64M elements);
#   * the compressed allreduce on loopback with each implementation forced,
#     and with 1 and 2 codec threads per rank, interleaved (squall_perf);
#   * the projection to 10/25/40/100 Gbit from those rates and wire bytes
#     (perf/bound.py --project).
#
#   perf/run_codec.sh [BUILD_DIR] [OUT_DIR] [REPEATS]
set -euo pipefail
build=${1:-build}
out=${2:-perf-codec-$(date -u +%Y%m%dT%H%M%S)}
repeats=${3:-3}
mkdir -p "$out"
bench=$build/perf/codec_bench
perf=$build/perf/squall_perf
for tool in "$bench" "$perf"; do
  [[ -x $tool ]] || { echo "run_codec.sh: $tool is missing; build first (ninja -C $build)" >&2; exit 2; }
done
log() { echo "run_codec.sh: $*" >&2; }
echo "$(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u)" | tee "$out/machine.txt" >&2

log "calibration x5"
"$bench" --calibrate=5 > "$out/calibrate.txt"
log "paired implementations"
"$bench" --sizes=64M --impl=avx2,avx512 --iters=9 --json > "$out/impl_64M.json"
"$bench" --sizes=1M --impl=avx2,avx512 --iters=21 --json > "$out/impl_1M.json"
log "threads"
"$bench" --sizes=64M --impl=avx512 --threads=1,2,4,8 --iters=7 --json > "$out/codec_threads.json"
"$bench" --sizes=64M --impl=avx512 --threads=1,2,4,8 --iters=7 > "$out/codec_threads.txt"

# Interleaved allreduce repeats: every variant once per repeat.
for ((i = 1; i <= repeats; i++)); do
  for isa in avx2 avx512; do
    log "allreduce $isa repeat $i"
    SQUALL_CODEC_ISA=$isa SQUALL_CODEC_THREADS=1 "$perf" -np 2 -b 64M -e 64M -n 5 -w 1 --vs none \
      --json "$out/isa_${isa}_$i.json" > "$out/isa_${isa}_$i.txt"
  done
  for threads in 1 2; do
    log "allreduce threads $threads repeat $i"
    SQUALL_CODEC_THREADS=$threads "$perf" -np 2 -b 64M -e 256M -f 4 -n 5 -w 1 --vs none \
      --json "$out/threads_${threads}_$i.json" > "$out/threads_${threads}_$i.txt"
  done
done
python3 "$(dirname "$0")/bound.py" --codec "$out/codec_threads.json" --impl avx512 \
  --project 10gbit,25gbit,40gbit,100gbit --threads 1,2,4,8 --json "$out/projection.json" \
  "$out"/threads_1_*.json | tee "$out/projection.md"
echo "load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u)" >>"$out/machine.txt"
log "done: $out"
