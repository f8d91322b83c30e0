#!/usr/bin/env bash
# The GPU checks, in one go, on a bare GPU machine. Run from the repository root:
#
#   tests/gpu/run.sh
#
# It installs missing build tools with apt-get (skipped when they are already
# there, so it works offline on a prepared machine), configures a CUDA build
# (-Dcuda=enabled), builds, runs the CPU unit tests, the GPU codec tests
# (CUDA against the scalar reference), the GPU throughput benchmark, the
# compressed allreduce of device buffers over NCCL (2 and 4 processes on the
# GPU, plus the optimizer on device buffers against the host optimizer), the
# Python binding's GPU path (when the Python has a CUDA build of torch; else a
# SKIP line) and the benchmark against ncclAllReduce, and
# prints one PASS/FAIL line per step. Exit status 0 only if every step passed.
#
# Environment:
#   SQUALL_GPU_OUT     folder for summary.txt and the logs (default: a mktemp dir)
#   SQUALL_GPU_BUILD   build directory (default: build-gpu)
#   SQUALL_GPU_ARCHS   gpu_archs option (default: 80;90)
#   SQUALL_GPU_PYTHON  Python for the binding's test (default: /usr/bin/python3)
#   SQUALL_GPU_STEPS   comma-separated steps to run after the build (default: all):
#                      cpu-unit-tests, gpu-codec-tests, gpu-bench, nccl-allreduce-tests,
#                      python-gpu-tests, gpu-allreduce-bench, nccl-plugin, preload-ddp,
#                      preload-fsdp, preload-fused, ddp-net-plugin
# Budget: configure + build take at most 180 s; the other steps' limits add up
# to 1050 s (190 of them the NCCL plugin's, 120 each the four torch steps over
# torch's own NCCL), plus 90 s for the torch checks. A device call is capped at
# 600 s, so on a cold machine split the run in two calls that reuse the build
# directory, e.g.
#   SQUALL_GPU_STEPS=cpu-unit-tests,gpu-codec-tests,gpu-bench,nccl-allreduce-tests,gpu-allreduce-bench
#   SQUALL_GPU_STEPS=python-gpu-tests,nccl-plugin,preload-ddp,preload-fsdp,preload-fused,ddp-net-plugin
set -euo pipefail

build="${SQUALL_GPU_BUILD:-build-gpu}"
archs="${SQUALL_GPU_ARCHS:-80;90}"
out="${SQUALL_GPU_OUT:-$(mktemp -d /tmp/squall-gpu.XXXXXX)}"
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
export PATH="$PATH:/usr/local/cuda/bin"
failed=0

note() { echo "$*" | tee -a "$summary"; }

selected="${SQUALL_GPU_STEPS:-all}"
# wanted NAME: whether SQUALL_GPU_STEPS asks for step NAME.
wanted() { [[ $selected == all || ,$selected, == *,"$1",* ]]; }

# step NAME SECONDS COMMAND...: runs COMMAND with a timeout, logging to NAME.log;
# a step SQUALL_GPU_STEPS leaves out is reported as skipped and succeeds.
step() {
  local name="$1" limit="$2"
  shift 2
  if [[ $name != configure && $name != build ]] && ! wanted "$name"; then
    : >"$out/$name.log"
    note "SKIP: $name (not in SQUALL_GPU_STEPS)"
    return 0
  fi
  local t0 rc=0
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1 || rc=$?
  if [[ $rc -eq 0 ]]; then
    note "PASS: $name ($(($(date +%s) - t0)) s)"
  else
    [[ $rc -eq 124 ]] && note "FAIL: $name timed out after $limit s" ||
      note "FAIL: $name (exit $rc)"
    note "---- last lines of $name.log"
    tail -n 40 "$out/$name.log" | tee -a "$summary"
    note "----"
    failed=1
  fi
  return $rc
}

note "== Squall GPU checks, $(date -u '+%F %T UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
note "== logs in $out"
if nvidia-smi >"$out/nvidia-smi.txt" 2>&1; then
  cat "$out/nvidia-smi.txt"
  note "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
else
  note "WARN: nvidia-smi failed (see nvidia-smi.txt); the GPU tests will say whether CUDA works"
fi

