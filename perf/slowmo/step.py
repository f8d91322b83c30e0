#!/usr/bin/env python3
"""SlowMo's step time on shaped links: local AdamW with no communication at
all (the floor), SlowMo syncing the whole model every tau steps (blocking),
streamed SlowMo (fragments on a staggered schedule, each sync overlapped
with the next `delay` inner steps), and data-parallel AdamW (gradients
averaged by gloo every step, for scale), all in one launch per link rate.

N ranks, each in its own network namespace behind a tc-shaped veth
(perf/links.sh, needs root), an MLP of --sizes (default 512-2048-2048-512-10,
6.3 M parameters), AdamW, batch --batch per rank, labels from a fixed random
teacher. Every variant starts from the same weights and sees the same
batches.

    perf/slowmo/step.py --python build/venv-torch/bin/python --ranks 2 \\
        --rates 100mbit 1gbit --tau 50 --fragments 5 --delay 4 \\
        --out perf/results/slowmo-step/r2

The variants take turns in each launch (after one warmup period each,
--rounds turns of --periods periods of tau steps), so a drift in the
machine's speed reaches all of them alike. Per cell: the mean step over the
turns (whole periods, so every period's syncs count once; a median would
hide them; a sync still in flight at the end of a turn is waited for there
and counted) of the slowest rank (the job's pace: ranks that do not
communicate drift apart, and a sync makes the faster wait), and for data-parallel AdamW the mean over --dp-steps steps;
bytes this rank put on its link per step (eth0's counters); loss of the
last step. OUT/summary.md has the table over repeats (medians, ranges).
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import linkrun  # noqa: E402

VARIANTS = ["compute", "slowmo", "streamed", "dp"]


def _labels(args):
    return {"compute": "local AdamW, no communication",
            "slowmo": f"SlowMo(AdamW, tau={args.tau}) (int4 syncs, blocking)",
            "streamed": f"SlowMo(AdamW, tau={args.tau}, fragments={args.fragments}, "
                        f"delay={args.delay})",
            "dp": "data-parallel AdamW (gloo fp32 allreduce every step)"}


def _worker(args):
    import datetime

    import torch
    import torch.distributed as dist

    import squall
    from squall.optim import SlowMo

    torch.set_num_threads(args.threads)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank = dist.get_rank()
    squall.init()
    sizes = args.sizes

    model, batch = linkrun.teacher_mlp(torch, sizes, args.batch, rank)

    # Every variant keeps its model and optimizer for the whole launch, and the
    # variants take turns, `periods` periods of tau steps each per round, so
    # a drift in the machine's speed reaches all of them alike. A sync still
    # in flight when a variant's turn ends is waited for there, and the wait
    # counts in that variant's last step.
    state = {}
    for name in args.variants:
        net = model()
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
        if name == "slowmo":
            opt = SlowMo(opt, tau=args.tau)
        elif name == "streamed":
            opt = SlowMo(opt, tau=args.tau, fragments=args.fragments, delay=args.delay)
        state[name] = {"net": net, "opt": opt, "step": 0, "times": [], "sent": [], "loss": None,
                       "tcp": {}}

    def turn(name, steps):
        st = state[name]
        net, opt = st["net"], st["opt"]
        dist.barrier()
        tcp0 = linkrun.tcp_counters()
        for _ in range(steps):
            st["step"] += 1
            x, y = batch(st["step"])
            b0 = linkrun.eth0_tx_bytes()
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(x), y)
            loss.backward()
            if name == "dp":
                for p in net.parameters():
                    dist.all_reduce(p.grad)
                    p.grad.div_(dist.get_world_size())
            opt.step()
            st["times"].append(time.perf_counter() - t0)
            st["sent"].append(linkrun.eth0_tx_bytes() - b0)
            st["loss"] = float(loss.detach())
        t0 = time.perf_counter()
        if hasattr(opt, "_wait_in_flight"):
            opt._wait_in_flight()  # finished now, merged at its own step later
        st["times"][-1] += time.perf_counter() - t0
        for k, v in linkrun.tcp_counters().items():  # this rank's namespace, this turn
            st["tcp"][k] = st["tcp"].get(k, 0) + v - tcp0.get(k, 0)

    for name in args.variants:  # warmup: one period each, not counted
        turn(name, args.dp_steps if name == "dp" else args.tau)
    for rnd in range(args.rounds):
        for name in args.variants:
            if name != "dp" or rnd == 0:
                turn(name, args.dp_steps if name == "dp" else args.tau * args.periods)
    # The job's pace is its slowest rank's: ranks that never communicate
    # drift apart (one rank of two measured 54 ms a step here while the
    # other took 42), and a sync makes the faster wait. So each variant's
    # step is the largest of the ranks' mean steps, the no-communication
    # floor included; every rank's is kept.
    means = {name: 1e3 * statistics.mean(state[name]["times"][args.dp_steps if name == "dp"
                                                               else args.tau:])
             for name in args.variants}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, means)
    results = {}
    for name in args.variants:
        st = state[name]
        skip = args.dp_steps if name == "dp" else args.tau
        results[name] = {"step_ms": max(m[name] for m in every),
                         "rank_step_ms": [round(m[name], 2) for m in every],
                         "sent": statistics.mean(st["sent"][skip:]), "loss": st["loss"],
                         "max_ms": 1e3 * max(st["times"][skip:]),
                         "times_ms": [round(1e3 * t, 2) for t in st["times"]], "tcp": st["tcp"]}
        if rank == 0:
            print(f"  {name}: mean step {results[name]['step_ms']:.1f} ms, "
                  f"{results[name]['sent'] / 1e3:.1f} kB/step, ranks {results[name]['rank_step_ms']} "
                  f"ms, tcp {st['tcp']}", file=sys.stderr,
                  flush=True)
    if rank == 0:
        with open(args.worker_out, "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


def summary(args, runs):
    table = {}
    for rate, _, res in runs:
        for name, r in res.items():
            table.setdefault((name, rate), []).append(r)
    labels = _labels(args)
    lines = [f"{args.ranks} ranks, MLP {'-'.join(map(str, args.sizes))}, batch {args.batch}; "
             f"mean step over {args.rounds} turns of {args.periods} periods of {args.tau} steps, "
             f"the variants taking turns (data-parallel: {args.dp_steps} steps); median [range] "
             f"over {args.repeats} launches; ratio to "
             "the no-communication step of the same launch; bytes this rank put on its link "
             "per step", "",
             "| variant | " + " | ".join(f"{r} step ms | {r} vs no comm" for r in args.rates)
             + " | bytes/step |",
             "|---|" + "---|---|" * len(args.rates) + "---|"]
    for name in args.variants:
        row = f"| {labels[name]} |"
        sent = []
        for rate in args.rates:
            cells = table.get((name, rate), [])
            base = {id(c): c for c in table.get(("compute", rate), [])}
            if not cells:
                row += " – | – |"
                continue
            st = [c["step_ms"] for c in cells]
            ratios = [c["step_ms"] / b["step_ms"] for c, b in
                      zip(cells, table.get(("compute", rate), []))] if base else []
            rr = (f"{statistics.median(ratios):.3f} [{min(ratios):.3f}–{max(ratios):.3f}]"
                  if ratios else "–")
            row += f" {statistics.median(st):.1f} [{min(st):.1f}–{max(st):.1f}] | {rr} |"
            sent += [c["sent"] for c in cells]
        row += f" {statistics.median(sent) / 1e3:.1f} kB |" if sent else " – |"
        lines.append(row)
    text = "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(text)


def measure(args):
    return linkrun.measure(args, __file__, lambda order: [
        "--variants", *order, "--tau", str(args.tau), "--periods", str(args.periods),
        "--rounds", str(args.rounds),
        "--fragments", str(args.fragments), "--delay", str(args.delay),
        "--dp-steps", str(args.dp_steps), "--batch", str(args.batch),
        "--threads", str(args.threads), "--sizes", *map(str, args.sizes)])


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=sys.executable, help="a Python with torch")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rates", nargs="+", default=["100mbit", "1gbit"])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    ap.add_argument("--tau", type=int, default=50)
    ap.add_argument("--periods", type=int, default=2, help="periods per variant per round")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--fragments", type=int, default=5)
    ap.add_argument("--delay", type=int, default=4)
    ap.add_argument("--dp-steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--sizes", type=int, nargs="+", default=[512, 2048, 2048, 512, 10])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", help="where the runs and summary.md go (required)")
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    ap.add_argument("--from-dir", action="store_true", help="only the table, from OUT's runs")
    args = ap.parse_args()
    if args.worker_out:
        return _worker(args)
    if not args.out:
        ap.error("--out is required")
    summary(args, linkrun.load(args.out) if args.from_dir else measure(args))


if __name__ == "__main__":
    main()
