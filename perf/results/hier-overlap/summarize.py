#!/usr/bin/env python3
"""Table of run.sh results: the median [range] of each cell's
squall_perf time over the repeats, and the ratios taken per repeat (the runs
of one repeat are seconds apart). Usage: summarize.py RAW_DIR [RAW_DIR...]"""
import glob
import json
import os
import re
import statistics
import sys

NAME = re.compile(r"(hier|flat)_(new|old)_(\w+?)(?:_(\d+M))?_(\d+)\.json$")


def main(dirs):
    t = {}
    for d in dirs:
        for path in glob.glob(os.path.join(d, "*.json")):
            m = NAME.search(os.path.basename(path))
            if not m:
                continue
            mode, build, rate, size, rep = m.groups()
            row = json.load(open(path))["rows"][0]
            size = size or f"{row['bytes'] >> 20}M"
            t[(mode, build, rate, size, rep)] = row["time_us"] / 1e3
    cells = sorted({(k[2], k[3]) for k in t}, key=lambda c: (float(c[0][:-4]) *
                   (1000 if c[0].endswith("gbit") else 1), int(c[1][:-1])))

    def stat(values):
        if not values:
            return "-"
        return f"{statistics.median(values):.0f} [{min(values):.0f}-{max(values):.0f}]"

    def ratio(values):
        if not values:
            return "-"
        return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"

    print("| link | size | hierarchical ms | before ms | flat ms | new / before | flat / new |")
    print("|---|---|---|---|---|---|---|")
    for rate, size in cells:
        reps = sorted({k[4] for k in t if k[2:4] == (rate, size)})
        get = lambda mode, build: [t[(mode, build, rate, size, r)] for r in reps
                                   if (mode, build, rate, size, r) in t]
        new, old, flat = get("hier", "new"), get("hier", "old"), get("flat", "new")
        both = [r for r in reps if all((m, b, rate, size, r) in t
                                       for m, b in (("hier", "new"), ("hier", "old"), ("flat", "new")))]
        nv = [t[("hier", "new", rate, size, r)] / t[("hier", "old", rate, size, r)] for r in both]
        fv = [t[("flat", "new", rate, size, r)] / t[("hier", "new", rate, size, r)] for r in both]
        print(f"| {rate} | {size} | {stat(new)} | {stat(old)} | {stat(flat)} | {ratio(nv)} | {ratio(fv)} |")


if __name__ == "__main__":
    main(sys.argv[1:])
