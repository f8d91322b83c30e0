#!/usr/bin/env bash
# The Python side against what most users run: PyPI's torch 2.15.0, with its
# own NCCL (nvidia-nccl-cu13 2.30.7) and CUDA 13.2 runtime wheels, in a venv
# without system site packages, with Squall installed into it the way
# docs/python.md says (`pip install ./python` after building).
#
#   scripts/pypi_torch.sh [BUILD_DIR]     (default: build)
#
# It runs, in that venv and with no extra environment:
#   - the NEEDED check on the installed package's copy of libsquall.so;
#   - the Python suite with squall imported before torch, and its files that
#     use squall in the pytest process again with torch imported first;
#   - the README's Python example (2 ranks under torchrun), in both orders;
#   - the NCCL tables of Squall and of the interposer against the wheel's
#     real libnccl.so.2 and against the newest NCCL's (2.32.3, downloaded,
#     not installed) (dlopen/dlsym and ncclGetVersion; no GPU needed);
#   - the frameworks' own launches (tests/frameworks: Lightning, Fabric,
#     Accelerate, Hugging Face's Trainer, torch.multiprocessing.spawn, FSDP2),
#     plain and under every squallrun mode, with Lightning, Accelerate and
#     transformers from PyPI in the venv.
# The venv is kept in $SQUALL_TORCH_VENV (default BUILD_DIR/venv-torch) and
# reused while its torch and the frameworks are the wanted ones.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
venv="${SQUALL_TORCH_VENV:-$build/venv-torch}"
torch_version="${SQUALL_TORCH_VERSION:-2.15.0}"
nccl_version="${SQUALL_TORCH_NCCL_VERSION:-2.30.7}"
lightning_version="${SQUALL_LIGHTNING_VERSION:-2.6.6}"
accelerate_version="${SQUALL_ACCELERATE_VERSION:-1.16.0}"
transformers_version="${SQUALL_TRANSFORMERS_VERSION:-5.25.0}"

if ! "$venv/bin/python" -c "import torch, sys, pytest, wheel; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
  echo "pypi torch: making $venv with torch $torch_version (a few GB, a few minutes)"
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "torch==$torch_version" \
    "nvidia-nccl-cu13==$nccl_version" numpy pytest wheel
fi
if ! "$venv/bin/python" -c "import lightning, accelerate, transformers, sys; sys.exit((lightning.__version__, accelerate.__version__, transformers.__version__) != ('$lightning_version', '$accelerate_version', '$transformers_version'))" 2>/dev/null; then
  echo "pypi torch: installing Lightning $lightning_version, Accelerate $accelerate_version," \
    "transformers $transformers_version"
  "$venv/bin/pip" install -q --disable-pip-version-check "lightning==$lightning_version" \
    "accelerate==$accelerate_version" "transformers==$transformers_version" \
    "torch==$torch_version"
fi
py="$venv/bin/python"
# As a user who activated the venv: its torchrun and squallrun come first.
venv_bin=$(cd "$venv/bin" && pwd)
export PATH="$venv_bin:$PATH"
py="$venv_bin/python"
"$py" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps ./python
rm -rf python/build
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
nccl_lib="$site/nvidia/nccl/lib/libnccl.so.2"
echo "pypi torch: $("$py" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "NCCL", ".".join(map(str, torch.cuda.nccl.version())))')"

echo "-- the installed package's library"
"$py" tests/link/check_needed.py "$site/squall/_libs/libsquall.so"

# Squall's NCCL table and the interposer's against a real libnccl.so.2 ($1)
# of version $2.
check_nccl_tables() {
  for filter in 'NcclTableTest.TheRealLibrary*' 'NcclTableResolution.*'; do
    SQUALL_TEST_NCCL_LIBRARY="$1" SQUALL_TEST_NCCL_VERSION="$2" \
      timeout 60 "$build/tests/nccl_table_test" --gtest_filter="$filter" --gtest_brief=1
  done
  if [[ -f $build/plugin/preload/libsquall-preload-nccl.so ]]; then
    "$py" tests/plugin/preload/check_real_nccl.py "$build/plugin/preload/libsquall-preload-nccl.so" \
      "$1" "$2"
  fi
}

echo "-- NCCL tables against the wheel's $nccl_lib"
check_nccl_tables "$nccl_lib" "$nccl_version"

