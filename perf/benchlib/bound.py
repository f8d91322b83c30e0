"""Lower bound of the compressed allreduce on a shaped link, next to what ran.

    perf/bench.py bound --codec codec.json [--codec ...] RUN.json... [--rate 1gbit] [--cores 2] [--block 2048]
                  [--project 25gbit,40gbit,100gbit] [--threads 1,2,4,8]
                  [--gpu-codec gpu_codec_bench.txt | --hbm-gbps 4800]

codec.json is `codec_bench --json` output (per-element rates of encode+EF,
decode and decode-accumulate for each CPU implementation); each RUN.json is
`squall_perf --vs none --json` output of a compressed run with its
full-precision baseline. The link rate a run was measured on comes from the
file name (`1gbit_n2_1.json`, as perf/bench.py links names them), else from
--rate; --rate never overrides a rate the file name states (a 10 Gbit
measurement is not a 100 Gbit one: ask for --project instead). Rows of the same
link, rank count and size from several files (repeated runs) are combined:
the median of their (per-run median) times.

For every row it prints:
  time     the measured compressed allreduce (median, slowest rank)
  wire     wire bytes (this rank's, per call) * 8 / rate
  codec    the codec work one rank does per call, at codec_bench's rates,
           times the ranks sharing a core (max(1, n / cores))
  bound    max(wire, codec): with perfect pipelining one hides the other
  x bound  time / bound (target <= 1.3)
  mem      the memory-traffic floor squall_perf recorded: the bytes the call
           moves through main memory by its model (reads plus writes of the
           input, both residuals, the encodings and the output, per phase;
           squall_perf.cc, memoryBytes) over the streaming-copy bandwidth each
           rank got with every rank copying at once; "-" for files from before
           squall_perf recorded it
  floor    max(wire, mem): the time no implementation on this machine can beat
  x floor  time / floor (target <= 1.15)
  speedup  full-precision time / compressed time, same run and transport
  x shared time / the bound with the codec rates of --codec-shared runs
           (one codec_bench per core, all at once: they share memory
           bandwidth, as the ranks do); informational, not a target
  vs fp32 wire  the time a full-precision ring allreduce needs on the wire
           alone (2(n-1)/n * 4N bytes * 8 / rate) / compressed time: the
           speedup against an ideal fp32 transport (the targets use speedup)
and checks the targets: wire bytes within 3% of 2(n-1)/n * N * (1/8 + 4/B)
(N elements, B the codec block), time within 1.3x of the bound, and on
1 Gbit at 256 MiB a speedup of at least 10x (2 ranks) or 6x (4 ranks).

--project RATES adds, after the measured table, a projection to each rate for
every measured (ranks, size): nothing is timed at those rates. Wire time is
the measured run's wire bytes at the projected rate, codec time the per-rank
codec work at the rates of the --codec files (codec_bench --json --threads=...)
for each of --threads, assuming each rank owns those cores; also at the run's
copy bandwidth (the memory-bound ceiling of any thread count on this CPU), and
for the GPU codec: from gpu_codec_bench output (--gpu-codec) when it has run,
else from --hbm-gbps with the kernels moving exactly their bytes (labelled an
HBM bound, not a measurement). Each row compares max(wire, codec) with a
full-precision ring at the line rate (2(n-1)/n * 4N bytes), says whether
compression pays and by how much, and gives the rate above which it stops
paying (codec-bound: 2(n-1)/n * 32 N bits / codec time).

Codec work per rank, by algorithm (the auto choice is reproduced from
src/coll/compressed_allgather.cc): twophase encodes N(1 + 1/n) elements,
decodes N(1 + 1/n) and accumulates N(n-1)/n; allgather (always at n = 2)
encodes N, decodes N and accumulates N(n-1). At n = 2 both are
encode + decode + accumulate of N.
"""
import argparse
import json
import os
import re
import statistics
import sys


def parse_rate(text):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(g|m)bit", text)
    if not m:
        raise ValueError(f"bad rate {text!r} (want e.g. 1gbit, 500mbit)")
    return float(m.group(1)) * (1e9 if m.group(2) == "g" else 1e6)


def rate_from_name(path):
    m = re.search(r"(\d+(?:\.\d+)?(?:g|m)bit)", os.path.basename(path))
    return (m.group(1), parse_rate(m.group(1))) if m else (None, None)


def codec_rows(paths, codec="onebit"):
    """The rows of one codec (the bound is onebit's; files from before
    codec_bench measured several codecs hold only onebit rows)."""
    rows = []
    for path in paths:
        with open(path) as f:
            rows += [dict(r, file=path) for r in json.load(f) if r.get("codec", "onebit") == codec]
    return rows


