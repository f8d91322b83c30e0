#!/usr/bin/env bash
# Squall's main job on this machine: installs what is missing, builds, and
# prints how fast the 1-bit codec runs next to the memory bandwidth it is
# bounded by.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

[[ -f build/build.ninja ]] || meson setup build >/dev/null
ninja -C build >/dev/null

build/tools/squall_info
echo
build/perf/codec_bench --summary
