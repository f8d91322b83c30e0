#!/usr/bin/python3
"""Squall's benchmarks, one front door.

    perf/bench.py SUBCOMMAND [options]      (perf/bench.py SUBCOMMAND -h for its options)

Every subcommand that measures prints the benchmark binaries' own tables,
keeps their raw output in --out, and writes OUT/bench.json: the run record
(schema squall-bench/1: the command, the machine and its load before and
after, the parameters, and rows of {series, cell, metric, unit, values,
median, min, max}, where values are the repeats). --from DIR rebuilds the
record and the tables from an earlier run's raw files without measuring.
`plots` draws docs/benchmarks.md's figures from such records.

Subcommands:
  codec         codec_bench: kernel rates per implementation and thread count;
                --suite: calibration, paired AVX2/AVX-512, threads, the loopback
                allreduce per implementation and codec thread count, projection
  allreduce     squall_perf on loopback (-np), compressed vs the fp32 ring in the
                same run, variants (environment settings) interleaved per repeat
  links         the same on shaped links (perf/links.sh, root), the codec's rates
                measured before each repeat, then the bound max(wire, codec)
  load          links, quiet and under a controlled load, several builds
  hier          hierarchical vs flat compressed vs fp32 on emulated hosts
  peers         full precision: Squall vs gloo vs Open MPI, interleaved
  nccl-net      the NCCL plugin's net against a raw TCP stream, shaped links
  nccl-collnet  the plugin's CollNet iallreduce per codec, shaped links
  gpu-codec     the CUDA codec kernels against a device-to-device copy
  gpu-allreduce the compressed allreduce of device buffers against ncclAllReduce
  ddp-hooks     DDP communication hooks on shaped links (plain, fp16, PowerSGD, Squall)
  ddp-quality   the 1-bit hook's loss against fp32 over long runs (loopback)
  horovod       an unmodified Horovod job with and without libsquall-preload.so
  convergence   the optimizer study (perf/convergence/run_study.py) as a record
  bound         the bound analysis of saved codec_bench and squall_perf JSON
  plots         the figures of docs/benchmarks.md from records

Shared options: --build DIR (default build), --out DIR, -b/-e/-f (sizes;
codec: elements), -n/--iters, -w/--warmup, --ranks, --rates, --repeats,
--transport, --nice. Lists take spaces or commas: --rates 1gbit,10gbit.
Shaped links need root and network namespaces; without them a subcommand
says why and exits 77.
"""

import argparse
import contextlib
import glob
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib import bound as boundlib  # noqa: E402
from benchlib import common as C  # noqa: E402


def listed(values, kind=str):
    """['1gbit,10gbit', '100mbit'] -> ['1gbit', '10gbit', '100mbit']."""
    if not isinstance(values, list):
        return values  # an option of the same name that takes one value (ddp-hooks --threads)
    out = [x for v in values for x in re.split(r"[,\s]+", str(v)) if x]
    return [kind(x) for x in out]


def tee(text, out, name):
    print(text, end="" if text.endswith("\n") else "\n")
    if out:
        C.write(os.path.join(out, name), text)


