#!/usr/bin/env bash
# The full-precision allreduce matrix of docs/benchmarks.md: Squall against
# gloo and Open MPI, each cell interleaved (perf/fp_peers.sh), then the tables
# (perf/fp_peers.py). Set BASE_LIB=DIR (a directory holding an earlier
# build's libsquall.so.0) to add that build as a "base" column to the
# small-message cells.
# The shaped-link cells need root (perf/links.sh); they skip otherwise.
#
#   perf/fp_matrix.sh --out DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=""
case ${1:-} in --out) out=$2 ;; *) echo "usage: $0 --out DIR" >&2; exit 2 ;; esac
local_libs=squall,gloo,mpi
[[ -n ${BASE_LIB:-} ]] && local_libs=squall,base,gloo,mpi
# Small-message latency, 4 ranks on loopback.
"$here/fp_peers.sh" --out "$out/small" --ranks 4 --repeat 5 --libs "$local_libs" -- -b 4K -e 64K -f 4 -n 30 -w 5
# Loopback, 1 MiB to 256 MiB.
for n in 2 4; do
  "$here/fp_peers.sh" --out "$out/large" --ranks "$n" --repeat 3 --libs squall,gloo,mpi -- -b 1M -e 256M -f 4 -n 5 -w 1
done
# Shaped links (Open MPI cannot start ranks inside the namespaces).
for n in 2 4; do
  for rate in 1gbit 10gbit; do
    "$here/fp_peers.sh" --out "$out/links" --ranks "$n" --link "$rate" --repeat 3 --libs squall,gloo -- -b 256M -e 256M -n 3 -w 1 ||
      [[ $? == 77 ]]
  done
done
for d in small large links; do
  ls "$out/$d"/*.jsonl >/dev/null 2>&1 && "$here/fp_peers.py" "$out/$d"/*.jsonl > "$out/$d.md"
done
cat "$out"/*.md
