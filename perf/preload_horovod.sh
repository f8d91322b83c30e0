#!/usr/bin/env bash
# The Horovod job of tests/plugin/preload (horovod_train.py: a 77k-parameter
# MLP, momentum SGD, Horovod's MPI controller) on a shaped network, with and
# without libsquall-preload.so, in the same run; prints a Markdown table of the
# mean step time and the bytes each rank sent (from the interposer's report;
# the uncompressed row is what the same calls send at full precision).
#
#   perf/preload_horovod.sh BUILD_DIR [--rates "1gbit 10gbit"] [--ranks "2 4"] [--epochs 1]
#                           [--hidden 256] [--repeat 1]
# --hidden sets the MLP's width (256: 77k parameters; 1024: 1.1M), --repeat
# runs every configuration that many times, alternating with and without.
#
# mpirun starts every rank on this machine, and Open MPI's TCP layer carries
# the data over the loopback of a private network namespace whose loopback is
# shaped with tc tbf to the rate. So the ranks SHARE one link of that rate (an
# aggregate cap, like ranks behind one NIC), rather than each having its own
# NIC as perf/links.sh models; it is a harsher network for the uncompressed
# job. Nothing leaves the namespace. Needs root, ip and tc; exits 77 otherwise.
set -euo pipefail
build=${1:?usage: $0 BUILD_DIR [--rates R] [--ranks N] [--epochs E]}
shift
rates="1gbit 10gbit"
ranks="2 4"
epochs=1
hidden=256
repeat=1
while (($#)); do
  case $1 in
    --rates) rates=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --hidden) hidden=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
root=$(cd "$(dirname "$0")/.." && pwd)
lib=$(cd "$build" && pwd)/plugin/preload/libsquall-preload.so
[[ -f $lib ]] || { echo "no $lib; build first" >&2; exit 2; }
if [[ $(id -u) -ne 0 ]]; then echo "preload_horovod.sh: skipped: needs root" >&2; exit 77; fi
command -v tc >/dev/null || { echo "preload_horovod.sh: skipped: needs tc (iproute2)" >&2; exit 77; }
/usr/bin/python3 -c 'import horovod.torch' 2>/dev/null ||
  { echo "preload_horovod.sh: skipped: Horovod is not installed (tests/plugin/preload/horovod_test.py installs it)" >&2; exit 77; }

ns="sqpre$$"
work=$(mktemp -d)
cleanup() { ip netns del "$ns" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
ip netns add "$ns"
ip netns exec "$ns" ip link set lo up

echo "| link | ranks | interposer | step ms | MB sent / rank | full-precision MB / rank | speed-up |"
echo "|---|---|---|---|---|---|---|"
for rate in $rates; do
  # A burst of about 1 ms at the rate; tbf needs at least one MTU (64 KB on lo).
  bytes_per_s=$(( ${rate%gbit} * 125000000 ))
  burst=$(( bytes_per_s / 1000 > 65536 ? bytes_per_s / 1000 : 65536 ))
  ip netns exec "$ns" tc qdisc replace dev lo root tbf rate "$rate" burst "$burst" latency 50ms
  for np in $ranks; do
    for ((rep = 0; rep < repeat; rep++)); do
    base_ms=""
    for mode in off on; do
      rm -f "$work"/report.* "$work"/out.json
      env=(-x OMP_NUM_THREADS=1 -x SQUALL_PRELOAD_MIN_BYTES=4096 -x "SQUALL_PRELOAD_REPORT=$work/report")
      [[ $mode == on ]] && env+=(-x "LD_PRELOAD=$lib")
      ip netns exec "$ns" mpirun --allow-run-as-root --oversubscribe -np "$np" \
        --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
        "${env[@]}" /usr/bin/python3 "$root/tests/plugin/preload/horovod_train.py" "$work/out.json" "$epochs" "$hidden" \
        >"$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }
      /usr/bin/python3 - "$work" "$rate" "$np" "$mode" "$base_ms" <<'PY' > "$work/row"
import json, pathlib, sys
work, rate, np, mode, base = sys.argv[1:6]
out = json.loads(pathlib.Path(work, "out.json").read_text())
rep = pathlib.Path(work, "report.0.json")
sent = full = float("nan")
if rep.exists():
    r = json.loads(rep.read_text()); sent, full = r["bytes_sent"] / 1e6, r["bytes_full_precision"] / 1e6
speed = f"{float(base) / out['step_ms']:.2f}x" if base else "1.00x"
sent_s = f"{sent:.1f}" if mode == "on" else "(all full precision)"
full_s = f"{full:.1f}" if mode == "on" else "-"
print(f"{out['step_ms']:.2f}|| {rate} | {np} | {mode} | {out['step_ms']:.1f} | {sent_s} | {full_s} | {speed} |")
PY
      row=$(cat "$work/row")
      [[ $mode == off ]] && base_ms=${row%%||*}
      echo "|${row#*||}"
    done
    done
  done
done