# The same tables against the newest NCCL, whose ncclAllReduceConfig (2.31+)
# the interposer forwards to. Its wheel is not installed into the venv: it is
# downloaded once into $build and only its libnccl.so.2 unpacked (kept while
# it is there).
newest_nccl_version="${SQUALL_NEWEST_NCCL_VERSION:-2.32.3}"
newest_nccl_dir="$build/nccl-$newest_nccl_version"
newest_nccl_lib="$newest_nccl_dir/nvidia/nccl/lib/libnccl.so.2"
if [[ ! -f $newest_nccl_lib ]]; then
  echo "pypi torch: fetching nvidia-nccl-cu13 $newest_nccl_version's libnccl.so.2 into $newest_nccl_dir"
  rm -rf "$newest_nccl_dir" "$newest_nccl_dir.partial"
  "$py" -m pip download -q --disable-pip-version-check --no-deps -d "$newest_nccl_dir.partial" \
    "nvidia-nccl-cu13==$newest_nccl_version"
  "$py" - "$newest_nccl_dir.partial" <<'PY'
import glob, sys, zipfile
folder = sys.argv[1]
(wheel,) = glob.glob(f"{folder}/nvidia_nccl_cu13-*.whl")
with zipfile.ZipFile(wheel) as z:
    z.extract("nvidia/nccl/lib/libnccl.so.2", folder)
PY
  rm -f "$newest_nccl_dir.partial"/*.whl
  mv "$newest_nccl_dir.partial" "$newest_nccl_dir"
fi
echo "-- NCCL tables against nvidia-nccl-cu13 $newest_nccl_version's $newest_nccl_lib"
check_nccl_tables "$newest_nccl_lib" "$newest_nccl_version"

# The suite runs the checkout's package (the same files pip installed) against
# this build's library, importing squall and torch in the order
# SQUALL_TEST_IMPORT_FIRST names (python/tests/conftest.py); the README
# example and squallrun use the installed package.
# The order holds in the pytest process only: the ranks of the multi-process
# tests are spawned interpreters that import the test module (torch first)
# whatever the parent did, so the whole suite runs once (squall first) and
# the second order reruns the files that use squall in the pytest process.
in_process=(test_codec.py test_gpu_dispatch.py test_newuser.py test_torch2.py test_package.py)
for first in squall torch; do
  if [[ $first == squall ]]; then
    tests=(python/tests)
    echo "-- the Python suite, $first imported first"
  else
    tests=("${in_process[@]/#/python/tests/}")
    echo "-- the Python suite's in-process files, $first imported first"
  fi
  env -u SQUALL_LIBRARY SQUALL_TEST_IMPORT_FIRST=$first \
    timeout 1800 "$py" -m pytest "${tests[@]}" -q -p no:cacheprovider ||
    { rc=$?; echo "pypi torch: the suite failed with $first first (pytest exit code $rc)" >&2; exit 1; }
  echo "-- the README example (installed package), $first imported first"
  (cd /tmp && env -u SQUALL_LIBRARY timeout 300 "$py" "$OLDPWD/python/tests/readme_example.py" \
    --import-first $first)
done

echo "-- the frameworks' launches, plain and under every squallrun mode (installed package)"
(cd /tmp && env -u SQUALL_LIBRARY timeout 1800 "$py" -m pytest -q -p no:cacheprovider \
  "$OLDPWD/tests/frameworks") ||
  { rc=$?; echo "pypi torch: the framework launches failed (pytest exit code $rc)" >&2; exit 1; }

echo "-- squallrun (installed) --hook onebit on an unmodified DDP script, 2 ranks"
tmp=$(mktemp -d)
(cd "$tmp" && env -u SQUALL_LIBRARY SQUALL_RUN_REPORT="$tmp" SQUALL_SOCKET_IFNAME=lo \
  SQUALL_TRANSPORT=tcp GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1 \
  timeout 300 "$venv_bin/squallrun" --hook onebit --warmup 2 -- "$venv_bin/torchrun" --standalone \
  --nproc_per_node 2 "$OLDPWD/python/tests/plain_train.py" "$tmp" sgd 6)
for rank in 0 1; do
  [[ -s $tmp/squallrun-rank$rank.json ]] ||
    { echo "pypi torch: squallrun's rank $rank wrote no report" >&2; exit 1; }
done
grep -h -o '"compressed_buckets": [0-9]*' "$tmp"/squallrun-rank*.json
rm -rf "$tmp"
echo "pypi torch: all passed"
