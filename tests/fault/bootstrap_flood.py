#!/usr/bin/env python3
"""Hostile bootstrap: while rank 0 of a 3-rank job waits for the others, a
client without the job secret opens more idle connections to the rendezvous
port than rank 0 may have descriptors (its limit is set to 1024), plus
connections sending garbage or half a handshake. The real ranks, started
after the flood, must still join and the job must succeed.

  bootstrap_flood.py FAULT_RANK --tries 3 --idle 1100

Prints one JSON line: tries, failures, worst and median time from starting
the real ranks to every rank being ready."""

import argparse
import json
import resource
import socket
import statistics
import sys
import time

import faultlib


def limit_fds():
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))


def flood(port, idle, garbage):
    socks = []
    deadline = time.monotonic() + 10
    while not socks and time.monotonic() < deadline:  # rank 0 may not listen yet
        try:
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=1))
        except OSError:
            time.sleep(0.02)
    for i in range(idle + garbage):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=1)
        except OSError:
            continue
        if i >= idle:
            # Garbage, or the first bytes of a handshake and then silence.
            s.sendall(b"\x53\x51\x42\x48" if i % 2 else b"GET / HTTP/1.0\r\n\r\n" * 8)
        socks.append(s)
    return socks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fault_rank")
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--tries", type=int, default=3)
    ap.add_argument("--idle", type=int, default=1100)
    ap.add_argument("--garbage", type=int, default=100)
    ap.add_argument("--ranks", type=int, default=3)
    args = ap.parse_args()

    tries = failures = 0
    times = []
    first = None
    for _ in range(args.tries):
        job = faultlib.Job([args.fault_rank, args.transport, "allreduce", "3"], args.ranks,
                           timeout_s=60, preexec={0: limit_fds}, ranks=[0])
        socks = flood(job.port, args.idle, args.garbage)
        start = time.monotonic()
        for r in range(1, args.ranks):
            job.start(r)
        ready = job.wait_ready(timeout_s=40)
        elapsed = time.monotonic() - start
        results = job.wait()
        for s in socks:
            s.close()
        tries += 1
        bad = [(r, rc, faultlib.fail_line(out) or (err or "").strip()[-300:])
               for r, (rc, out, err) in enumerate(results) if rc != 0]
        if bad or not ready:
            failures += 1
            if first is None:
                first = "%d flood connections; " % len(socks) + (
                    "rank %d rc %s: %s" % bad[0] if bad else "not ready")
        else:
            times.append(elapsed)
    print(json.dumps({
        "probe": "bootstrap_flood", "transport": args.transport, "tries": tries,
        "failures": failures, "idle": args.idle, "garbage": args.garbage,
        "worst_join_s": round(max(times), 3) if times else None,
        "median_join_s": round(statistics.median(times), 3) if times else None,
        "first_failure": first}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
