#!/usr/bin/env python3
"""The table of perf/hier_links.sh: median [min-max] time per mode, the speedups
against the flat compressed and the fp32 allreduce of the same repeats, and the
bytes each host put on its link per call."""
import glob
import json
import os
import re
import statistics
import sys


def main():
    d = sys.argv[1]
    cells = {}  # (rate, size) -> mode -> list of (time_us, link bytes per host, base_us)
    for path in sorted(glob.glob(os.path.join(d, "*.json"))):
        m = re.match(r"(hier|flat|fp32)_(\w+)_(\w+)_(\d+)\.json$", os.path.basename(path))
        if not m:
            continue
        mode, rate, size, run = m.groups()
        row = json.load(open(path))["rows"][0]
        log = open(path[:-5] + ".log").read()
        sent = [int(x) for x in re.findall(r"host \d+ link: sent (\d+) bytes", log)]
        cells.setdefault((rate, size), {}).setdefault(mode, []).append(
            (row["time_us"], max(sent) if sent else 0, row["baseline_time_us"], int(run)))
    calls = int(os.environ.get("CALLS", "4"))  # iters + 1 warmup
    print("| link | size | hierarchical ms | flat compressed ms | fp32 ms | hier vs flat | "
          "hier vs fp32 | host link MB/call: hier / flat / fp32 |")
    print("|---|---|---|---|---|---|---|---|")
    def fmt(v):
        return f"{statistics.median(v):.0f} [{min(v):.0f}-{max(v):.0f}]"
    for (rate, size), modes in sorted(cells.items(), key=lambda k: (k[0][0], int(k[0][1][:-1]))):
        hier = modes.get("hier", [])
        flat = modes.get("flat", [])
        fp = modes.get("fp32", [])
        th = [x[0] / 1e3 for x in hier]
        tf = [x[0] / 1e3 for x in flat]
        tb = [x[2] / 1e3 for x in fp]
        # Paired per repeat: the ratio of each repeat's runs, then the median.
        byrun = lambda rows: {r[3]: r for r in rows}
        h, f, b = byrun(hier), byrun(flat), byrun(fp)
        vsflat = [f[k][0] / h[k][0] for k in h if k in f]
        vsfp = [b[k][2] / h[k][0] for k in h if k in b]
        mb = lambda rows: statistics.median([r[1] for r in rows]) / calls / 1e6 if rows else 0
        fp_link = statistics.median([b[k][1] - f[k][1] for k in b if k in f]) / calls / 1e6 \
            if b and f else 0
        print(f"| {rate} | {size} | {fmt(th)} | {fmt(tf)} | {fmt(tb)} | "
              f"{statistics.median(vsflat):.2f}x [{min(vsflat):.2f}-{max(vsflat):.2f}] | "
              f"{statistics.median(vsfp):.1f}x [{min(vsfp):.1f}-{max(vsfp):.1f}] | "
              f"{mb(hier):.1f} / {mb(flat):.1f} / {fp_link:.1f} |")


if __name__ == "__main__":
    main()
