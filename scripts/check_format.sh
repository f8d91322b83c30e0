#!/usr/bin/env bash
# Fails when a C/C++/CUDA source differs from what clang-format makes of it.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.h' '*.cc' '*.cu' '*.cuh' '*.c')
bad=()
for f in "${files[@]}"; do
  if ! diff -q <(clang-format --style=file "$f") "$f" >/dev/null; then bad+=("$f"); fi
done
if ((${#bad[@]})); then
  echo "not clang-formatted (run: clang-format -i ${bad[*]}):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "format ok (${#files[@]} files)"
