#!/usr/bin/env python3
"""FSDP2 step time on shaped links: plain FSDP2 (gloo fp32), FSDP2 with a
bf16 reduce (MixedPrecisionPolicy(reduce_dtype=bfloat16)), squall.fsdp's
compressed reduce-scatter alone and with quantized parameter all-gathers,
and the same model's compute-only step (one rank's batch, no communication),
all in one launch per link rate.

N ranks, each in its own network namespace behind a tc-shaped veth
(perf/links.sh, needs root), the 14.7 M-parameter MLP 1024-4096-2048-1024-10,
fully_shard per Linear and at the root, AdamW, batch 8 per rank, labels from
a fixed random teacher. Every variant of a launch starts from the same
weights and sees the same batches; the variants run one after the other, in
an order rotated from repeat to repeat, and the rates alternate.

    perf/fsdp/step.py --python build/venv-torch/bin/python --ranks 2 \\
        --rates 1gbit 10gbit --repeats 2 --out perf/results/fsdp-step/r2

HSDP (--ranks-per-host K, the hsdp_* variants): K ranks share each emulated
host's shaped link and reach each other over its loopback, as the ranks of
one machine do; the model is sharded within each host and replicated across
hosts (a (hosts, K) mesh, "replicate" x "shard"). hsdp_fp32 is FSDP2 over
that 2-D mesh (its cross-host all-reduce in fp32 over gloo); hsdp_squall
shards over the "shard" dimension alone and squall.fsdp.compress(codec=None,
replicas=..., replicas_codec="int4:block=256") averages each module's
gradient shard across the hosts through Squall, the reduce-scatter inside
the host left FSDP's; hsdp_squall_all compresses those too (int4:block=256
reduce-scatter and parameter gathers). Only the inter-host bytes reach the
counted link.

    perf/fsdp/step.py --python build/venv-torch/bin/python --ranks 4 \\
        --ranks-per-host 2 --rates 1gbit --variants hsdp_fp32 hsdp_squall hsdp_squall_all compute \\
        --out perf/results/fsdp-step/hsdp

Per cell: the median step after the warmup (squall's variants average at
full precision for --warmup steps; the first 2 steps after it are left out),
the bytes this rank put on its link per step (eth0's counters: payload plus
TCP/IP headers) and the loss of the last step. OUT/summary.md is the table
over repeats (medians, ranges in brackets).
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import linkrun  # noqa: E402

INT4, INT8 = "int4:block=256", "int8:block=256"
ALONE = {"overlap": False, "reuse_gathers": False}  # each gather in FSDP's call, again in backward
HSDP_ACROSS = {"replicas": True, "replicas_codec": INT4}  # the "replicate" group, at run time

# name: (label, layout, squall.fsdp.compress's options or None for FSDP's own
# collectives). layout: None (no FSDP: the compute-only step), "world" (every
# rank one shard group), "keep" (reshard_after_forward=False), "bf16" (a bf16
# reduce), "hsdp" (the (hosts, ranks per host) mesh), "host" (its "shard"
# dimension alone).
VARIANTS = {
    "fp32": ("FSDP2 (gloo fp32)", "world", None),
    "fp32_keep": ("FSDP2 (gloo fp32), reshard_after_forward=False", "keep", None),
    "bf16_reduce": ("FSDP2, bf16 reduce", "bf16", None),
    "squall": ("squall.fsdp (int4:block=256 reduce-scatter)", "world",
               {"params": None, "overlap": True, "reuse_gathers": False}),
    "squall_int8_params_inline": (
        "squall.fsdp + int8:block=256 parameter gathers, each in FSDP's call (overlap=False), "
        "gathered again in backward (reuse_gathers=False)", "world", {"params": INT8, **ALONE}),
    "squall_int8_params": (
        "squall.fsdp + int8:block=256 parameter gathers, overlapped, gathered again in backward",
        "world", {"params": INT8, "overlap": True, "reuse_gathers": False}),
    "squall_int4_params_inline": (
        "squall.fsdp + int4:block=256 parameter gathers, each in FSDP's call (overlap=False), "
        "gathered again in backward (reuse_gathers=False)", "world", {"params": INT4, **ALONE}),
    "squall_int4_params": (
        "squall.fsdp + int4:block=256 parameter gathers, overlapped, gathered again in backward",
        "world", {"params": INT4, "overlap": True, "reuse_gathers": False}),
    "squall_int4_params_reuse": (
        "squall.fsdp + int4:block=256 parameter gathers, each in FSDP's call, backward reusing "
        "forward's (reuse_gathers)", "world",
        {"params": INT4, "overlap": False, "reuse_gathers": True}),
    "squall_int4_params_keep": (
        "squall.fsdp + int4:block=256 parameter gathers, reshard_after_forward=False (no "
        "gathers in backward)", "keep", {"params": INT4, **ALONE}),
    "compute": ("compute only (no communication)", None, None),
    "hsdp_fp32": ("HSDP: FSDP2 over the (hosts, ranks per host) mesh, fp32 all-reduce across "
                  "hosts", "hsdp", None),
    "hsdp_squall": ("HSDP: FSDP2 within each host, squall int4:block=256 all-reduce across "
                    "hosts", "host", {"codec": None, "params": None, **HSDP_ACROSS}),
    "hsdp_squall_all": ("HSDP: as above, and the host's reduce-scatter and parameter gathers "
                        "int4:block=256 too", "host",
                        {"codec": INT4, "params": INT4, **HSDP_ACROSS}),
}
SIZES = [1024, 4096, 2048, 1024, 10]


def _worker(args):
    import datetime

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    import squall.fsdp

    torch.set_num_threads(args.threads)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank = dist.get_rank()

    model, batch = linkrun.teacher_mlp(torch, SIZES, args.batch, rank)
    mesh = None
    if any(VARIANTS[name][1] in ("hsdp", "host") for name in args.variants):
        from torch.distributed.device_mesh import init_device_mesh
        hosts = dist.get_world_size() // args.ranks_per_host
        mesh = init_device_mesh("cpu", (hosts, args.ranks_per_host),
                                mesh_dim_names=("replicate", "shard"))
    layouts = {"world": {}, "keep": {"reshard_after_forward": False},
               "bf16": {"mp_policy": MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)},
               "hsdp": {"mesh": mesh}, "host": {"mesh": mesh["shard"] if mesh else None}}

    results = {}
    for name in args.variants:
        _, layout, options = VARIANTS[name]
        net = model()
        compressed = None
        if layout is not None:
            for layer in net:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, **layouts[layout])
            fully_shard(net, **layouts[layout])
        if options is not None:
            options = dict(options)
            if options.get("replicas"):
                options["replicas"] = mesh["replicate"].get_group()
            compressed = squall.fsdp.compress(net, warmup=args.warmup, **options)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
        times, parts, sent, loss = [], [], [], None
        for step in range(1, args.steps + 1):
            x, y = batch(step)
            b0 = linkrun.eth0_tx_bytes()
            t0, c0 = time.perf_counter(), time.process_time()
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(x), y)
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - t0)
            # forward, backward, optimizer; and the CPU time of all the
            # process's threads (its codec and communication threads too)
            parts.append((t1 - t0, t2 - t1, times[-1] - (t2 - t0), time.process_time() - c0))
            sent.append(linkrun.eth0_tx_bytes() - b0)
        results[name] = {"times": times, "parts": parts, "sent": sent, "loss": float(loss),
                         "stats": compressed.stats if compressed is not None else None}
        if rank == 0:
            f, b, o, cpu = (1e3 * statistics.median(p[i] for p in parts[1:]) for i in range(4))
            print(f"  {name}: step median {1e3 * statistics.median(times[1:]):.0f} ms (forward "
                  f"{f:.0f}, backward {b:.0f}, optimizer {o:.0f}; CPU {cpu:.0f})", file=sys.stderr,
                  flush=True)
        del net, opt
        dist.barrier()
    if rank == 0:
        with open(args.worker_out, "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


def _cell(r, warmup):
    after = slice(warmup + 2, None)
    cell = {"step_ms": 1e3 * statistics.median(r["times"][after]),
            "sent": statistics.median(r["sent"][after]), "loss": r["loss"]}
    if "parts" in r:  # the process's CPU time per step (all its threads)
        cell["cpu_ms"] = 1e3 * statistics.median(p[3] for p in r["parts"][after])
    return cell


def summary(args, runs):
    # the ratio column's baseline: plain FSDP2, or native HSDP in an HSDP launch
    baseline = "fp32" if "fp32" in args.variants or "hsdp_fp32" not in args.variants \
        else "hsdp_fp32"
    table, to_compute = {}, {}
    for rate, _, res in runs:
        # the step over the same launch's compute-only step
        floor = _cell(res["compute"], args.warmup)["step_ms"] if "compute" in res else None
        for name, r in res.items():
            cell = _cell(r, args.warmup)
            table.setdefault((name, rate), []).append(cell)
            if floor is not None:
                to_compute.setdefault((name, rate), []).append(cell["step_ms"] / floor)
    vs = "compute" in args.variants
    link = ("bytes this rank put on its link per step" if args.ranks_per_host == 1 else
            f"bytes each host ({args.ranks_per_host} ranks) put on its link per step")
    lines = [f"{args.ranks} ranks; {args.steps} steps, squall's warmup {args.warmup}; step ms "
             f"median [range] over the repeats; {link}; CPU: "
             "the rank process's CPU time per step (every thread), median over rates and repeats"
             + ("; vs compute: each launch's step over its own compute-only step, median [range]"
                if vs else ""),
             "",
             "| variant | " + " | ".join(f"{r} step | {r} vs {baseline}"
                                       + (f" | {r} vs compute" if vs else "") for r in args.rates)
             + " | bytes/step | CPU ms/step | last loss |",
             "|---|" + ("---|---|---|" if vs else "---|---|") * len(args.rates) + "---|---|---|"]
    for name in args.variants:
        row = f"| {VARIANTS[name][0]} |"
        cells_all = []
        for rate in args.rates:
            cells = table.get((name, rate), [])
            base = table.get((baseline, rate), [])
            cells_all += cells
            st = [c["step_ms"] for c in cells]
            if cells:
                ratio = (statistics.median([c["step_ms"] for c in base]) / statistics.median(st)
                         if base else float("nan"))
                row += f" {statistics.median(st):.0f} [{min(st):.0f}–{max(st):.0f}] | {ratio:.2f}x |"
            else:
                row += " – | – |"
            if vs:
                q = to_compute.get((name, rate), [])
                row += (f" {statistics.median(q):.2f}x [{min(q):.2f}–{max(q):.2f}] |" if q
                        else " – |")
        sent = statistics.median([c["sent"] for c in cells_all]) if cells_all else 0
        loss = statistics.median([c["loss"] for c in cells_all]) if cells_all else float("nan")
        cpu = [c["cpu_ms"] for c in cells_all if "cpu_ms" in c]
        row += f" {sent / 1e6:.2f} MB | {statistics.median(cpu) if cpu else float('nan'):.0f} |"
        row += f" {loss:.4f} |"
        lines.append(row)
    text = "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(text)


def measure(args):
    return linkrun.measure(args, __file__, lambda order: [
        "--variants", *order, "--steps", str(args.steps), "--warmup", str(args.warmup),
        "--batch", str(args.batch), "--threads", str(args.threads)])


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=sys.executable, help="a Python with torch >= 2.9")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--ranks-per-host", type=int, default=1,
                    help="ranks sharing each emulated host's link (the hsdp_* variants' shard "
                         "group)")
    ap.add_argument("--rates", nargs="+", default=["1gbit", "10gbit"])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", help="where the runs and summary.md go (required)")
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    ap.add_argument("--from-dir", action="store_true", help="only the table, from OUT's runs")
    args = ap.parse_args()
    if args.worker_out:
        return _worker(args)
    if not args.out:
        ap.error("--out is required")
    if any(VARIANTS[v][1] in ("hsdp", "host") for v in args.variants) and not (
            1 < args.ranks_per_host < args.ranks and args.ranks % args.ranks_per_host == 0):
        ap.error("the hsdp_* variants need --ranks-per-host K, 1 < K < --ranks, dividing "
                 "--ranks (K ranks per host share a shard group; the hosts are the replicas)")
    runs = linkrun.load(args.out) if args.from_dir else measure(args)
    summary(args, runs)


if __name__ == "__main__":
    main()