def captured(fn, *args):
    """fn's stdout as text (it is printed as well)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        result = fn(*args)
    print(buf.getvalue(), end="")
    return result, buf.getvalue()


def from_source(args):
    """The source note of a record rebuilt with --from: the directory it read
    (and its README.md, which says where files not measured there came from)."""
    if not args.from_dir:
        return None
    d = os.path.relpath(os.path.abspath(args.from_dir), C.ROOT)
    readme = " (see its README.md)" if os.path.exists(os.path.join(args.from_dir, "README.md")) else ""
    return f"raw files in {d}{readme}"


def out_dir(args):
    """--out, or a scratch directory removed at exit (figures printed only)."""
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        return os.path.abspath(args.out)
    scratch = tempfile.TemporaryDirectory(prefix="squall-bench-")
    args._scratch = scratch
    return scratch.name


def perf_env(args):
    """What Python ranks need to find this checkout's package and library."""
    env = {}
    if "SQUALL_LIBRARY" not in os.environ:
        env["SQUALL_LIBRARY"] = os.path.join(os.path.abspath(args.build), "src/core/libsquall.so")
    py = os.path.join(C.ROOT, "python")
    env["PYTHONPATH"] = py + (":" + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    return env


def perf_args(args, iters, warmup):
    return ["-n", str(args.iters or iters), "-w", str(warmup if args.warmup is None else args.warmup)]


def squall_perf_rows(rec, run, cell, series, baseline):
    """Adds the compressed time and (with --vs none) the fp32 ring's, per size,
    from squall_perf --json files of the repeats of one cell."""
    by_size = {}
    for r in (row for x in run for row in x["rows"]):
        by_size.setdefault(r["bytes"], []).append(r)
    for nbytes, rows in sorted(by_size.items()):
        c = dict(cell, bytes=nbytes)
        rec.add(series, c, "time", "ms", [r["time_us"] / 1e3 for r in rows],
                wire_bytes=rows[0]["wire_bytes"], count=rows[0]["count"])
        base = [r["baseline_time_us"] / 1e3 for r in rows if r.get("baseline_time_us")]
        if base and baseline:
            rec.add("squall fp32 ring", c, "time", "ms", base)


# ---------------------------------------------------------------- codec

def cmd_codec(args):
    out = out_dir(args)
    bench = C.build_tool(args.build, "perf/codec_bench")
    rec = C.Record("codec", vars_of(args), args.argv)
    if args.summary:
        tee(C.run([bench, "--summary"], nice=args.nice)[1], out, "summary.txt")
    if args.suite:
        codec_suite(args, out, bench, C.build_tool(args.build, "perf/squall_perf"), rec)
        return rec.finish(args.out)
    if args.summary and args.b is None:
        return rec.finish(args.out)
    elems = C.sizes(args.b or "64M", args.e or args.b or "64M", args.f or 4)
    opts = ["--sizes=" + ",".join(C.human(x) for x in elems), f"--iters={args.iters or 7}", "--json"]
    opts += [f"--impl={','.join(args.impl)}"] if args.impl else []
    opts += [f"--threads={','.join(map(str, args.threads))}"] if args.threads else []
    opts += [f"--codecs={','.join(args.codecs)}"] if args.codecs else []
    files = []
    for rep in range(1, (args.repeats or 1) + 1):
        path = os.path.join(out, f"codec_{rep}.json")
        C.run([bench] + opts, out=path, nice=args.nice)
        files.append(path)
    codec_rows(rec, files)
    return rec.finish(args.out)


def codec_rows(rec, files, series="codec"):
    """One row per (codec, impl, threads, kernel, elements): elements/s per
    file (files from before codec_bench measured several codecs are onebit's)."""
    cells = {}
    for path in files:
        with open(path) as f:
            for r in json.load(f):
                key = (r.get("codec", "onebit"), r["impl"], r.get("threads", 1), r["kernel"], r["elements"])
                cells.setdefault(key, []).append(r["elements_per_s"])
    for (codec, impl, threads, kernel, elements), v in sorted(cells.items()):
        rec.add(series, {"codec": codec, "impl": impl, "threads": threads, "kernel": kernel,
                         "elements": elements}, "rate", "elements/s", v)
    lines = [f"| {c['codec']} | {c['impl']} | {c['threads']} | {c['kernel']} | {C.human(c['elements'])} | "
             f"{C.fmt_range(r, 3, 1e-9)} |" for r in rec.data["rows"] if r["series"] == series
             for c in [r["cell"]]]
    print("| codec | impl | threads | kernel | elements | Gelem/s median [range over repeats] |\n"
          "|---|---|---:|---|---:|---|\n" + "\n".join(lines))


def codec_suite(args, out, bench, perf, rec):
    """Every codec figure with its baseline from the same run: calibration,
    paired implementations streaming (64M) and in cache (1M), threads, the
    allreduce on loopback per implementation and codec threads (interleaved
    repeats), and the projection to faster links."""
    nice = args.nice
    C.run([bench, "--calibrate=5"], out=os.path.join(out, "calibrate.txt"), nice=nice)
    impl = ",".join(args.impl or ["avx2", "avx512"])
    C.run([bench, "--sizes=64M", f"--impl={impl}", "--iters=9", "--json"],
          out=os.path.join(out, "impl_64M.json"), nice=nice)
    C.run([bench, "--sizes=1M", f"--impl={impl}", "--iters=21", "--json"],
          out=os.path.join(out, "impl_1M.json"), nice=nice)
    widest = (args.impl or ["avx512"])[-1]
    threads = ",".join(map(str, args.threads or [1, 2, 4, 8]))
    C.run([bench, "--sizes=64M", f"--impl={widest}", f"--threads={threads}", "--iters=7", "--json"],
          out=os.path.join(out, "codec_threads.json"), nice=nice)
    codec_rows(rec, [os.path.join(out, "impl_64M.json")], "paired impl 64M")
    codec_rows(rec, [os.path.join(out, "impl_1M.json")], "paired impl 1M")
    codec_rows(rec, [os.path.join(out, "codec_threads.json")], "threads")
    variants = [(f"isa {i}", {"SQUALL_CODEC_ISA": i, "SQUALL_CODEC_THREADS": "1"}, "64M", "64M")
                for i in impl.split(",")]
    variants += [(f"codec threads {t}", {"SQUALL_CODEC_THREADS": str(t)}, "64M", "256M") for t in (1, 2)]
    runs = {}
    for rep in range(1, (args.repeats or 3) + 1):
        for name, env, lo, hi in variants:
            path = os.path.join(out, f"{name.replace(' ', '_')}_{rep}.json")
            C.run([perf, "-np", "2", "-b", lo, "-e", hi, "-f", "4", "-n", "5", "-w", "1", "--vs", "none",
                   "--json", path], env=env, out=path[:-5] + ".txt", nice=nice)
            runs.setdefault(name, []).append(path)
    for name, files in runs.items():
        squall_perf_rows(rec, [json.load(open(p)) for p in files],
                         {"variant": name, "ranks": 2, "link": "loopback"}, "squall onebit", True)
    _, text = captured(boundlib.main, ["--codec", os.path.join(out, "codec_threads.json"), "--impl", widest,
                                       "--project", "10gbit,25gbit,40gbit,100gbit", "--threads", threads,
                                       "--json", os.path.join(out, "projection.json")]
                       + runs["codec threads 1"])
    C.write(os.path.join(out, "projection.md"), text)


# ------------------------------------------------------------ allreduce

def parse_variants(specs):
    """['name:VAR=V,VAR2=W', 'plain'] -> [('name', {VAR: V, VAR2: W}), ('plain', {})]."""
    out = []
    for spec in specs or ["default"]:
        name, _, env = spec.partition(":")
        pairs = dict(kv.split("=", 1) for kv in env.split(",") if kv) if env else {}
        out.append((name, pairs))
    return out


def cmd_allreduce(args):
    out = out_dir(args)
    perf = C.build_tool(args.build, "perf/squall_perf")
    rec = C.Record("allreduce", vars_of(args), args.argv)
    variants = parse_variants(args.variant)
    files = {}
    for rep in range(1, (args.repeats or 1) + 1):
        order = variants[rep % len(variants):] + variants[:rep % len(variants)]
        for n in args.ranks or [2]:
            for name, env in order:
                path = os.path.join(out, f"{name}_n{n}_{rep}.json")
                cmd = [perf, "-np", str(n), "-b", args.b or "1M", "-e", args.e or "64M",
                       "-f", str(args.f or 4), "--codec", args.codec, "--json", path] + perf_args(args, 5, 1)
                cmd += ["--transport", args.transport] if args.transport else []
                cmd += [] if args.no_baseline else ["--vs", "none"]
                _, text = C.run(cmd, env=env, nice=args.nice)
                print(text, end="")
                C.write(path[:-5] + ".txt", text)
                files.setdefault((name, n), []).append(path)
    for (name, n), paths in files.items():
        squall_perf_rows(rec, [json.load(open(p)) for p in paths],
                         {"variant": name, "ranks": n, "link": "loopback"}, f"squall {args.codec}",
                         not args.no_baseline)
    return rec.finish(args.out)


# ---------------------------------------------------------------- links

LINK_RUN = re.compile(r"(\d+(?:g|m)bit)_n(\d+)_(\d+)\.json$")


def cmd_links(args):
    out = out_dir(args)
    rates, ranks = args.rates or ["1gbit", "10gbit"], args.ranks or [2, 4]
    if not args.from_dir:
        perf = C.build_tool(args.build, "perf/squall_perf")
        bench = None if args.no_bound else C.build_tool(args.build, "perf/codec_bench")
        C.write(os.path.join(out, "machine.txt"), subprocess.run(
            "date; uptime; nproc", shell=True, capture_output=True, text=True).stdout)
        cells, done, t0 = (args.repeats or 1) * len(rates) * len(ranks), 0, time.monotonic()
        for rep in range(1, (args.repeats or 1) + 1):
            if bench:
                # The codec's rates in the conditions of the repeat that follows,
                # alone and with one instance per core at once (the ranks share
                # memory bandwidth too).
                copts = ["--sizes=64M", "--impl=avx2,avx512", "--codecs=onebit", "--iters=5", "--json"]
                C.run([bench] + copts, out=os.path.join(out, f"codec_{rep}.json"), nice=args.nice)
                with contextlib.ExitStack() as files:
                    procs = [subprocess.Popen([bench] + copts, stdout=files.enter_context(open(
                        os.path.join(out, f"codec_shared_{rep}_{c}.json"), "w")))
                        for c in range(1, os.cpu_count() + 1)]
                    if any([p.wait() for p in procs]):
                        sys.exit("bench.py: a concurrent codec_bench failed")
            for rate in rates:
                for n in ranks:
                    eta = (time.monotonic() - t0) / done * (cells - done) if done else None
                    print(f"bench.py: [cell {done + 1}/{cells}] {rate}, {n} ranks, repeat {rep}"
                          + (f", ETA {eta:.0f} s" if eta else ""), file=sys.stderr)
                    path = os.path.join(out, f"{rate}_n{n}_{rep}.json")
                    cmd = [perf, "-b", args.b or "16M", "-e", args.e or "256M", "-f", str(args.f or 4),
                           "--vs", "none", "--transport", args.transport or "tcp", "--json", path]
                    _, text = C.run(C.shaped(rate, n, cmd + perf_args(args, 5, 1), delay=args.delay),
                                    nice=args.nice)
                    print(text, end="")
                    C.write(path[:-5] + ".txt", text)
                    done += 1
        with open(os.path.join(out, "machine.txt"), "a") as f:
            f.write(subprocess.run("uptime", shell=True, capture_output=True, text=True).stdout)
    src = args.from_dir or out
    rec = C.Record("links", vars_of(args), args.argv,
                   source=from_source(args))
    links_rows(rec, src, out, args)
    return rec.finish(args.out)


def links_rows(rec, src, out, args):
    runs = {}
    for path in sorted(glob.glob(os.path.join(src, "*.json"))):
        m = LINK_RUN.search(os.path.basename(path))
        if m:
            runs.setdefault((m.group(1), int(m.group(2))), []).append(path)
    if not runs:
        sys.exit(f"bench.py: no <rate>_n<ranks>_<repeat>.json in {src}")
    for (rate, n), paths in sorted(runs.items(), key=lambda kv: (C.parse_rate(kv[0][0]), kv[0][1])):
        squall_perf_rows(rec, [json.load(open(p)) for p in paths], {"link": rate, "ranks": n},
                         "squall onebit", True)
    codec = sorted(glob.glob(os.path.join(src, "codec_[0-9]*.json")))
    if args.no_bound or not codec:
        return
    shared = sorted(glob.glob(os.path.join(src, "codec_shared_*.json")))
    argv = [x for p in codec for x in ("--codec", p)] + [x for p in shared for x in ("--codec-shared", p)]
    argv += ["--json", os.path.join(out, "bound.json")] + [p for ps in runs.values() for p in ps]
    result, text = captured(boundlib.main, argv)
    C.write(os.path.join(out, "bound.md"), text)
    bound_rows(rec, result)


def bound_rows(rec, result):
    """The bound of bound.py's result per measured cell, with its terms."""
    for b in result["rows"]:
        cell = {"link": b["link"], "ranks": b["ranks"], "bytes": b["bytes"]}
        rec.add("bound max(wire, codec)", cell, "time", "ms", [b["bound_s"] * 1e3],
                wire_ms=b["wire_s"] * 1e3, codec_ms=b["codec_s"] * 1e3, algorithm=b["algorithm"])


# ----------------------------------------------------------------- load

LOAD_RUN = re.compile(r"(quiet|loaded)_(\w+?)_(\d+(?:g|m)bit)_n(\d+)_(tcp|ucx)_(\d+)\.json$")


def cmd_load(args):
    out = out_dir(args)
    rates, ranks = args.rates or ["1gbit", "10gbit"], args.ranks or [2, 4]
    builds = [b.split("=", 1) if "=" in b else [b, b] for b in (args.builds or ["new=" + args.build])]
    if not args.from_dir:
        for _, d in builds:
            C.build_tool(d, "perf/squall_perf")
        first = builds[0][1]
        codec = C.build_tool(first, "perf/codec_bench")
        tcp_builds = args.tcp_builds or [b for b, _ in builds]
        lo, hi = args.b or "64M", args.e or "256M"
        iters = args.iters or 5

        def machine(what):
            with open(os.path.join(out, "machine.txt"), "a") as f:
                f.write(f"== {what}\n" + subprocess.run("date -u; uptime; vmstat 1 5", shell=True,
                                                        capture_output=True, text=True).stdout)

        def cell(load, build, d, rate, n, transport, rep, extra, top=hi):
            name = f"{load}_{build}_{rate}_n{n}_{transport}_{rep}"
            cmd = [os.path.join(d, "perf/squall_perf"), "-b", lo, "-e", top, "-f", "4", "--transport",
                   transport, "--json", os.path.join(out, name + ".json"), "--times"] + extra
            rc, text = C.run(C.shaped(rate, n, cmd), nice=-15 if load == "quiet" else 0, check=False,
                             out=os.path.join(out, name + ".txt"), err=os.path.join(out, name + ".err"))
            if rc:
                print(f"bench.py: {name} failed ({rc}); see {name}.err", file=sys.stderr)

        machine("start")
        for rep in range(args.first_repeat, args.first_repeat + (args.repeats or 5)):
            for load in ("quiet", "loaded"):
                busy = []
                if load == "loaded":
                    busy = [subprocess.Popen(["nice", "-n", "0", "bash", "-c", "while :; do :; done"])
                            for _ in range(args.busy)]
                try:
                    C.run([codec, "--sizes=16M", "--impl=avx2,avx512", "--codecs=onebit", "--iters=5", "--json"],
                          out=os.path.join(out, f"codec_{load}_{rep}.json"),
                          nice=-15 if load == "quiet" else 0)
                    for rate in rates:
                        for n in ranks:
                            for b, d in builds:
                                if b in tcp_builds:
                                    cell(load, b, d, rate, n, "tcp", rep, ["-n", str(iters), "-w", "1"])
                            if not args.no_fp32:
                                cell(load, "fp32", first, rate, n, "tcp", rep,
                                     ["-n", "3", "-w", "0", "--vs", "none"], args.fp32_max or hi)
                    for spec in args.ucx if args.ucx is not None else ["4:1gbit"]:
                        n, rate = spec.split(":")
                        for b, d in builds:
                            cell(load, b, d, rate, int(n), "ucx", rep, ["-n", str(iters), "-w", "1"])
                finally:
                    for p in busy:
                        p.kill()
                        p.wait()
            machine(f"after repeat {rep}")
    src = args.from_dir or out
    rec = C.Record("load", vars_of(args), args.argv,
                   source=from_source(args))
    cells = {}
    for path in sorted(glob.glob(os.path.join(src, "*.json"))):
        m = LOAD_RUN.search(os.path.basename(path))
        if not m:
            continue
        try:
            run = json.load(open(path))
        except (OSError, json.JSONDecodeError):
            continue  # a failed cell; its .err says why
        load, build, rate, n, transport, _ = m.groups()
        for r in run["rows"]:
            fp32 = build == "fp32"
            key = ("squall fp32 ring" if fp32 else f"squall onebit ({build})", load, rate, int(n),
                   transport, r["bytes"])
            cells.setdefault(key, []).append((r["baseline_time_us"] if fp32 else r["time_us"]) / 1e3)
    for (series, load, rate, n, transport, nbytes), v in sorted(cells.items()):
        rec.add(series, {"load": load, "link": rate, "ranks": n, "transport": transport, "bytes": nbytes},
                "time", "ms", v)
    _, text = captured(__import__("benchlib.load_table", fromlist=["main"]).main, src)
    C.write(os.path.join(out, "table.md"), text)
    return rec.finish(args.out)


# ----------------------------------------------------------------- hier

HIER_RUN = re.compile(r"(hier|flat|fp32)_(\w+)_(\w+)_(\d+)\.json$")


def cmd_hier(args):
    out = out_dir(args)
    rates, sizes = args.rates or ["1gbit", "10gbit"], args.sizes or ["64M", "256M"]
    if not args.from_dir:
        perf = C.build_tool(args.build, "perf/squall_perf")
        ranks = args.hosts * args.per_host
        with open(os.path.join(out, "uptime.txt"), "a") as f:
            f.write("uptime before: " + os.popen("uptime").read())
        for rep in range((args.repeats or 3)):
            for rate in rates:
                for size in sizes:
                    for mode in ("hier", "flat", "fp32"):
                        name = os.path.join(out, f"{mode}_{rate}_{size}_{rep}")
                        cmd = [perf, "-b", size, "-e", size, "--transport", args.transport or "tcp",
                               "--json", name + ".json"] + perf_args(args, 3, 1)
                        cmd += ["--vs", "none"] if mode == "fp32" else []
                        env = {"SQUALL_HIERARCHY": "auto" if mode == "hier" else "off"}
                        # links.sh's per-host byte counters go to stderr: the table reads them.
                        p = subprocess.run(["nice", "-n", str(args.nice or 0)] +
                                           C.shaped(rate, ranks, cmd, per_host=args.per_host),
                                           env=dict(os.environ, **env), stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, text=True)
                        C.write(name + ".log", p.stdout)
                        if p.returncode == C.SKIP:
                            raise C.Skip("perf/links.sh cannot shape links here")
                        if p.returncode:
                            sys.exit(f"bench.py: {name} failed:\n{p.stdout[-1500:]}")
        with open(os.path.join(out, "uptime.txt"), "a") as f:
            f.write("uptime after: " + os.popen("uptime").read())
    src = args.from_dir or out
    rec = C.Record("hier", vars_of(args), args.argv,
                   source=from_source(args))
    cells = {}
    for path in sorted(glob.glob(os.path.join(src, "*.json"))):
        m = HIER_RUN.match(os.path.basename(path))
        if not m:
            continue
        mode, rate, size, _ = m.groups()
        r = json.load(open(path))["rows"][0]
        log = open(path[:-5] + ".log").read() if os.path.exists(path[:-5] + ".log") else ""
        sent = [int(x) for x in re.findall(r"host \d+ link: sent (\d+) bytes", log)]
        t = r["baseline_time_us"] if mode == "fp32" else r["time_us"]
        c = cells.setdefault((mode, rate, r["bytes"]), {"t": [], "sent": []})
        c["t"].append(t / 1e3)
        c["sent"] += [max(sent)] if sent else []
    names = {"hier": "squall onebit hierarchical", "flat": "squall onebit flat",
             "fp32": "squall fp32 ring"}
    for (mode, rate, nbytes), c in sorted(cells.items()):
        rec.add(names[mode], {"link": rate, "bytes": nbytes, "hosts": args.hosts,
                              "ranks_per_host": args.per_host}, "time", "ms", c["t"],
                host_link_bytes_per_run=c["sent"])
    _, text = captured(__import__("benchlib.hier_table", fromlist=["main"]).main, src)
    C.write(os.path.join(out, "table.md"), text)
    return rec.finish(args.out)


# ---------------------------------------------------------------- peers

def cmd_peers(args):
    out = out_dir(args)
    if args.matrix and not args.from_dir:
        return peers_matrix(args, out)
    if not args.from_dir:
        for link in args.link:
            peers_measure(args, out, link, args.ranks or [2], args.libs or ["squall", "gloo", "mpi"],
                          args.repeats or 3, ["-b", args.b or "1M", "-e", args.e or "256M", "-f",
                                              str(args.f or 4)] + perf_args(args, 10, 2))
    return peers_record(args, out)


def peers_record(args, out):
    src = args.from_dir or out
    files = sorted(glob.glob(os.path.join(src, "**", "*.jsonl"), recursive=True))
    if not files:
        sys.exit(f"bench.py: no *.jsonl rows in {src}")
    rec = C.Record("peers", vars_of(args), args.argv,
                   source=from_source(args))
    cells = {}
    for path in files:
        link = os.path.basename(path).split("_n")[0]
        for r in C.json_lines(open(path).read()):
            key = (r["lib"], link, r["ranks"], r["type"], r["op"], r["bytes"])
            cells.setdefault(key, []).append(r["median_us"])
    for (lib, link, n, t, op, nbytes), v in sorted(cells.items()):
        rec.add(lib, {"link": link, "ranks": n, "type": t, "op": op, "bytes": nbytes}, "time", "us", v)
    for d in sorted({os.path.dirname(p) for p in files}):
        group = [p for p in files if os.path.dirname(p) == d]
        _, text = captured(__import__("benchlib.peers_table", fromlist=["main"]).main, group)
        where = os.path.join(out, os.path.relpath(d, src))
        os.makedirs(where, exist_ok=True)
        C.write(os.path.join(where, "table.md"), text)
    return rec.finish(args.out)


def peers_measure(args, out, link, ranks_list, libs, repeat, bench_args):
    """Each library once per repeat over every size, in rotating order, so a
    load spike falls on all of them; rows appended to OUT/<link>_n<ranks>.jsonl."""
    os.makedirs(out, exist_ok=True)
    fp = C.build_tool(args.build, "perf/fp_bench")
    gloo = os.path.join(C.HERE, "benchlib", "gloo_allreduce.py")
    env = {"SQUALL_TRANSPORT": os.environ.get("SQUALL_TRANSPORT", "tcp")}
    for n in ranks_list:
        path = os.path.join(out, f"{link}_n{n}.jsonl")
        for k in range(repeat):
            for j in range(len(libs)):
                lib = libs[(j + k) % len(libs)]
                label = f"repeat{k}"
                print(f"bench.py: repeat {k + 1}/{repeat} {lib}, {n} ranks, {link}", file=sys.stderr)
                e, name = dict(env), lib
                if lib == "squall":
                    cmd = [fp, "--lib", "squall"]
                elif lib.startswith("squall:"):
                    var, _, val = lib[len("squall:"):].partition("=")
                    e[var] = val
                    cmd = [fp, "--lib", "squall"]
                elif lib == "base":
                    if not os.path.isfile(os.path.join(args.base_lib or "", "libsquall.so.0")):
                        sys.exit("bench.py: the base library needs --base-lib DIR holding libsquall.so.0")
                    e["LD_LIBRARY_PATH"] = os.path.abspath(args.base_lib)
                    cmd = [fp, "--lib", "squall"]
                elif lib == "gloo":
                    cmd = ["/usr/bin/python3", gloo]
                elif lib == "mpi":
                    if link != "loopback":
                        print("bench.py: Open MPI runs on loopback only (its launcher cannot start "
                              "ranks in perf/links.sh's namespaces); skipped", file=sys.stderr)
                        continue
                    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n), "--bind-to",
                           "none", "--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca",
                           "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo",
                           fp, "--lib", "mpi"]
                else:
                    sys.exit(f"bench.py: unknown library {lib} (squall, squall:VAR=VALUE, base, gloo, mpi)")
                cmd += ["--label", label] + bench_args
                if lib == "mpi":
                    rc, text = C.run(cmd, env=e, check=False, nice=args.nice)
                elif link == "loopback":
                    rc, text = C.local_ranks(n, cmd, env=e)
                else:
                    e["GLOO_SOCKET_IFNAME"] = "eth0"
                    rc, text = C.run(C.shaped(link, n, ["env", "GLOO_SOCKET_IFNAME=eth0"] + cmd), env=e,
                                     check=False, nice=args.nice)
                rows = C.json_lines(text)
                for r in rows:
                    r["lib"] = name  # base and squall:VAR=V rows are named after the setting
                with open(path, "a") as f:
                    f.writelines(json.dumps(r) + "\n" for r in rows)
                if rc:
                    # A failed run keeps the rows rank 0 printed and the matrix goes on.
                    print(f"bench.py: {lib} failed (exit {rc}), repeat {k + 1}", file=sys.stderr)


