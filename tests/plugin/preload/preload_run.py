#!/usr/bin/env python3
"""Runs a command under mpirun with libsquall-preload.so and checks its report.

  preload_run.py --np 2 --preload LIB [--env K=V ...] [--compressed N | --min-compressed N]
                 [--passed-reason NAME=N ...] -- command args...

Open MPI is held to loopback TCP (no shared memory or UCX layers), and root is
allowed, like the other MPI tests. Each rank's PATH.<rank>.json is read back;
the checks below fail the test with the numbers that did not match.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

MPIRUN_ARGS = ["--allow-run-as-root", "--oversubscribe", "--mca", "pml", "ob1", "--mca", "btl",
               "self,tcp", "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"]


def run(np, preload, env, command, timeout, report_dir):
    """Runs `command` on np ranks; returns the reports (one dict per rank)."""
    prefix = str(pathlib.Path(report_dir) / "report")
    full_env = dict(os.environ)
    full_env.update(env)
    full_env["SQUALL_PRELOAD_REPORT"] = prefix
    full_env["ASAN_OPTIONS"] = "detect_leaks=0"  # Open MPI leaks at exit
    exports = ["SQUALL_PRELOAD_REPORT", "ASAN_OPTIONS"] + list(env)
    if preload:
        full_env["LD_PRELOAD"] = preload
        exports.append("LD_PRELOAD")
    args = ["mpirun"] + MPIRUN_ARGS + ["-np", str(np)]
    for name in exports:
        args += ["-x", f"{name}={full_env[name]}"]
    # mpirun itself must not run under the interposer, only the ranks.
    launcher_env = dict(full_env)
    launcher_env.pop("LD_PRELOAD", None)
    args += command
    done = subprocess.run(args, env=launcher_env, timeout=timeout, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        raise SystemExit(f"FAILED: {' '.join(command)} exited with {done.returncode}")
    reports = []
    if preload:
        for r in range(np):
            path = pathlib.Path(f"{prefix}.{r}.json")
            if not path.exists():
                raise SystemExit(f"FAILED: rank {r} wrote no report {path}")
            reports.append(json.loads(path.read_text()))
    return reports, done.stdout


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--preload", required=True)
    p.add_argument("--env", action="append", default=[])
    p.add_argument("--compressed", help="N, or N0,N1,... per rank (ranks in different "
                   "subcommunicators may legitimately differ)")
    p.add_argument("--min-compressed", type=int)
    p.add_argument("--reason", action="append", default=[], help="NAME=N: calls passed for NAME")
    p.add_argument("--timeout", type=int, default=240)
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args()
    command = a.command[1:] if a.command and a.command[0] == "--" else a.command
    env = dict(item.split("=", 1) for item in a.env)
    with tempfile.TemporaryDirectory() as d:
        reports, _ = run(a.np, a.preload, env, command, a.timeout, d)
    for r, rep in enumerate(reports):
        print(f"rank {r}: {json.dumps(rep, sort_keys=True)}")
        got = rep["calls_compressed"]
        expected = [int(x) for x in a.compressed.split(",")] if a.compressed else None
        per_rank = expected is not None and len(expected) > 1
        if expected is not None and got != expected[r if per_rank else 0]:
            raise SystemExit(f"FAILED: rank {r} compressed {got} calls, expected "
                             f"{expected[r if per_rank else 0]}")
        if a.min_compressed is not None and got < a.min_compressed:
            raise SystemExit(f"FAILED: rank {r} compressed {got} calls, expected >= {a.min_compressed}")
        if got > 0 and not rep["bytes_sent"] < rep["bytes_full_precision"]:
            raise SystemExit(f"FAILED: rank {r} sent {rep['bytes_sent']} bytes, not fewer than "
                             f"{rep['bytes_full_precision']} at full precision")
        for item in a.reason:
            name, n = item.split("=")
            if rep["calls_by_reason"].get(name) != int(n):
                raise SystemExit(f"FAILED: rank {r} passed {rep['calls_by_reason'].get(name)} "
                                 f"calls for '{name}', expected {n}")
        if not per_rank and rep["calls_by_reason"] != reports[0]["calls_by_reason"]:
            raise SystemExit(f"FAILED: rank {r} decided differently from rank 0: "
                             f"{rep['calls_by_reason']} vs {reports[0]['calls_by_reason']}")
    print("preload_run: ok")


if __name__ == "__main__":
    main()
