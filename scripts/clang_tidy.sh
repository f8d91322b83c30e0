#!/usr/bin/env bash
# Runs clang-tidy (the checks in .clang-tidy) over the project's own C++
# sources in a configured build directory, and fails on any finding.
#
#   scripts/clang_tidy.sh [BUILD_DIR]            every source in the build (default build/)
#   SQUALL_TIDY_BASE=REV scripts/clang_tidy.sh   only the sources changed since REV
#
# A whole-tree run is slow (32 minutes measured on 2 cores that other work
# was sharing), so the test suite checks the sources changed since the
# revision in .ci/tidy-base, the last one whose whole tree was found clean
# (update it after a clean whole-tree run).
#
# CUDA sources are compiled by nvcc with flags clang-tidy does not take; they
# are left out (their host-compiled twins under tests/gpu/emu are checked).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
[[ -f $build/compile_commands.json ]] || { echo "clang-tidy: no $build/compile_commands.json; run meson setup $build" >&2; exit 1; }

mapfile -t sources < <(/usr/bin/python3 - "$build" <<'PY'
import json, os, sys
build = sys.argv[1]
root = os.getcwd()
seen = set()
for entry in json.load(open(os.path.join(build, "compile_commands.json"))):
    f = os.path.normpath(os.path.join(entry["directory"], entry["file"]))
    rel = os.path.relpath(f, root)
    if rel.startswith("..") or rel.startswith(build + os.sep) or not rel.endswith((".cc", ".cpp")):
        continue
    if rel not in seen:
        seen.add(rel)
        print(rel)
PY
)
if [[ -n ${SQUALL_TIDY_BASE:-} ]] && ! git cat-file -e "$SQUALL_TIDY_BASE^{commit}" 2>/dev/null; then
  echo "clang-tidy: revision $SQUALL_TIDY_BASE is not in this clone (shallow?); checking every source"
  SQUALL_TIDY_BASE=
fi
if [[ -n ${SQUALL_TIDY_BASE:-} ]]; then
  mapfile -t changed < <(git diff --name-only "$SQUALL_TIDY_BASE" -- '*.cc' '*.cpp' '*.h' \
    '*.cu' '*.cuh')
  # A changed header or CUDA source is checked through the sources that
  # include it (the project includes by path from the root: "src/...").
  included=()
  for c in "${changed[@]}"; do
    [[ $c == *.h || $c == *.cu || $c == *.cuh ]] && included+=(-e "\"$c\"")
  done
  keep=()
  for s in "${sources[@]}"; do
    for c in "${changed[@]}"; do [[ $s == "$c" ]] && keep+=("$s") && continue 2; done
    ((${#included[@]})) && grep -qF "${included[@]}" "$s" && keep+=("$s")
  done
  sources=("${keep[@]}")
fi
((${#sources[@]})) || { echo "clang-tidy: nothing to check"; exit 0; }

log=$(mktemp)
trap 'rm -f "$log"' EXIT
run-clang-tidy -quiet -p "$build" -j "$(nproc)" "${sources[@]/#/$PWD/}" 2>&1 |
  sed 's/\x1b\[[0-9;]*m//g' >"$log" || true
if grep -E '^[^ ]+:[0-9]+:[0-9]+: (warning|error):' "$log" >/dev/null; then
  grep -E -A3 '^[^ ]+:[0-9]+:[0-9]+: (warning|error):' "$log" >&2
  echo "clang-tidy: findings above (${#sources[@]} files checked)" >&2
  exit 1
fi
echo "clang-tidy ok (${#sources[@]} files)"