def codec_rates(paths, impl, threads=1):
    """Per-element rates (elements/s) at the largest size measured for impl
    at `threads` threads (files from before --threads count as one), the
    median over the codec_bench files given (one per repeated run)."""
    rows = [r for r in codec_rows(paths) if r.get("threads", 1) == threads]
    if not rows:
        raise KeyError(f"no codec_bench rows at {threads} thread(s)")
    impls = sorted({r["impl"] for r in rows})
    if impl not in impls:
        # The library picks the best the CPU has; codec_bench names them alike.
        impl = next((i for i in ("avx512", "avx2", "scalar") if i in impls), impls[0])
    rows = [r for r in rows if r["impl"] == impl]
    biggest = max(r["elements"] for r in rows)
    rates = {}
    for kernel in ("encode+EF", "decode", "accumulate"):
        rates[kernel] = statistics.median(r["elements_per_s"] for r in rows
                                          if r["elements"] == biggest and r["kernel"] == kernel)
    return impl, biggest, rates


def algorithm(n, count, block):
    encoded = count / 8 + 4 * count / block  # bytes, onebit with fp32 scales
    return "allgather" if encoded * (n - 2) / n <= 50e-6 * 1.25e9 else "twophase"


def codec_seconds(n, count, algo, rates):
    enc, dec, acc = rates["encode+EF"], rates["decode"], rates["accumulate"]
    if algo == "twophase":
        return count * (1 + 1 / n) / enc + count * (1 + 1 / n) / dec + count * (n - 1) / n / acc
    return count / enc + count / dec + count * (n - 1) / acc


def rate_label(bits):
    return f"{bits / 1e9:.3g}gbit" if bits >= 1e9 else f"{bits / 1e6:.3g}mbit"


# Bytes each onebit kernel moves per element (fp32 input, block B): encode+EF
# reads x and e, writes e and the payload; decode reads the payload, writes
# the output; decode-accumulate also reads the accumulator.
def kernel_bytes(block):
    payload = 1 / 8 + 4 / block
    return {"encode+EF": 12 + payload, "decode": 4 + payload, "accumulate": 8 + payload}


def gpu_rates_from_bench(path):
    """Per-element rates of the onebit fp32 kernels from gpu_codec_bench's
    output, at the largest size it ran."""
    pattern = re.compile(r"^(encode\+EF onebit fp32|decode onebit|decode-accumulate onebit)\s+"
                         r"n=(\d+)\s+([\d.]+) ms")
    found = {}
    with open(path) as f:
        for line in f:
            m = pattern.match(line)
            if m:
                found.setdefault(int(m.group(2)), {})[m.group(1)] = float(m.group(3)) / 1e3
    if not found:
        sys.exit(f"bound.py: no onebit fp32 rows in {path} (gpu_codec_bench output expected)")
    n = max(found)
    names = {"encode+EF": "encode+EF onebit fp32", "decode": "decode onebit",
             "accumulate": "decode-accumulate onebit"}
    return n, {k: n / found[n][v] for k, v in names.items()}