def peers_matrix(args, out):
    """docs/benchmarks.md's full-precision matrix: small messages at 4 ranks,
    1 MiB-256 MiB on loopback at 2 and 4 ranks, and 256 MiB on shaped links
    (gloo only as peer there)."""
    small = ["squall", "base", "gloo", "mpi"] if args.base_lib else ["squall", "gloo", "mpi"]
    peers_measure(args, os.path.join(out, "small"), "loopback", [4], small, 5,
                  ["-b", "4K", "-e", "64K", "-f", "4", "-n", "30", "-w", "5"])
    peers_measure(args, os.path.join(out, "large"), "loopback", [2, 4], ["squall", "gloo", "mpi"], 3,
                  ["-b", "1M", "-e", "256M", "-f", "4", "-n", "5", "-w", "1"])
    for rate in ("1gbit", "10gbit"):
        try:
            peers_measure(args, os.path.join(out, "links"), rate, [2, 4], ["squall", "gloo"], 3,
                          ["-b", "256M", "-e", "256M", "-n", "3", "-w", "1"])
        except C.Skip as why:
            print(f"bench.py: shaped cells skipped: {why}", file=sys.stderr)
            break
    return peers_record(args, out)


# ------------------------------------------------------------ nccl-net

def cmd_nccl_net(args):
    out = out_dir(args)
    rec = C.Record("nccl-net", vars_of(args), args.argv)
    bench = C.build_tool(args.build, "plugin/nccl/nccl_net_bench")
    rows = []
    for rep in range(args.repeats or 1):
        for rate in args.rates or ["1gbit", "10gbit"]:
            mib = args.mib or (256 if rate == "1gbit" else 1024)
            for conns in args.conns or [1, 4]:
                for plane in ("raw", "tcp", "ucx"):
                    cmd = [bench, "--mode", "raw" if plane == "raw" else "plugin", "--conns", str(conns),
                           "--bytes", str(mib)]
                    rc, text = C.run(C.shaped(rate, 2, cmd), check=False, nice=args.nice,
                                     env={"SQUALL_NET_TRANSPORT": "tcp" if plane == "raw" else plane})
                    if rc == C.SKIP:
                        raise C.Skip("perf/links.sh cannot shape links here")
                    if rc:
                        if plane == "ucx":
                            print(f"bench.py: no UCX plane ({rc}); skipping it", file=sys.stderr)
                            continue
                        sys.exit(f"bench.py: {plane}, {conns} connections at {rate} failed ({rc})")
                    r = dict(C.json_lines(text)[-1], rate=rate, plane=plane, repeat=rep)
                    print(json.dumps(r))
                    rows.append(r)
    with open(os.path.join(out, "net.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    groups = {}
    for r in rows:
        groups.setdefault((r["plane"], r["rate"], r["conns"]), []).append(r["gbit_s"])
    for (plane, rate, conns), v in groups.items():
        rec.add(f"{plane}", {"link": rate, "conns": conns}, "throughput", "Gbit/s", v)
    return rec.finish(args.out)


def cmd_nccl_collnet(args):
    out = out_dir(args)
    rec = C.Record("nccl-collnet", vars_of(args), args.argv)
    bench = C.build_tool(args.build, "plugin/nccl/nccl_collnet_bench")
    rows = []
    for rep in range(args.repeats or 1):
        for rate in args.rates or ["1gbit"]:
            for n in args.ranks or [2, 4]:
                for codec in args.codecs or ["none", "bf16", "fp16", "int8"]:
                    cmd = [bench, "--mib", str(args.mib or 64), "--iters", str(args.iters or 3)]
                    _, text = C.run(C.shaped(rate, n, cmd), nice=args.nice,
                                    env={"SQUALL_COLLNET_CODEC": codec, "SQUALL_TRANSPORT": "tcp"})
                    r = dict(C.json_lines(text)[-1], rate=rate, repeat=rep)
                    print(json.dumps(r))
                    rows.append(r)
    with open(os.path.join(out, "collnet.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    groups = {}
    for r in rows:
        groups.setdefault((r["codec"], r["rate"], r["ranks"], r["mib"]), []).append(r)
    for (codec, rate, n, mib), rs in groups.items():
        rec.add(codec, {"link": rate, "ranks": n, "bytes": mib << 20}, "time", "ms", [r["ms"] for r in rs],
                max_abs_err=max(r["max_abs_err"] for r in rs))
    return rec.finish(args.out)


# ------------------------------------------------------------------ gpu

GPU_CODEC_LINE = re.compile(r"^(.+?)\s+n=(\d+)\s+([\d.]+) ms\s+([\d.]+) GB/s")
GPU_ALLREDUCE_LINE = re.compile(r"^BENCH n=(\d+) count=(\d+) .*compressed onebit\s+([\d.]+) ms, "
                                r"ncclAllReduce\s+([\d.]+) ms")


def gpu_codec_rows(rec, texts):
    """gpu_codec_bench's lines (kernel, n, ms, GB/s), one text per repeat."""
    cells = {}
    for text in texts:
        for line in text.splitlines():
            m = GPU_CODEC_LINE.match(line)
            if m:
                cells.setdefault((m.group(1), int(m.group(2))), []).append((float(m.group(3)), float(m.group(4))))
    for (op, n), v in sorted(cells.items()):
        rec.add(op, {"elements": n}, "time", "ms", [t for t, _ in v], gb_per_s=[g for _, g in v])


def gpu_allreduce_rows(rec, texts):
    """gpu_allreduce_bench's BENCH lines: the compressed allreduce of device
    buffers and ncclAllReduce, ranks sharing one GPU."""
    cells = {}
    for text in texts:
        for m in map(GPU_ALLREDUCE_LINE.match, text.splitlines()):
            if m:
                key = (int(m.group(1)), int(m.group(2)))
                cells.setdefault(key, []).append((float(m.group(3)), float(m.group(4))))
    for (n, count), v in sorted(cells.items()):
        cell = {"ranks": n, "bytes": count * 4, "gpus": 1}
        rec.add("squall onebit (device buffers)", cell, "time", "ms", [c for c, _ in v])
        rec.add("ncclAllReduce", cell, "time", "ms", [p for _, p in v])


def cmd_gpu(args):
    out = out_dir(args)
    codec = args.command == "gpu-codec"
    tool = C.build_tool(args.build, "perf/gpu_codec_bench" if codec else "perf/gpu_allreduce_bench")
    cmd = [tool]
    if codec:
        if args.b:
            cmd += ["--elements", ",".join(str(x) for x in C.sizes(args.b, args.e or args.b, args.f or 4))]
        cmd += ["--iters", str(args.iters)] if args.iters else []
        cmd += ["--block", str(args.block)] if args.block else []
    texts = []
    for rep in range(1, (args.repeats or 1) + 1):
        _, text = C.run(cmd, nice=args.nice, out=os.path.join(out, f"{args.command}_{rep}.txt"))
        print(text, end="")
        if "SKIP: no CUDA device" in text:
            raise C.Skip("no CUDA device")
        texts.append(text)
    rec = C.Record(args.command, vars_of(args), args.argv)
    (gpu_codec_rows if codec else gpu_allreduce_rows)(rec, texts)
    return rec.finish(args.out)


# ------------------------------------------------------------ ddp hooks

def cmd_ddp_hooks(args):
    from benchlib import ddp_hooks
    os.environ.update(perf_env(args))
    args.rates = args.rates or ["1gbit", "10gbit"]
    args.repeats = args.repeats or 3
    args.warmup = 10 if args.warmup is None else args.warmup
    if args.out is None:
        args.out = os.path.join("perf-results", "ddp-hooks-" + time.strftime("%Y%m%d-%H%M%S"))
    if args.from_dir:
        args.out = args.from_dir
        runs = ddp_hooks.load_runs(args)
    else:
        runs = ddp_hooks.measure(args)
        if runs is None:
            raise C.Skip("perf/links.sh cannot shape links here")
    if not runs:
        sys.exit(f"bench.py: no completed runs in {args.out}")
    ddp_hooks._summary(args, runs)
    rec = C.Record("ddp-hooks", vars_of(args), args.argv,
                   source=from_source(args))
    for series, cell, metric, unit, values in ddp_hooks.rows(args, runs):
        rec.add(series, cell, metric, unit, values)
    return rec.finish(args.out)


def cmd_ddp_quality(args):
    os.environ.update(perf_env(args))
    sys.path.insert(0, os.path.join(C.ROOT, "python"))
    from benchlib import ddp_quality
    rows = ddp_quality.run(args)
    rec = C.Record("ddp-quality", vars_of(args), args.argv)
    base = {}
    for r in rows:
        base.setdefault((r["family"], r["variant"]), []).append(r)
    for (family, variant), rs in base.items():
        rec.add(variant, {"family": family, "steps": args.steps}, "loss", "loss", [r["loss"] for r in rs])
        rec.add(variant, {"family": family, "steps": args.steps}, "gap_to_fp32", "fraction",
                [r["gap"] for r in rs])
    return rec.finish(args.out)


# -------------------------------------------------------------- horovod

HOROVOD_ROW = """
import json, pathlib, sys
work = sys.argv[1]
out = json.loads(pathlib.Path(work, "out.json").read_text())
rep = pathlib.Path(work, "report.0.json")
r = json.loads(rep.read_text()) if rep.exists() else {}
print(json.dumps({"step_ms": out["step_ms"], "bytes_sent": r.get("bytes_sent"),
                  "bytes_full_precision": r.get("bytes_full_precision")}))
"""


def cmd_horovod(args):
    """The Horovod job of tests/plugin/preload (horovod_train.py) with and
    without the interposer, alternating, on a shaped network: mpirun starts
    every rank here and Open MPI's TCP layer carries the data over the
    loopback of a private namespace shaped with tc tbf, so the ranks SHARE
    one link of the rate (an aggregate cap, like ranks behind one NIC)."""
    out = out_dir(args)
    lib = os.path.join(os.path.abspath(args.build), "plugin/preload/libsquall-preload.so")
    if not os.path.isfile(lib):
        sys.exit(f"bench.py: no {lib}; build it first")
    if os.geteuid() != 0:
        raise C.Skip("needs root (a network namespace and tc)")
    if subprocess.run(["/usr/bin/python3", "-c", "import horovod.torch"], capture_output=True).returncode:
        raise C.Skip("Horovod is not installed (tests/plugin/preload/horovod_test.py installs it)")
    rec = C.Record("horovod", vars_of(args), args.argv)
    ns = f"sqpre{os.getpid()}"
    C.run(["ip", "netns", "add", ns])
    results = {}
    try:
        C.run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"])
        for rate in args.rates or ["1gbit", "10gbit"]:
            bps = C.parse_rate(rate) / 8
            burst = max(int(bps / 1000), 65536)  # about 1 ms at the rate, at least one 64 KB frame
            C.run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", "lo", "root", "tbf", "rate",
                   rate, "burst", str(burst), "latency", "50ms"])
            for n in args.ranks or [2, 4]:
                for rep in range(args.repeats or 1):
                    for mode in ("off", "on"):
                        with tempfile.TemporaryDirectory() as work:
                            env = ["-x", "OMP_NUM_THREADS=1", "-x", f"SQUALL_PRELOAD_REPORT={work}/report"]
                            if mode == "on":  # the interposer's defaults unless --preload-env
                                env += ["-x", f"LD_PRELOAD={lib}"]
                                for kv in args.preload_env or []:
                                    env += ["-x", kv]
                            C.run(["ip", "netns", "exec", ns, "mpirun", "--allow-run-as-root", "--oversubscribe",
                                   "-np", str(n), "--mca", "pml", "ob1", "--mca", "btl", "self,tcp", "--mca",
                                   "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"] + env +
                                  ["/usr/bin/python3", os.path.join(C.ROOT, "tests/plugin/preload/horovod_train.py"),
                                   f"{work}/out.json", str(args.epochs), str(args.hidden)],
                                  out=os.path.join(out, f"{rate}_n{n}_{mode}_{rep}.log"))
                            r = json.loads(C.run(["/usr/bin/python3", "-c", HOROVOD_ROW, work], quiet=True)[1])
                        results.setdefault((rate, n, mode), []).append(r)
    finally:
        subprocess.run(["ip", "netns", "del", ns])
    table = []
    for (rate, n, mode), rs in results.items():
        cell = {"link": rate, "ranks": n, "interposer": mode, "hidden": args.hidden, "epochs": args.epochs}
        rec.add(f"interposer {mode}", cell, "step", "ms", [r["step_ms"] for r in rs])
        if mode == "on":
            rec.add("interposer on", cell, "sent_per_rank", "MB",
                    [r["bytes_sent"] / 1e6 for r in rs if r["bytes_sent"] is not None],
                    full_precision_mb=[r["bytes_full_precision"] / 1e6 for r in rs
                                       if r["bytes_full_precision"] is not None])
        off = results.get((rate, n, "off"))
        for i, r in enumerate(rs):
            speed = f"{off[i]['step_ms'] / r['step_ms']:.2f}x" if off else "-"
            sent = f"{r['bytes_sent'] / 1e6:.1f}" if mode == "on" and r["bytes_sent"] else "(all full precision)"
            full = f"{r['bytes_full_precision'] / 1e6:.1f}" if mode == "on" and r["bytes_full_precision"] else "-"
            table.append((rate, n, mode, f"{r['step_ms']:.1f}", sent, full, speed))
    tee(C.md_table(["link", "ranks", "interposer", "step ms", "MB sent / rank", "full-precision MB / rank",
                    "speed-up"], table), out, "table.md")
    return rec.finish(args.out)


# ---------------------------------------------------------- convergence

def cmd_convergence(args):
    """The optimizer study as a record: per task and method, the final
    held-out loss and the bytes each rank sent, one value per seed. Without
    --from it runs the study first (run_study.py, its options after --, its
    results in perf/convergence/results)."""
    src = args.from_dir or os.path.join(C.HERE, "convergence", "results")
    if not args.from_dir:
        os.environ.update(perf_env(args))
        C.run([sys.executable, os.path.join(C.HERE, "convergence", "run_study.py"), "--out", src]
              + args.study_args)
    with open(os.path.join(src, "results.json")) as f:
        study = json.load(f)
    rec = C.Record("convergence", vars_of(args), args.argv,
                   source=f"{os.path.relpath(os.path.join(src, 'results.json'), C.ROOT)} "
                          f"(perf/convergence/run_study.py; study parameters in its meta)")
    rec.data["params"]["study"] = {k: v for k, v in study["meta"]["args"].items() if k != "out"}
    groups = {}
    for r in study["runs"]:
        groups.setdefault((r["task"], r["method"]), []).append(r)
    for (task, method), rs in groups.items():
        metric = "val_loss" if "val_loss" in rs[0]["evals"][-1] else "test_loss"
        cell = {"task": task, "steps": rs[0]["steps"], "world": rs[0]["world"]}
        rec.add(method, cell, metric, "loss", [r["evals"][-1][metric] for r in rs],
                seeds=[r["seed"] for r in rs])
        rec.add(method, cell, "sent_per_rank", "bytes",
                [statistics.mean(r["bytes_per_rank_final"]) for r in rs])
    for task in dict.fromkeys(t for t, _ in groups):
        rows = [r for r in rec.data["rows"] if r["cell"]["task"] == task]
        loss = {r["series"]: r for r in rows if r["unit"] == "loss"}
        sent = {r["series"]: r for r in rows if r["metric"] == "sent_per_rank"}
        print(f"{task}:\n" + C.md_table(["method", "seeds", "final loss, median [range]", "MB sent / rank"],
                                       [(m, len(loss[m]["values"]), C.fmt_range(loss[m], 4),
                                         C.fmt_range(sent[m], 3, 1e-6)) for m in loss]))
    return rec.finish(args.out)


# ---------------------------------------------------------------- bound

# ---------------------------------------------------------------- bound

def cmd_bound(argv):
    """bound.py on saved files; --out DIR also writes the run record (the
    bound and its terms per cell, and the projection's rows)."""
    rest, out = list(argv[1:]), None
    if "--out" in rest:
        i = rest.index("--out")
        if i + 1 >= len(rest):
            sys.exit("bench.py bound: --out needs a directory")
        out = rest[i + 1]
        del rest[i:i + 2]
    result = boundlib.main(rest)
    rec = C.Record("bound", {"argv": rest}, argv, source="the codec_bench and squall_perf files in params.argv")
    bound_rows(rec, result)
    for b in result["rows"]:
        cell = {"link": b["link"], "ranks": b["ranks"], "bytes": b["bytes"]}
        rec.add("squall onebit, median of runs", cell, "time", "ms", [b["time_s"] * 1e3], runs=b["runs"])
    for p in result["projection"]:
        cell = {"link": f"{p['projected_rate_bps'] / 1e9:g}gbit (projected)",
                "ranks": p["ranks"], "bytes": p["bytes"], "codec_source": p["codec_source"]}
        rec.add("projected bound", cell, "time", "ms", [p["bound_s"] * 1e3], speedup=p["speedup"],
                break_even_bps=p["break_even_bps"])
    rec.finish(out)
    return 0


# ---------------------------------------------------------------- plots

DEFAULT_RECORDS = ["perf/results/links-idle/bench.json", "perf/results/fp-peers-links/bench.json",
                   "perf/results/ddp-hooks/bench/bench.json", "perf/results/convergence/bench.json"]


def cmd_plots(args):
    from benchlib import plots
    paths = args.records or [os.path.join(C.ROOT, p) for p in DEFAULT_RECORDS]
    records = [C.load(p) for p in paths]
    out = args.out or os.path.join(C.ROOT, "docs", "img")
    os.makedirs(out, exist_ok=True)
    for path in plots.render(records, out):
        print(f"bench.py: wrote {path}", file=sys.stderr)


# ----------------------------------------------------------- the parser

def vars_of(args):
    """The parameters of a record: paths inside the checkout relative to it,
    so that a record reads the same wherever the checkout lives."""
    skip = {"func", "argv", "_scratch", "study_args"}

    def rel(v):
        if isinstance(v, str) and os.path.isabs(v) and v.startswith(C.ROOT + os.sep):
            return os.path.relpath(v, C.ROOT)
        return v

    return {k: rel(v) for k, v in vars(args).items() if k not in skip and not k.startswith("_")}


def shared_parser():
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("shared options")
    g.add_argument("--build", default=os.path.join(C.ROOT, "build"),
                   help="build directory holding perf/ and plugin/ (default: build)")
    g.add_argument("--out", help="directory for raw files, tables and bench.json (default: print only)")
    g.add_argument("--from", dest="from_dir", metavar="DIR",
                   help="rebuild the record and tables from an earlier run's raw files, measuring nothing")
    g.add_argument("-b", help="smallest size (K, M, G suffixes)")
    g.add_argument("-e", help="largest size")
    g.add_argument("-f", type=float, help="size factor")
    g.add_argument("-n", "--iters", type=int, help="timed iterations per run")
    g.add_argument("-w", "--warmup", type=int, help="warmup iterations (ddp-hooks: warmup steps)")
    g.add_argument("--ranks", nargs="+", help="rank counts (2 4 or 2,4)")
    g.add_argument("--rates", nargs="+", help="link rates (1gbit 10gbit, 100mbit)")
    g.add_argument("--repeats", "--repeat", type=int, help="interleaved repeats of every cell")
    g.add_argument("--transport", choices=["tcp", "ucx"], help="Squall's transport (default tcp)")
    g.add_argument("--nice", type=int, help="run the benchmarks at this nice level (-15: ahead of other work)")
    return p


def parser():
    top = argparse.ArgumentParser(prog="perf/bench.py", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = top.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    shared = [shared_parser()]

    def add(name, func, help_text):
        p = sub.add_parser(name, parents=shared, help=help_text, description=help_text)
        p.set_defaults(func=func)
        return p

    p = add("codec", cmd_codec, "codec_bench: kernel rates (elements/s) per implementation and threads")
    p.add_argument("--impl", nargs="+", help="implementations (scalar avx2 avx512; default all the CPU has)")
    p.add_argument("--threads", nargs="+", help="codec thread counts")
    p.add_argument("--codecs", nargs="+", help="codecs (onebit int2 int4 int8; default all four)")
    p.add_argument("--summary", action="store_true", help="also print codec_bench's compact table")
    p.add_argument("--suite", action="store_true",
                   help="the whole codec section: calibration, paired implementations, threads, "
                        "the loopback allreduce per implementation and thread count, projection")

    p = add("allreduce", cmd_allreduce, "squall_perf on loopback: compressed vs the fp32 ring, same run")
    p.add_argument("--codec", default="onebit", help="codec spec (onebit, int8, fp16, onebit:block=256, ...)")
    p.add_argument("--variant", action="append",
                   help="NAME:VAR=VALUE[,VAR=VALUE]: a run with that environment (repeatable; interleaved)")
    p.add_argument("--no-baseline", action="store_true", help="skip the fp32 ring (--vs none)")

    p = add("links", cmd_links, "compressed vs fp32 on shaped links (root), with the bound")
    p.add_argument("--no-bound", action="store_true", help="skip the codec rates and the bound analysis")
    p.add_argument("--delay", help="added latency per link (netem, e.g. 100us)")

    p = add("load", cmd_load, "shaped links quiet and under a controlled load, several builds")
    p.add_argument("--builds", nargs="+", help="NAME=BUILD_DIR ... (default new=--build)")
    p.add_argument("--tcp-builds", nargs="+", help="builds to run over tcp (default all)")
    p.add_argument("--busy", type=int, default=2, help="busy-loop processes of the loaded condition")
    p.add_argument("--ucx", nargs="*", help="RANKS:RATE cells over ucx (default 4:1gbit; none: no args)")
    p.add_argument("--no-fp32", action="store_true", help="skip the fp32 ring")
    p.add_argument("--fp32-max", help="largest size of the fp32 ring (default -e)")
    p.add_argument("--first-repeat", type=int, default=1, help="number the repeats from here")

    p = add("hier", cmd_hier, "hierarchical vs flat compressed vs fp32, emulated hosts (root)")
    p.add_argument("--sizes", nargs="+", help="sizes (default 64M 256M)")
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--per-host", type=int, default=2, help="ranks per emulated host")

    p = add("peers", cmd_peers, "full precision: Squall vs gloo vs Open MPI, interleaved")
    p.add_argument("--link", nargs="+", default=["loopback"],
                   help="loopback, or rates (shaped, root): each is measured in turn")
    p.add_argument("--libs", nargs="+",
                   help="squall gloo mpi base squall:VAR=VALUE (default squall gloo mpi)")
    p.add_argument("--base-lib", help="directory of an earlier build's libsquall.so.0 (the 'base' library)")
    p.add_argument("--matrix", action="store_true", help="the whole full-precision matrix of the benchmarks page")

    p = add("nccl-net", cmd_nccl_net, "NCCL plugin net (TCP and UCX planes) vs raw TCP, shaped (root)")
    p.add_argument("--conns", nargs="+", help="connections (default 1 4)")
    p.add_argument("--mib", type=int, help="MiB per run (default 256 at 1gbit, else 1024)")

    p = add("nccl-collnet", cmd_nccl_collnet, "NCCL plugin CollNet iallreduce per codec, shaped (root)")
    p.add_argument("--codecs", nargs="+", help="default none bf16 fp16 int8")
    p.add_argument("--mib", type=int, help="MiB per call (default 64)")

    p = add("gpu-codec", cmd_gpu, "gpu_codec_bench: the CUDA codec kernels against a device copy")
    p.add_argument("--block", type=int, help="codec block (default 2048)")
    add("gpu-allreduce", cmd_gpu, "gpu_allreduce_bench: compressed allreduce of device buffers vs "
        "ncclAllReduce, ranks sharing one GPU (indicative)")

    from benchlib import ddp_hooks, ddp_quality
    p = add("ddp-hooks", cmd_ddp_hooks, "DDP hooks side by side on shaped links (root)")
    ddp_hooks.add_options(p)

    p = add("ddp-quality", cmd_ddp_quality, "the 1-bit DDP hook's loss against fp32, long runs (loopback)")
    ddp_quality.add_options(p)

    p = add("horovod", cmd_horovod, "Horovod job with and without libsquall-preload.so, shaped (root)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--hidden", type=int, default=256, help="the MLP's width (256: 77k parameters)")
    p.add_argument("--preload-env", nargs="*", metavar="NAME=VALUE",
                   help="variables for the interposed runs (default: none, its defaults)")

    p = add("convergence", cmd_convergence, "the optimizer study (run_study.py) as a record")
    p.add_argument("study_args", nargs=argparse.REMAINDER, help="after --: run_study.py's options")

    # Parsed by bound.py itself (main() hands it the arguments); listed here for -h.
    sub.add_parser("bound", help="bound analysis of saved codec_bench/squall_perf JSON "
                   "(perf/bench.py bound -h for its options)", add_help=False)

    p = sub.add_parser("plots", help="the figures of docs/benchmarks.md from records")
    p.add_argument("records", nargs="*", help="bench.json records (default: the committed ones)")
    p.add_argument("--out", help="directory for the PNGs (default docs/img)")
    p.set_defaults(func=cmd_plots)
    return top


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bound"]:  # bound.py's own options, which argparse cannot pass through
        return cmd_bound(argv)
    args = parser().parse_args(argv)
    args.argv = argv
    for name in ("ranks", "conns"):
        if getattr(args, name, None) is not None:
            setattr(args, name, listed(getattr(args, name), int))
    for name in ("rates", "impl", "threads", "sizes", "libs", "codecs", "builds", "tcp_builds", "ucx",
                 "link"):
        if getattr(args, name, None) is not None:
            setattr(args, name, listed(getattr(args, name)))
    if getattr(args, "study_args", None) and args.study_args[0] == "--":
        args.study_args = args.study_args[1:]
    try:
        args.func(args)
    except C.Skip as why:
        print(f"bench.py: skipped: {why}", file=sys.stderr)
        return C.SKIP
    except RuntimeError as e:
        print(f"bench.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
