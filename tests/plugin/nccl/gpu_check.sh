#!/usr/bin/env bash
# Real NCCL loading libnccl-net-squall.so on one GPU: 2 and 4 processes share
# the GPU, each its own node (distinct NCCL_HOSTID, NCCL_MNNVL_ENABLE=0), so
# every byte between them crosses the plugin. For each size:
#   squall   NCCL_NET=squall; the NCCL log must say "Using network squall",
#            and that NCCL loaded the newest of the plugin's tables it knows
#            (v12 from NCCL 2.30 on, v11 for 2.28 and 2.29: abiFor below)
#            and called its init
#   collnet  the same with NCCL_COLLNET_ENABLE=1 NCCL_ALGO=CollNetChain; the
#            log must also show the CollNet table of that version loaded,
#            Squall's CollNet group and operations through it, and NCCL must
#            not say it could not initialise CollNet
#   socket   NCCL's own Socket network, the baseline
# ncclAllReduce results are checked exactly by the driver
# (tests/plugin/nccl/nccl_gpu_driver.cc), which prints a RESULT line per run.
#
#   tests/plugin/nccl/gpu_check.sh [PLUGIN_SO DRIVER [OUT_DIR]]
#
# Without arguments it builds what it needs first (a CPU build of the plugin in
# build-plugin-gpu, the driver compiled against /usr/local/cuda): about a
# minute on a 16-core machine, and 6 runs of at most 30 s each after that.
# tests/gpu/run.sh calls it with its own build's files. Exit 0 only when every
# run passed; 77 when there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/../../.."
cuda=${CUDA_HOME:-/usr/local/cuda}
so=${1:-}
driver=${2:-}
out=${3:-$(mktemp -d /tmp/squall-nccl-plugin.XXXXXX)}
mkdir -p "$out"
if [[ -z $so ]]; then
  build=build-plugin-gpu
  [[ -f $build/build.ninja ]] || meson setup "$build" -Dcuda=disabled -Dtests=false -Dperf=false -Dpython=false >"$out/setup.log" 2>&1 ||
    { echo "FAIL: meson setup (see $out/setup.log)"; exit 1; }
  ninja -C "$build" plugin/nccl/libnccl-net-squall.so >"$out/build.log" 2>&1 ||
    { echo "FAIL: building the plugin (see $out/build.log)"; exit 1; }
  so=$build/plugin/nccl/libnccl-net-squall.so
  driver=$build/nccl_plugin_gpu_test
  c++ -std=c++20 -O2 -Wall -Wextra -Werror -isystem "$cuda/include" tests/plugin/nccl/nccl_gpu_driver.cc \
    -L"$cuda/lib64" -Wl,-rpath,"$cuda/lib64" -lcudart -lnccl -o "$driver" >>"$out/build.log" 2>&1 ||
    { echo "FAIL: building the driver (see $out/build.log)"; exit 1; }
fi
[[ $so == /* ]] || so=$PWD/$so
export LD_LIBRARY_PATH="$cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# The plugin ABI NCCL 2.MINOR loads from this library: its loader tries the
# versions it knows newest first, and the library exports v8 to v12.
abiFor() {
  local minor=$1
  if ((minor >= 30)); then echo 12
  elif ((minor >= 28)); then echo 11
  elif ((minor >= 26)); then echo 10
  elif ((minor >= 24)); then echo 9
  else echo 8
  fi
}

# checkAbi LOG MODE: whether NCCL loaded the table it should have, from a
# rank's NCCL log; prints one line per problem, nothing when all is well.
# NCCL logs its version ("NCCL version 2.30.7+cuda13.0") and each table it
# loads ("NET/Plugin: Loaded net plugin squall (v12)", the same with
# "collnet plugin"); the plugin's init logs "NET/Squall : v12 table".
checkAbi() {
  local log=$1 mode=$2 version major minor want
  version=$(grep -o -m1 'NCCL version [0-9]*\.[0-9]*\.[0-9]*' "$log" 2>/dev/null | cut -d' ' -f3 || true)
  if [[ -z $version ]]; then
    echo "NCCL's log does not say its version"
    return
  fi
  major=${version%%.*}
  minor=${version#*.}
  minor=${minor%%.*}
  if ((major > 2)); then want=12; else want=$(abiFor "$minor"); fi
  grep -q "NET/Plugin: Loaded net plugin squall (v$want)" "$log" ||
    echo "NCCL $version did not load the v$want net table ($(grep -o -m1 'Loaded net plugin .*' "$log" || echo 'it loaded none'))"
  grep -q "NET/Squall : v$want table" "$log" || echo "the plugin's v$want init did not run"
  if [[ $mode == collnet ]]; then
    grep -q "NET/Plugin: Loaded collnet plugin squall (v$want)" "$log" ||
      echo "NCCL $version did not load the v$want CollNet table"
  fi
}

failed=0
for n in 2 4; do
  for mode in squall collnet socket; do
    args=(--ranks "$n" --mib 16 --iters 5 --timeout 25 --logs "$out")
    case $mode in
      squall) args+=(--net squall --plugin "$so"); tag=squall-n$n ;;
      collnet) args+=(--net squall --plugin "$so" --collnet); tag=squall-collnet-n$n ;;
      socket) args+=(--net socket); tag=socket-n$n ;;
    esac
    rc=0
    timeout --kill-after=5 30 "$driver" "${args[@]}" >"$out/$tag.log" 2>&1 || rc=$?
    if ((rc == 77)); then
      echo "SKIP: no GPU ($(tail -n 1 "$out/$tag.log"))"
      exit 77
    fi
    log=$out/$tag.rank0.log
    why=""
    ((rc == 0)) || why="driver exit $rc"
    if [[ $mode != socket ]]; then
      while IFS= read -r problem; do
        why+="${why:+; }$problem"
      done < <(checkAbi "$log" "$mode")
    fi
    case $mode in
      squall)
        grep -qi 'Using network squall' "$log" 2>/dev/null || why+="${why:+; }NCCL did not use the squall network" ;;
      collnet)
        ! grep -q 'Cannot initialize CollNet' "$log" 2>/dev/null || why+="${why:+; }NCCL could not initialize CollNet"
        grep -q 'CollNet/Squall: rank' "$log" 2>/dev/null || why+="${why:+; }Squall's CollNet group never formed"
        grep -q 'CollNet/Squall: closed after [1-9]' "$log" 2>/dev/null ||
          why+="${why:+; }no operation went through Squall's CollNet" ;;
    esac
    if [[ -z $why ]]; then
      echo "PASS: nccl-plugin $tag $(grep -E '^RESULT' "$out/$tag.log" | head -1)"
    else
      echo "FAIL: nccl-plugin $tag: $why (logs: $out/$tag.log, $log)"
      tail -n 15 "$out/$tag.log" | sed 's/^/    /'
      failed=1
    fi
  done
done
exit $failed
