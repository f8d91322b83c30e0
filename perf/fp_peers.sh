#!/usr/bin/env bash
# Full-precision allreduce of Squall, gloo (torch.distributed) and Open MPI
# (ob1 over its TCP BTL), measured in one run and interleaved: every repeat
# runs each library once over every size, in rotating order, so that the
# machine's load falls on all three alike. perf/fp_peers.py turns the rows
# into the table of docs/benchmarks.md.
#
#   perf/fp_peers.sh --out DIR --ranks 2 --repeat 5 -- -b 1M -e 256M -f 4 -n 10 -w 2
#   perf/fp_peers.sh --out DIR --ranks 4 --link 1gbit --repeat 3 -- -b 256M -e 256M -n 3 -w 1
#   perf/fp_peers.py DIR/*.jsonl
#
# --link loopback (default) runs every rank on 127.0.0.1; --link RATE runs each
# rank in its own network namespace behind a link shaped to RATE
# (perf/links.sh, root). Open MPI runs on loopback only: its launcher cannot
# start ranks inside perf/links.sh's namespaces. --libs picks a subset
# (default squall,gloo,mpi); "base" runs fp_bench against the libsquall.so.0 in
# the directory $BASE_LIB (an earlier build: a before/after in the same run),
# and "squall:VAR=VALUE" Squall with that environment setting (its rows are
# named after the setting). Arguments after -- go to every benchmark
# (fp_bench's flags; gloo's twin takes the same ones). Squall runs over the
# transport SQUALL_TRANSPORT names (tcp unless set).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${BUILD:-$here/../build-cpu}
out=""
ranks=2
link=loopback
repeat=3
libs=squall,gloo,mpi
usage() { echo "usage: $0 --out DIR [--ranks N] [--link loopback|RATE] [--repeat R] [--libs L,..] -- bench args" >&2; exit 2; }
while (($#)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --link) link=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --libs) libs=$2; shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
[[ -n $out ]] || usage
mkdir -p "$out"
bench=$build/perf/fp_bench
[[ -x $bench ]] || { echo "fp_bench: $bench is missing (ninja -C $build perf/fp_bench, or set BUILD)" >&2; exit 1; }
export SQUALL_TRANSPORT=${SQUALL_TRANSPORT:-tcp}
# One random secret for the ranks started here: nobody else can join, init has nothing to warn about.
export SQUALL_JOB_SECRET="${SQUALL_JOB_SECRET:-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}"
IFS=, read -r -a order <<<"$libs"

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Starts $ranks processes of "$@" on 127.0.0.1 with torchrun's variables;
# waits for all, fails if one did.
local_ranks() {
  local port pids=() r rc=0
  port=$(free_port)
  for ((r = 0; r < ranks; r++)); do
    RANK=$r WORLD_SIZE=$ranks LOCAL_RANK=$r LOCAL_WORLD_SIZE=$ranks MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$port SQUALL_PORT=$port GLOO_SOCKET_IFNAME=lo "$@" &
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r" || rc=1; done
  return $rc
}

run_one() {  # lib label args...
  local lib=$1 label=$2
  shift 2
  local file="$out/${link}_n${ranks}.jsonl"
  case $lib in
    squall) cmd=("$bench" --lib squall --label "$label" "$@") ;;
    squall:*=*)
      cmd=(env "${lib#squall:}" "$bench" --lib squall --label "$label" "$@")
      ;;
    base)
      [[ -f ${BASE_LIB:-}/libsquall.so.0 ]] || { echo "fp_peers: base needs BASE_LIB=DIR with libsquall.so.0" >&2; exit 2; }
      cmd=(env LD_LIBRARY_PATH="$BASE_LIB" "$bench" --lib squall --label "$label" "$@")
      ;;
    gloo) cmd=(/usr/bin/python3 "$here/fp_bench_gloo.py" --label "$label" "$@") ;;
    mpi)
      [[ $link == loopback ]] || { echo "fp_peers: skipping mpi on $link (loopback only)" >&2; return 0; }
      mpirun --allow-run-as-root --oversubscribe -np "$ranks" --bind-to none \
        --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
        "$bench" --lib mpi --label "$label" "$@" >>"$file"
      return
      ;;
    *) echo "fp_peers: unknown library $lib" >&2; exit 2 ;;
  esac
  local rename=(cat)
  [[ $lib == base || $lib == squall:* ]] && rename=(sed "s/\"lib\": \"squall\"/\"lib\": \"$lib\"/")
  if [[ $link == loopback ]]; then
    local_ranks "${cmd[@]}" | "${rename[@]}" >>"$file"
  else
    GLOO_SOCKET_IFNAME=eth0 "$here/links.sh" --rate "$link" --ranks "$ranks" -- \
      env GLOO_SOCKET_IFNAME=eth0 "${cmd[@]}" | "${rename[@]}" >>"$file"
  fi
}

for ((k = 0; k < repeat; k++)); do
  # Rotate the order, so no library always runs first after a pause.
  for ((j = 0; j < ${#order[@]}; j++)); do
    lib=${order[$(((j + k) % ${#order[@]}))]}
    echo "fp_peers: $(date -u +%T) repeat $((k + 1))/$repeat $lib, $ranks ranks, $link" >&2
    # A failed run keeps the rows rank 0 printed and the matrix goes on.
    run_one "$lib" "repeat$k" "$@" || echo "fp_peers: $lib failed (exit $?), repeat $((k + 1))" >&2
  done
done
