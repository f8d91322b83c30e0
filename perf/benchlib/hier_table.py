"""The table of perf/bench.py hier: median [min-max] time per mode, the speedups
against the flat compressed and the fp32 allreduce of the same repeats, and the
bytes each host put on its link per call."""
import glob
import json
import os
import re
import statistics


def main(d):
    cells = {}  # (rate, size) -> mode -> list of (time_us, link bytes per host, base_us)
    for path in sorted(glob.glob(os.path.join(d, "*.json"))):
        m = re.match(r"(hier|flat|fp32)_(\w+)_(\w+)_(\d+)\.json$", os.path.basename(path))
        if not m:
            continue
        mode, rate, size, run = m.groups()
        row = json.load(open(path))["rows"][0]
        log_path = path[:-5] + ".log"
        log = open(log_path).read() if os.path.exists(log_path) else ""
        sent = [int(x) for x in re.findall(r"host \d+ link: sent (\d+) bytes", log)]
        cells.setdefault((rate, size), {}).setdefault(mode, []).append(
            (row["time_us"], max(sent) if sent else None, row["baseline_time_us"], int(run)))
    # Calls per run (iters + 1 warmup), per rate when they differ: CALLS_100mbit=3.
    calls_of = lambda rate: int(os.environ.get("CALLS_" + rate, os.environ.get("CALLS", "4")))
    print("| link | size | hierarchical ms | flat compressed ms | fp32 ms | hier vs flat | "
          "hier vs fp32 | host link MB/call: hier / flat / fp32 |")
    print("|---|---|---|---|---|---|---|---|")
    def fmt(v, digits=0, unit=""):
        if not v:
            return "-"
        return (f"{statistics.median(v):.{digits}f}{unit} "
                f"[{min(v):.{digits}f}-{max(v):.{digits}f}]")
    rate_mbit = lambda r: float(r[:-4]) * (1000 if r.endswith("gbit") else 1)
    for (rate, size), modes in sorted(cells.items(), key=lambda k: (rate_mbit(k[0][0]), int(k[0][1][:-1]))):
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
        calls = calls_of(rate)
        def mb(rows):
            known = [r[1] for r in rows if r[1] is not None]
            return statistics.median(known) / calls / 1e6 if known else float("nan")
        pairs = [b[k][1] - f[k][1] for k in b if k in f and b[k][1] is not None and f[k][1] is not None]
        fp_link = statistics.median(pairs) / calls / 1e6 if pairs else float("nan")
        print(f"| {rate} | {size} | {fmt(th)} | {fmt(tf)} | {fmt(tb)} | "
              f"{fmt(vsflat, 2, 'x')} | {fmt(vsfp, 1, 'x')} | "
              f"{mb(hier):.1f} / {mb(flat):.1f} / {fp_link:.1f} |")

