"""Tables of perf/bench.py peers' rows: per link, ranks and size, each
library's median over repeats of its per-run time (the slowest rank's median
of -n calls), with the range over repeats, and Squall's speed relative to
each peer and the
base build (its time / Squall's time: >= 1 means Squall is at least as fast).
On a shaped link, "line" is Squall's share of the line rate: the time the
ring's 2(n-1)/n * size bytes need at the rate, over the measured time.

    perf/bench.py peers --from DIR
"""
import collections
import json
import re
import statistics


def human(n):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def fmt(us):
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} µs"


def rate_bps(link):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([mg])bit", link)
    if not m:
        return None
    return float(m.group(1)) * (1e9 if m.group(2) == "g" else 1e6)


def main(files):
    cells = collections.defaultdict(list)
    libs = []
    for path in files:
        link = path.rsplit("/", 1)[-1].split("_n")[0]
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                r = json.loads(line)
                key = (link, r["ranks"], r["type"], r["op"], r["bytes"])
                cells[key, r["lib"]].append(r["median_us"])
                if r["lib"] not in libs:
                    libs.append(r["lib"])
    order = ["squall"] + sorted(l for l in libs if l.startswith("squall:")) + [
        l for l in ("base", "gloo", "mpi") if l in libs]
    order = [l for l in order if l in libs]
    peers = [l for l in order if l != "squall"]
    keys = sorted({k for k, _ in cells})
    head = ["link", "ranks", "type", "op", "size"] + order + [f"x {l}" for l in peers] + ["line", "repeats"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" if i < 4 else "---:" for i in range(len(head))) + "|")
    for key in keys:
        link, n, t, op, size = key
        row = [link, str(n), t, op, human(size)]
        med = {}
        for lib in order:
            v = cells.get((key, lib))
            if not v:
                row.append("")
                continue
            med[lib] = statistics.median(v)
            row.append(f"{fmt(med[lib])} ({fmt(min(v))}–{fmt(max(v))})" if len(v) > 1 else fmt(med[lib]))
        for lib in peers:
            row.append(f"**{med[lib] / med['squall']:.2f}**" if lib in med and "squall" in med else "")
        bps = rate_bps(link)
        if bps and "squall" in med:
            line_us = 2 * (n - 1) / n * size * 8 / bps * 1e6
            row.append(f"{100 * line_us / med['squall']:.0f}%")
        else:
            row.append("")
        row.append(str(max(len(cells.get((key, l), [])) for l in order)))
        print("| " + " | ".join(row) + " |")

