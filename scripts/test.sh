#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what is missing, builds with
# warnings as errors, runs every test, then rebuilds the unit tests with
# AddressSanitizer + UndefinedBehaviorSanitizer and runs them again.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

jobs=$(nproc)

echo "== build (release, warnings are errors)"
[[ -f build/build.ninja ]] || meson setup build >/dev/null
ninja -C build

echo "== tests"
meson test -C build --print-errorlogs --num-processes "$jobs" --no-suite gpu

echo "== python"
# The ctypes binding against this build's library; exit code 5 (no tests
# collected) is a failure too.
SQUALL_LIBRARY="$PWD/build/src/core/libsquall.so" /usr/bin/python3 -m pytest python/tests -q ||
  { rc=$?; echo "python tests failed (pytest exit code $rc)" >&2; exit 1; }

echo "== format"
scripts/check_format.sh

echo "== clang-tidy (the sources changed since .ci/tidy-base)"
SQUALL_TIDY_BASE=$(cat .ci/tidy-base) scripts/clang_tidy.sh build

echo "== AddressSanitizer + UndefinedBehaviorSanitizer"
[[ -f build-asan/build.ninja ]] ||
  meson setup build-asan -Dbuildtype=debug -Db_sanitize=address,undefined \
    -Db_lundef=false -Dperf=false -Dcuda=disabled >/dev/null
ninja -C build-asan
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
  meson test -C build-asan --print-errorlogs --num-processes "$jobs" --suite unit \
  --timeout-multiplier 3

echo "== all tests passed"
