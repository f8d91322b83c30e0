#!/usr/bin/env python3
"""Teardown race: ranks that finish their last collective destroy their
communicator and exit at once while rank 0 is still in it (it starts the last
call late). A completed collective must not fail because of that teardown, so
every run must end with every rank at 0.

  teardown_loop.py FAULT_RANK --transport tcp --op allgather --runs 500

Prints one JSON line: runs, failures, the first failure's text."""

import argparse
import json
import sys

import faultlib


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fault_rank")
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--op", default="allgather")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--hold-ms", type=int, default=20)
    ap.add_argument("--max-failures", type=int, default=0,
                    help="exit status 1 above this many failed runs")
    args = ap.parse_args()

    runs = failures = retried = 0
    first = None
    while runs < args.runs:
        job = faultlib.Job([args.fault_rank, args.transport, args.op, str(args.iterations),
                            "--hold-ms", str(args.hold_ms)], args.ranks)
        results = job.wait()
        if faultlib.bind_failed(results) and retried < args.runs:
            retried += 1
            continue
        runs += 1
        bad = [(r, rc, faultlib.fail_line(out) or (err or "").strip()[-300:])
               for r, (rc, out, err) in enumerate(results) if rc != 0]
        if bad:
            failures += 1
            if first is None:
                first = "rank %d rc %s: %s" % bad[0]
    print(json.dumps({"probe": "teardown", "transport": args.transport, "op": args.op,
                      "runs": runs, "failures": failures, "first_failure": first}))
    return 1 if failures > args.max_failures else 0


if __name__ == "__main__":
    sys.exit(main())
