#!/usr/bin/env python3
"""Tables of the memory-floor run (run.sh): per link and rank count, the
median over repeats of each series, and the ratios of docs/benchmarks.md.

    perf/results/memfloor/summarize.py RAW_DIR
"""
import glob
import json
import os
import re
import statistics
import sys


def rows_of(path):
    """The 256 MiB row of a squall_perf --json file, or of the JSON lines
    fp_bench and gloo_allreduce.py print."""
    with open(path) as f:
        text = f.read()
    if path.endswith(".json"):
        return json.loads(text)["rows"][0]
    for line in text.splitlines():
        if line.startswith("{"):
            return json.loads(line)
    return None  # a run still going, or one that failed (its .txt says why)


def main(raw):
    cells = {}
    for path in glob.glob(os.path.join(raw, "*")):
        name = os.path.basename(path)
        m = re.fullmatch(r"onebit_(new|base)_(tcp|ucx)_(\d+gbit)_n(\d)_(\d+)\.json", name)
        if m:
            build, t, rate, n, _ = m.groups()
            r = rows_of(path)
            if r is None:
                continue
            cell = cells.setdefault((rate, int(n)), {})
            cell.setdefault(f"{build} {t}", []).append(r["time_us"] / 1e3)
            cell.setdefault("wire bytes", []).append(r["wire_bytes"])
            if "memory_bound_us" in r:
                cell.setdefault(f"mem {t}", []).append(r["memory_bound_us"] / 1e3)
            continue
        m = re.fullmatch(r"(gloo|fp32)_(\d+gbit)_n(\d)_(\d+)\.txt", name)
        if m:
            lib, rate, n, _ = m.groups()
            r = rows_of(path)
            if r is not None:
                cells.setdefault((rate, int(n)), {}).setdefault(lib, []).append(r["median_us"] / 1e3)
    series = ("new tcp", "new ucx", "base tcp", "base ucx", "gloo", "fp32")
    cells = {k: c for k, c in cells.items() if all(s in c for s in series)}  # complete cells only
    med = {k: {s: statistics.median(v) for s, v in c.items()} for k, c in cells.items()}
    rng = {k: {s: (min(v), max(v)) for s, v in c.items()} for k, c in cells.items()}

    def ms(k, s):
        lo, hi = rng[k][s]
        return f"{med[k][s]:.1f} [{lo:.1f}-{hi:.1f}]"

    print("| link | ranks | onebit tcp ms | onebit ucx ms | before, tcp ms | before, ucx ms | "
          "gloo fp32 ms | Squall fp32 ms | gloo / onebit (tcp; ucx) | gloo / Squall fp32 | "
          "wire ms | mem ms | x max(wire, mem) (tcp; ucx) | ucx / tcp time | new / before (tcp; ucx) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (rate, n) in sorted(med, key=lambda k: (int(k[0][:-4]), k[1])):
        k = (rate, n)
        c = med[k]
        wire = c["wire bytes"] * 8 / (int(rate[:-4]) * 1e9) * 1e3
        mem = statistics.median([c.get("mem tcp", 0), c.get("mem ucx", 0)])
        floor = max(wire, mem)
        print(f"| {rate} | {n} | {ms(k, 'new tcp')} | {ms(k, 'new ucx')} | {ms(k, 'base tcp')} | "
              f"{ms(k, 'base ucx')} | {ms(k, 'gloo')} | {ms(k, 'fp32')} | "
              f"{c['gloo'] / c['new tcp']:.1f}x; {c['gloo'] / c['new ucx']:.1f}x | "
              f"{c['gloo'] / c['fp32']:.2f}x | {wire:.1f} | {mem:.1f} | "
              f"{c['new tcp'] / floor:.2f}; {c['new ucx'] / floor:.2f} | "
              f"{c['new ucx'] / c['new tcp']:.2f} | "
              f"{c['new tcp'] / c['base tcp']:.2f}; {c['new ucx'] / c['base ucx']:.2f} |")
    n_rep = max(len(c["new tcp"]) for c in cells.values())
    print(f"\n# medians [ranges] over {n_rep} repeats")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "raw"))
