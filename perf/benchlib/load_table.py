"""The table of a perf/bench.py load run: compressed allreduce time against its
bound, quiet and under load, next to the full-precision ring of the same run.

    perf/bench.py load --from DIR

For every (link, ranks, size, transport) and build it prints, per load
condition, the median and the range over the repeats of squall_perf's time
(each repeat: the median of its iterations, slowest rank), and
time / bound, where bound = max(wire, codec work) as in bound.py: wire
= the run's wire bytes * 8 / rate, codec work at the single-thread rates
codec_bench measured in the same run *under the quiet condition* (so the
loaded ratio shows how far the load stretches the call, not a bound that
moved with it). "stretch" = loaded median / quiet median, for the compressed
call and for the fp32 ring, to compare their sensitivity to the same load.
"""
import collections
import glob
import json
import os
import re
import statistics
import sys

from . import bound

NAME = re.compile(r"(quiet|loaded)_(\w+?)_(\d+(?:g|m)bit)_n(\d+)_(tcp|ucx)_(\d+)\.json$")


def fmt_ms(values):
    if not values:
        return "-"
    med = statistics.median(values)
    return f"{med:.1f} [{min(values):.1f}-{max(values):.1f}]"


def main(out):
    times = collections.defaultdict(list)  # (load, build, rate, n, transport, bytes) -> [ms]
    base = collections.defaultdict(list)   # (load, rate, n, bytes) -> [ms], the fp32 ring
    wire = {}
    counts = {}
    impls = set()
    for path in sorted(glob.glob(os.path.join(out, "*.json"))):
        m = NAME.search(os.path.basename(path))
        if not m:
            continue
        load, build, rate, n, transport, _ = m.groups()
        try:
            with open(path) as f:
                run = json.load(f)
        except (OSError, json.JSONDecodeError):
            continue  # a cell that failed left no (or half a) file; its .err says why
        impls.add(run.get("codec_impl", "avx512"))
        for row in run["rows"]:
            key = (rate, int(n), row["bytes"])
            if build == "fp32":
                base[(load,) + key].append(row["baseline_time_us"] / 1e3)
                continue
            times[(load, build, rate, int(n), transport, row["bytes"])].append(row["time_us"] / 1e3)
            wire[key] = row["wire_bytes"]
            counts[key] = row["count"]
    quiet_codec = sorted(glob.glob(os.path.join(out, "codec_quiet_*.json")))
    if not quiet_codec:
        sys.exit(f"bench.py load: no codec_quiet_*.json in {out} (the quiet codec rates of the run)")
    impl, _, rates = bound.codec_rates(quiet_codec, impls.pop() if len(impls) == 1 else "avx512")
    loaded_codec = sorted(glob.glob(os.path.join(out, "codec_loaded_*.json")))
    print(f"Codec rates ({impl}, one thread, median of {len(quiet_codec)} quiet runs): "
          + ", ".join(f"{k} {v / 1e9:.2f}" for k, v in rates.items()) + " Gelem/s")
    if loaded_codec:
        _, _, lrates = bound.codec_rates(loaded_codec, impl)
        print(f"Under the load ({len(loaded_codec)} runs): "
              + ", ".join(f"{k} {v / 1e9:.2f}" for k, v in lrates.items()) + " Gelem/s")
    print()
    builds = sorted({k[1] for k in times})
    print("| link | ranks | size | transport | build | runs | bound ms | quiet ms | x bound | "
          "loaded ms | x bound | stretch | fp32 quiet ms | fp32 loaded ms | fp32 stretch |")
    print("|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    cells = sorted({(k[2], k[3], k[5], k[4]) for k in times},
                   key=lambda c: (bound.parse_rate(c[0]), c[1], c[3] != "tcp", c[2]))
    for rate, n, nbytes, transport in cells:
        key = (rate, n, nbytes)
        count = counts[key]
        algo = bound.algorithm(n, count, 2048)
        codec_s = bound.codec_seconds(n, count, algo, rates) * max(1, n / 2)
        wire_s = wire[key] * 8 / bound.parse_rate(rate)
        b_ms = max(codec_s, wire_s) * 1e3
        fq, fl = base.get(("quiet",) + key, []), base.get(("loaded",) + key, [])
        fstretch = f"{statistics.median(fl) / statistics.median(fq):.2f}" if fq and fl else "-"
        for build in builds:
            q = times.get(("quiet", build, rate, n, transport, nbytes), [])
            lo = times.get(("loaded", build, rate, n, transport, nbytes), [])
            if not q and not lo:
                continue
            xq = f"{statistics.median(q) / b_ms:.2f}" if q else "-"
            xl = f"{statistics.median(lo) / b_ms:.2f}" if lo else "-"
            st = f"{statistics.median(lo) / statistics.median(q):.2f}" if q and lo else "-"
            fp = transport == "tcp"
            print(f"| {rate} | {n} | {bound.human(nbytes)} | {transport} | {build} | {len(q)}+{len(lo)} | "
                  f"{b_ms:.1f} | "
                  f"{fmt_ms(q)} | {xq} | {fmt_ms(lo)} | {xl} | {st} | "
                  f"{fmt_ms(fq) if fp else '-'} | {fmt_ms(fl) if fp else '-'} | "
                  f"{fstretch if fp else '-'} |")
    print()
    print(f"bound = max(wire, codec work) with the quiet codec rates; codec work = "
          f"n = 2: encode+EF, decode, accumulate of N; "
          "twophase: 1.25 N, 1.25 N, 0.75 N at n = 4, times the ranks per core (n / 2). "
          "Medians [range] over the repeats.")

