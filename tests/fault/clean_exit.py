#!/usr/bin/env python3
"""A clean job says nothing at WARN: squall_perf -np 4 (4 to 16 MiB, tcp on
loopback, about a second) starts its own ranks, hands them a random job
secret and ends them normally, so neither the public-secret warning nor a
rank's orderly close (its peers' abort-notice receives are still posted
then) may appear as a WARN line. At these sizes the ranks finish far enough
apart that the close used to be said at WARN (4 or 5 lines a run).

  clean_exit.py SQUALL_PERF"""

import os
import subprocess
import sys


def main():
    env = {k: v for k, v in os.environ.items()
           if k not in ("SQUALL_JOB_SECRET", "SQUALL_DEBUG", "RANK", "WORLD_SIZE")}
    env["SQUALL_SOCKET_IFNAME"] = "lo"
    cmd = [sys.argv[1], "-np", "4", "-b", "4M", "-e", "16M", "-f", "4", "-n", "2", "-w", "1",
           "--vs", "none", "--transport", "tcp"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=90)
    warns = [line for line in (r.stdout + r.stderr).splitlines() if "[squall] WARN" in line]
    if r.returncode != 0 or warns:
        print(f"{' '.join(cmd)}: exit status {r.returncode}, {len(warns)} WARN line(s)")
        print(r.stdout[-2000:])
        print(r.stderr[-4000:])
        return 1
    print(f"{' '.join(cmd)}: clean, no WARN line")
    return 0


if __name__ == "__main__":
    sys.exit(main())