# Build tools: install only what is missing.
missing=()
command -v meson >/dev/null 2>&1 || missing+=(meson)
command -v ninja >/dev/null 2>&1 || missing+=(ninja-build)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
[[ -e /usr/include/gtest/gtest.h ]] || missing+=(libgtest-dev)
command -v c++ >/dev/null 2>&1 || missing+=(g++)
if [[ ${#missing[@]} -gt 0 ]]; then
  sudo=""
  [[ $(id -u) -ne 0 ]] && command -v sudo >/dev/null 2>&1 && sudo="sudo"
  note "installing missing tools: ${missing[*]}"
  {
    $sudo apt-get update -qq || echo "apt-get update failed (offline?); trying the cache"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
      "${missing[@]}"
  } >"$out/apt.log" 2>&1 || {
    note "FAIL: could not install ${missing[*]} (offline?); see apt.log"
    exit 1
  }
fi
meson_version="$(meson --version 2>/dev/null || echo 0)"
if [[ "$(printf '%s\n1.0.0\n' "$meson_version" | sort -V | head -1)" != "1.0.0" ]]; then
  note "FAIL: meson $meson_version is older than the 1.0.0 this project needs (pip install meson)"
  exit 1
fi
if ! command -v nvcc >/dev/null 2>&1; then
  note "FAIL: nvcc not found (looked in PATH and /usr/local/cuda/bin)"
  exit 1
fi
note "nvcc: $(nvcc --version | tail -1)"

if [[ -f "$build/build.ninja" ]]; then
  step configure 20 meson setup --reconfigure "$build" -Dcuda=enabled "-Dgpu_archs=$archs" ||
    exit 1
else
  step configure 20 meson setup "$build" -Dcuda=enabled "-Dgpu_archs=$archs" || exit 1
fi
step build 160 ninja -C "$build" || exit 1

# The unit suite only: the multi-process, Python and interposer suites run in
# CI on the CPU, and Horovod's build alone would take this step's budget.
step cpu-unit-tests 60 meson test -C "$build" --suite unit --print-errorlogs || true

step gpu-codec-tests 120 "$build/tests/gpu/codec_gpu_test" \
  "--gtest_output=xml:$out/codec_gpu_test.xml" || true
if grep -q '^SKIP:' "$out/gpu-codec-tests.log"; then
  note "FAIL: gpu-codec-tests skipped every GPU test: $(grep '^SKIP:' "$out/gpu-codec-tests.log")"
  failed=1
fi
grep -E '^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \] [0-9]+ tests?,|test suites? ran' \
  "$out/gpu-codec-tests.log" | tee -a "$summary" || true

step gpu-bench 45 "$build/perf/gpu_codec_bench" || true
grep -E 'n=|BENCH|GPU:|SKIP' "$out/gpu-bench.log" | tee -a "$summary" || true

# The compressed allreduce of device buffers: 2 and 4 processes sharing the
# GPU over NCCL (with graph replay) and the host-staging path over TCP, and
# squallOptimizerStepOnStream on NCCL against the staged host optimizer. The
# binary kills its ranks after 27 s per group size, inside this step's limit.
step nccl-allreduce-tests 60 "$build/tests/gpu/nccl_allreduce_gpu_test" || true
if grep -q '^SKIP:' "$out/nccl-allreduce-tests.log"; then
  note "FAIL: nccl-allreduce-tests skipped: $(grep '^SKIP:' "$out/nccl-allreduce-tests.log")"
  failed=1
fi
grep -E '^(PASS|FAIL)|FAIL ' "$out/nccl-allreduce-tests.log" | tee -a "$summary" || true

# The Python binding (python/squall) on the GPU: squall.init(transport="nccl"),
# the allreduce and compressed allreduce of CUDA tensors and APMSqueeze on
# CUDA parameters, 2 processes on the GPU, bit for bit against the TCP
# communicator. It needs a CUDA build of torch, which a bare machine may lack
# (and cannot download offline): then it is skipped, not failed.
py="${SQUALL_GPU_PYTHON:-/usr/bin/python3}"
lib="$build/src/core/libsquall.so"
[[ $lib == /* ]] || lib="$PWD/$lib"
if timeout 30 "$py" -c 'import torch; assert torch.cuda.is_available()' \
  >"$out/python-torch.log" 2>&1; then
  step python-gpu-tests 90 env SQUALL_LIBRARY="$lib" PYTHONPATH="$PWD/python" \
    "$py" tests/gpu/python_gpu_test.py || true
  grep -E '^(PASS|FAIL|SKIP)|: FAIL ' "$out/python-gpu-tests.log" | tee -a "$summary" || true
else
  why="$(tail -n 1 "$out/python-torch.log" 2>/dev/null)"
  note "SKIP: python-gpu-tests: $py has no CUDA torch with a GPU (${why:-no output})"
fi

step gpu-allreduce-bench 40 "$build/perf/gpu_allreduce_bench" || true
grep -E 'BENCH|SKIP|FAIL' "$out/gpu-allreduce-bench.log" | tee -a "$summary" || true

# ---- NCCL plugin (plugin/nccl): real NCCL loads libnccl-net-squall.so ------
# 2 and 4 processes share the GPU, each its own node; NCCL_NET=squall, then
# CollNetChain through Squall's CollNet, then NCCL's Socket network as the
# baseline; results checked exactly and the NCCL logs checked for the plugin
# (tests/plugin/nccl/gpu_check.sh, which also runs on its own). 6 runs of at
# most 30 s: 190 s with this step's margin.
plugin_so="$build/plugin/nccl/libnccl-net-squall.so"
plugin_drv="$build/plugin/nccl/nccl_plugin_gpu_test"
if [[ -x $plugin_drv && -f $plugin_so ]]; then
  step nccl-plugin 190 tests/plugin/nccl/gpu_check.sh "$plugin_so" "$plugin_drv" "$out/nccl-plugin" || true
  grep -E '^(PASS|FAIL|SKIP)' "$out/nccl-plugin.log" | tee -a "$summary" || true
else
  note "FAIL: nccl-plugin: $plugin_drv or $plugin_so not built (needs -Dnccl_plugin and NCCL)"
  failed=1
fi
# ---- end of the NCCL plugin step

# ---- interposer (plugin/preload): torch DDP over NCCL under libsquall-preload-nccl.so,
# 2 processes sharing the GPU (distinct NCCL_HOSTID, NCCL_MNNVL_ENABLE=0):
# DDP's gradient allreduces compressed (reports non-empty), ranks bit-identical,
# loss close to the uncompressed run's. Needs CUDA torch, like the step above.
preload_lib="$build/plugin/preload/libsquall-preload-nccl.so"
[[ $preload_lib == /* ]] || preload_lib="$PWD/$preload_lib"
if [[ ! -f $preload_lib ]]; then
  note "SKIP: preload-ddp: $preload_lib was not built (meson -Dpreload=disabled?)"
elif timeout 30 "$py" -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
  step preload-ddp 120 "$py" tests/plugin/preload/ddp_gpu.py "$preload_lib" "$out" || true
  grep -E '^(PASS|FAIL)|report:|uncompressed:|interposed:' "$out/preload-ddp.log" | tee -a "$summary" || true
else
  note "SKIP: preload-ddp: $py has no CUDA torch with a GPU"
fi
# The same model sharded with FSDP2 (fully_shard): its gradient
# reduce-scatters compressed (ncclReduceScatter), loss within the same bound.
if [[ -f $preload_lib ]] && timeout 30 "$py" -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
  step preload-fsdp 120 "$py" tests/plugin/preload/ddp_gpu.py --fsdp "$preload_lib" "$out" || true
  grep -E '^(PASS|FAIL)|report:|uncompressed:|interposed:' "$out/preload-fsdp.log" | tee -a "$summary" || true
else
  note "SKIP: preload-fsdp: no interposer or no CUDA torch with a GPU"
fi
# The same model with its gradients fused into flat buffers as Horovod does
# (all in one on even steps, each alone on odd ones): the fused calls cut at
# the tensor edges the odd steps reveal, the biases sent whole inside them.
if [[ -f $preload_lib ]] && timeout 30 "$py" -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
  step preload-fused 120 "$py" tests/plugin/preload/ddp_gpu.py --fused "$preload_lib" "$out" || true
  grep -E '^(PASS|FAIL)|report:|uncompressed:|interposed:' "$out/preload-fused.log" | tee -a "$summary" || true
else
  note "SKIP: preload-fused: no interposer or no CUDA torch with a GPU"
fi
# ---- end of the interposer step

# ---- the same DDP job with NCCL_NET_PLUGIN=libnccl-net-squall.so: torch's own
# NCCL (its nvidia-nccl wheel, nothing on LD_LIBRARY_PATH) loads the plugin, at
# ABI v12 from NCCL 2.30 on; the job finishes with identical replicas.
plugin_abs="$plugin_so"
[[ $plugin_abs == /* ]] || plugin_abs="$PWD/$plugin_abs"
if [[ ! -f $plugin_abs ]]; then
  note "SKIP: ddp-net-plugin: $plugin_abs was not built"
elif timeout 30 "$py" -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
  step ddp-net-plugin 120 "$py" tests/plugin/preload/ddp_gpu.py --net-plugin "$plugin_abs" "$out" || true
  grep -E '^(PASS|FAIL)|^torch |^rank [01]: ' "$out/ddp-net-plugin.log" | tee -a "$summary" || true
else
  note "SKIP: ddp-net-plugin: $py has no CUDA torch with a GPU"
fi
# ---- end of the net plugin DDP step

if [[ $failed -eq 0 ]]; then
  note "PASS: all GPU checks"
else
  note "FAIL: some GPU checks failed (see above and $out)"
fi
exit $failed