def print_projection(a, groups, rates_for):
    rates = [parse_rate(r) for r in a.project.split(",")]
    threads = [int(t) for t in a.threads.split(",")]
    block_default = 2048
    sources = []  # (label, rates, note)
    all_rows = codec_rows(a.codec)
    cores = max((row.get("affinity_cores", 0) for row in all_rows), default=0)
    for t in threads:
        try:
            impl, elems, r = codec_rates(a.codec, a.impl, t)
        except KeyError:
            print(f"# no codec_bench rows at {t} thread(s): run codec_bench --threads=...")
            continue
        over = ""
        if cores and t > cores:
            over = f" (oversubscribed: {cores} cores here)"
        sources.append((f"CPU {impl} {t} thr{over}", r,
                        f"codec_bench {elems >> 20}M elements, {t} thread(s)"))
    # Above the cores this machine has, the measured rows say nothing about
    # real cores; the 1-thread rate times T is given next to them as what
    # perfect scaling would give (an upper bound: memory bandwidth caps it).
    try:
        impl1, _, one = codec_rates(a.codec, a.impl, 1)
        for t in threads:
            if cores and t > cores:
                sources.append((f"CPU {impl1} 1 thr x {t} (linear, not measured)",
                                {k: v * t for k, v in one.items()},
                                f"upper bound: {t} x the 1-thread rate, memory bandwidth ignored"))
    except KeyError:
        pass
    if a.gpu_codec:
        n, r = gpu_rates_from_bench(a.gpu_codec)
        sources.append(("GPU codec (measured)", r, f"gpu_codec_bench {a.gpu_codec}, n={n}"))
    else:
        kb = kernel_bytes(block_default)
        sources.append((f"GPU, HBM bound {a.hbm_gbps:g} GB/s (not measured)",
                        {k: a.hbm_gbps * 1e9 / v for k, v in kb.items()},
                        "no GPU run: kernels assumed to move exactly their bytes at HBM speed"))
    print()
    print("## Projection (not measured at these rates)")
    print()
    for label, r, note in sources:
        print(f"# {label}: {note}; encode+EF {r['encode+EF'] / 1e9:.3f}, decode "
              f"{r['decode'] / 1e9:.3f}, accumulate {r['accumulate'] / 1e9:.3f} Gelem/s")
    print()
    hdr = ("projected link", "from", "n", "size", "codec", "wire ms", "codec ms", "bound ms",
           "fp32 wire ms", "speedup", "pays", "stops paying above")
    print("| " + " | ".join(hdr) + " |")
    print("|" + "|".join("---" if i < 5 or i == 10 else "---:" for i in range(len(hdr))) + "|")
    out = []
    for (_, n, nbytes), g in sorted(groups.items(), key=lambda kv: (kv[0][0] or 0,) + kv[0][1:]):
        rows = g["rows"]
        count = rows[0]["count"]
        wire_bytes = max(r["wire_bytes"] for r in rows)
        block = g["run"].get("block", block_default)
        algo = algorithm(n, count, block)
        fp32_bits = 2 * (n - 1) / n * nbytes * 8
        for rate in rates:
            for label, r, _ in sources:
                wire = wire_bytes * 8 / rate
                codec = codec_seconds(n, count, algo, r)
                bound = max(wire, codec)
                fp32 = fp32_bits / rate
                speedup = fp32 / bound
                # Compression pays while fp32 wire time exceeds the bound; the
                # wire term alone pays up to 32 / 1.016 bits, so above the
                # codec-bound knee the break-even rate is fp32 bits / codec time.
                stop = fp32_bits / codec
                print(f"| {rate_label(rate)} (projected) | {g['label']} run | {n} | {human(nbytes)} | "
                      f"{label} | {wire * 1e3:.2f} | {codec * 1e3:.2f} | {bound * 1e3:.2f} | "
                      f"{fp32 * 1e3:.2f} | {speedup:.2f}x | {'yes' if speedup > 1 else 'no'} | "
                      f"{rate_label(stop)} |")
                out.append({"projected_rate_bps": rate, "measured_link": g["label"], "ranks": n,
                            "bytes": nbytes, "codec_source": label, "wire_s": wire,
                            "codec_s": codec, "bound_s": bound, "fp32_wire_s": fp32,
                            "speedup": speedup, "break_even_bps": stop, "projected": True})
    return out


