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
ninja -C build-wheel src/core/libsquall.so
mkdir -p dist
SQUALL_WHEEL_LIBRARY="$PWD/build-wheel/src/core/libsquall.so" \
  python3 -m pip wheel --no-deps --no-build-isolation -w dist ./python
rm -rf python/build
ls -l dist/squall-*.whl
