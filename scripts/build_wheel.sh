#!/usr/bin/env bash
# Builds dist/squall-<version>-py3-none-<platform>.whl with libsquall inside.
# The library is built for the wheel (build-wheel/): TCP transport only, no
# CUDA, UCX or MPI, so it needs nothing but the C and C++ runtimes and the
# wheel installs with `pip install` on a fresh machine of the same kind
# (same architecture, glibc and libstdc++ at least as new). For UCX, MPI or
# CUDA, build from source and `pip install ./python` (it bundles that build).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -f build-wheel/build.ninja ]] ||
  meson setup build-wheel -Dbuildtype=release -Dcuda=disabled -Ducx=disabled -Dmpi=disabled \
    -Dnccl=disabled -Dtests=false -Dperf=false -Dpython=false >/dev/null
ninja -C build-wheel
mkdir -p dist
# A Python with pip, setuptools and wheel (Debian: python3-pip python3-wheel).
python=${PYTHON:-python3}
$python -c "import setuptools, wheel" 2>/dev/null || python=/usr/bin/python3
$python -c "import setuptools, wheel" ||
  { echo "build_wheel.sh: needs setuptools and wheel (apt-get install python3-wheel)" >&2; exit 1; }
SQUALL_WHEEL_LIBRARY="$PWD/build-wheel/src/core/libsquall.so" \
  $python -m pip wheel --no-deps --no-build-isolation -w dist ./python
rm -rf python/build
ls -l dist/squall-*.whl
