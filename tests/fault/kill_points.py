#!/usr/bin/env python3
"""Random kill points: a job runs collectives in a loop and one rank, chosen
at random, is killed with SIGKILL at a random moment after init. Every
survivor must fail (not hang, crash or report success) within the deadline,
with an error naming the killed rank.

  kill_points.py FAULT_RANK --transport tcp --tries 20

Prints one JSON line: tries, failures (runs where a survivor misbehaved),
the worst and median time from the kill to a survivor's error, and the first
misbehaviour."""

import argparse
import json
import random
import statistics
import sys
import time

import faultlib


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fault_rank")
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--op", default="allreduce")
    ap.add_argument("--tries", type=int, default=20)
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--max-delay-s", type=float, default=1.0)
    ap.add_argument("--detect-limit-s", type=float, default=10.0,
                    help="a survivor slower than this to fail counts as a failure")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    rng = random.Random(args.seed)

    tries = failures = 0
    detections = []
    first = None
    attempts = 0
    while tries < args.tries and attempts < 3 * args.tries:
        attempts += 1
        victim = rng.randrange(args.ranks)
        delay = rng.uniform(0.0, args.max_delay_s)
        # Enough iterations that nobody finishes before the kill.
        job = faultlib.Job([args.fault_rank, args.transport, args.op, "100000000"],
                           args.ranks, timeout_s=40,
                           extra_env={"SQUALL_TIMEOUT_S": "20"})
        if not job.wait_ready():
            job.wait()
            continue  # a start-up failure (port taken): not a kill point
        time.sleep(delay)
        killed_at = faultlib.monotonic_ms()
        job.kill(victim)
        results = job.wait()
        tries += 1
        problems = []
        for r, (rc, out, err) in enumerate(results):
            if r == victim:
                continue
            line = faultlib.fail_line(out)
            if rc is None:
                problems.append("rank %d hung" % r)
            elif rc != 1 or line is None:
                problems.append("rank %d ended with rc %s: %s" % (r, rc, (err or "")[-300:]))
            else:
                seen_ms = float(line.split()[1])
                detections.append(max(0.0, seen_ms - killed_at) / 1000.0)
                if "rank %d" % victim not in line:
                    problems.append("rank %d did not name rank %d: %s" % (r, victim, line))
                elif detections[-1] > args.detect_limit_s:
                    problems.append("rank %d took %.1f s" % (r, detections[-1]))
        if problems:
            failures += 1
            if first is None:
                first = "victim %d after %.2f s: %s" % (victim, delay, "; ".join(problems))
    print(json.dumps({
        "probe": "kill", "transport": args.transport, "op": args.op, "tries": tries,
        "failures": failures,
        "worst_detection_s": round(max(detections), 3) if detections else None,
        "median_detection_s": round(statistics.median(detections), 3) if detections else None,
        "first_failure": first}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