def human(nbytes):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="perf/bench.py bound", description=__doc__.split("\n")[0])
    ap.add_argument("--codec", required=True, action="append",
                    help="codec_bench --json output (repeatable: the median rate is used)")
    ap.add_argument("--codec-shared", action="append", default=[],
                    help="codec_bench --json of one of --cores instances run at once (repeatable):"
                         " the rates when every core runs a codec and they share memory")
    ap.add_argument("--rate", help="link rate of runs whose file name does not state one (1gbit, "
                    "10gbit, ...); never overrides the file name's")
    ap.add_argument("--project", help="comma-separated rates to project to (25gbit,40gbit,100gbit)")
    ap.add_argument("--threads", default="1,2,4,8",
                    help="codec thread counts of the projection (codec_bench --threads rows)")
    ap.add_argument("--gpu-codec", help="gpu_codec_bench output, for the GPU codec's projection")
    ap.add_argument("--hbm-gbps", type=float, default=4800.0,
                    help="HBM bandwidth for the GPU bound when --gpu-codec is absent (H200: 4800)")
    ap.add_argument("--cores", type=int, default=os.cpu_count(), help="cores the ranks share")
    ap.add_argument("--impl", default="avx512",
                    help="codec implementation, when the run files do not name it")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args(argv)

    seen = {}

    def rates_for(impl):
        if impl not in seen:
            seen[impl] = codec_rates(a.codec, impl)
            used, elems, r = seen[impl]
            print(f"# codec {used} at {elems >> 20}M elements: encode+EF "
                  f"{r['encode+EF'] / 1e9:.3f}, decode {r['decode'] / 1e9:.3f}, accumulate "
                  f"{r['accumulate'] / 1e9:.3f} Gelem/s per thread; {a.cores} cores")
        return seen[impl][2]

    rates_for(a.impl)
    hdr = ("link", "n", "size", "algo", "runs", "time ms", "fp32 ms", "wire ms", "codec ms", "bound ms",
           "x bound", "mem ms", "floor ms", "x floor", "speedup", "vs fp32 wire", "wire/ideal")
    hdr += ("x shared", "targets") if a.codec_shared else ("targets",)
    print("| " + " | ".join(hdr) + " |")
    print("|" + "|".join("---:" if i > 3 and i < len(hdr) - 1 else "---" for i in range(len(hdr))) + "|")
    # Rows of the same link, rank count and size from several files (repeated
    # runs) are combined by the median of their times.
    groups = {}
    for path in a.runs:
        with open(path) as f:
            run = json.load(f)
        label, rate = rate_from_name(path)
        if rate is not None and a.rate and parse_rate(a.rate) != rate:
            sys.exit(f"bound.py: {path} was measured at {label}; refusing to relabel it as "
                     f"{a.rate} (use --project {a.rate} for a labelled projection)")
        if rate is None and a.rate:
            label, rate = a.rate, parse_rate(a.rate)
        if rate is None and a.project:
            label = "loopback"  # its wire bytes serve the projection; no measured bound
        elif rate is None:
            sys.exit(f"bound.py: no rate for {path}: pass --rate or name it like 1gbit_n2.json")
        for row in run["rows"]:
            key = (rate, run["ranks"], row["bytes"])
            g = groups.setdefault(key, {"label": label, "run": run, "rows": []})
            g["rows"].append(row)
    out, all_met = [], True
    for (rate, n, nbytes), g in sorted(groups.items(), key=lambda kv: (kv[0][0] or 0,) + kv[0][1:]):
        if rate is None:
            continue
        label, run, rows = g["label"], g["run"], g["rows"]
        block = run.get("block", 2048)
        rates = rates_for(run.get("codec_impl", a.impl))
        row = rows[0]
        count = row["count"]
        t = statistics.median(r["time_us"] for r in rows) / 1e6
        base = statistics.median(r["baseline_time_us"] for r in rows) / 1e6
        wire_bytes = max(r["wire_bytes"] for r in rows)
        algo = row.get("algorithm") or algorithm(n, count, block)
        wire = wire_bytes * 8 / rate
        codec = codec_seconds(n, count, algo, rates) * max(1.0, n / a.cores)
        bound = max(wire, codec)
        mems = [r["memory_bound_us"] / 1e6 for r in rows if "memory_bound_us" in r]
        mem = statistics.median(mems) if mems else None
        floor = max(wire, mem) if mem is not None else None
        shared = None
        if a.codec_shared:
            shared_rates = codec_rates(a.codec_shared, run.get("codec_impl", a.impl))[2]
            # n/cores ranks per core, each at the rate of one of `cores` concurrent codecs.
            shared = max(wire, codec_seconds(n, count, algo, shared_rates) * max(1.0, n / a.cores))
        ideal = 2 * (n - 1) / n * count * (1 / 8 + 4 / block)
        wire_ratio = wire_bytes / ideal
        fp32_wire = 2 * (n - 1) / n * nbytes * 8 / rate  # ring fp32 at the line rate
        checks = {"wire": abs(wire_ratio - 1) <= 0.03, "bound": t / bound <= 1.3}
        if floor is not None:
            checks["floor"] = t / floor <= 1.15
        if label == "1gbit" and nbytes == 256 << 20 and n in (2, 4):
            checks["speedup"] = base / t >= (10 if n == 2 else 6)
        met = all(checks.values())
        all_met = all_met and met
        verdict = " ".join(f"{k}:{'ok' if v else 'MISS'}" for k, v in checks.items())
        print(f"| {label} | {n} | {human(nbytes)} | {algo} | {len(rows)} | {t * 1e3:.1f} | "
              f"{base * 1e3:.1f} | {wire * 1e3:.1f} | {codec * 1e3:.1f} | {bound * 1e3:.1f} | "
              f"{t / bound:.2f} | " + (f"{mem * 1e3:.1f} | {floor * 1e3:.1f} | {t / floor:.2f} | "
                                       if floor is not None else "- | - | - | ") +
              f"{base / t:.1f} | {fp32_wire / t:.1f} | {wire_ratio:.4f} | "
              + (f"{t / shared:.2f} | " if shared else "") + f"{verdict} |")
        out.append({"link": label, "ranks": n, "bytes": nbytes, "algorithm": algo,
                    "runs": len(rows), "time_s": t, "baseline_s": base, "wire_s": wire,
                    "codec_s": codec, "bound_s": bound, "ratio_to_bound": t / bound,
                    "memory_s": mem, "floor_s": floor,
                    "ratio_to_floor": t / floor if floor is not None else None,
                    "speedup": base / t, "speedup_vs_fp32_wire": fp32_wire / t,
                        "wire_over_ideal": wire_ratio, "shared_bound_s": shared, "targets": checks})
    print(f"# all targets met: {'yes' if all_met else 'no'}")
    projected = print_projection(a, groups, rates_for) if a.project else []
    result = {"codec": {k: v[2] for k, v in seen.items()}, "cores": a.cores, "rows": out,
              "projection": projected}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return result
