"""DDP communication hooks side by side on shaped links: plain DDP (gloo
fp32), torch's fp16 and PowerSGD (rank 1 and 4) hooks, Squall's onebit and
int8 hooks.

2 ranks, each in its own network namespace behind a tc-shaped veth
(perf/links.sh, needs root), a 14.7 M-parameter MLP, torch.optim.SGD with
momentum 0.9, --steps steps per hook. Every hook of one run starts from the
same weights and sees the same batches; the hooks run one after the other
inside one launch, in an order rotated from repeat to repeat, and the link
rates alternate within each repeat, so that load from elsewhere on the
machine hits every cell alike.

    perf/bench.py ddp-hooks --rates 1gbit 10gbit --repeats 3 --out DIR

Per cell: the median step time after the compressed hooks' warmup (the
first 2 steps after the switch left out), the median warmup step (steps 2 to
--warmup), the bytes this rank put on its link per step (the namespace's
eth0 counters: payload plus TCP/IP headers, whatever the library), and the
held-out loss at the last step. DIR/summary.md is the table over repeats
(medians, ranges in brackets).
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

HOOKS = ["ddp", "fp16", "psgd1", "psgd4", "onebit", "int8"]
LABELS = {"ddp": "plain DDP (gloo fp32)", "fp16": "torch fp16 hook",
          "psgd1": "torch PowerSGD rank 1", "psgd4": "torch PowerSGD rank 4",
          "onebit": "Squall onebit hook", "int8": "Squall int8 hook"}
ISSUE_SIZES = "1024,4096,2048,1024,10"  # 14.69 M parameters, the issue's model


def _net_bytes():
    with open("/sys/class/net/eth0/statistics/tx_bytes") as f:
        tx = int(f.read())
    with open("/sys/class/net/eth0/statistics/rx_bytes") as f:
        return tx, int(f.read())


def _serialised(hook):
    """torch 1.13's PowerSGD hook chains its allreduces in future callbacks that
    run on gloo's threads; when the two ranks' callbacks interleave their
    buckets differently, gloo pairs unrelated collectives and aborts
    ("op.preamble.length <= op.nbytes"). This wrapper waits for each bucket
    before DDP gets the next one, so every rank issues the same collectives in
    the same order (at the price of PowerSGD's overlap with backward)."""

    def serialised_powerSGD_hook(state, bucket):
        fut = hook(state, bucket)
        fut.wait()
        return fut

    return serialised_powerSGD_hook


def _worker(args):
    import torch

    torch.set_num_threads(args.threads)
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP

    import squall
    import squall.ddp

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    squall.init(transport="tcp")
    rank = dist.get_rank()

    sizes = [int(v) for v in args.sizes.split(",")]

    def model():
        torch.manual_seed(1)
        layers = []
        for a, b in zip(sizes, sizes[1:]):
            layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers[:-1])

    torch.manual_seed(7)  # the same teacher on every rank and in every launch
    teacher = torch.nn.Linear(sizes[0], sizes[-1])
    torch.nn.init.normal_(teacher.weight, std=3 / sizes[0] ** 0.5)

    def batch(g, n):
        x = torch.randn(n, sizes[0], generator=g)
        with torch.no_grad():
            p = torch.softmax(teacher(x), 1)
        return x, torch.multinomial(p, 1, generator=g).reshape(-1)

    held = batch(torch.Generator().manual_seed(99), 1024)
    results = {}
    for name in args.hooks:
        m = model()
        ddp = DDP(m)
        state = None
        if name == "fp16":
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif name.startswith("psgd"):
            state = psgd.PowerSGDState(process_group=None,
                                       matrix_approximation_rank=int(name[4:]),
                                       start_powerSGD_iter=args.warmup)
            hook = psgd.powerSGD_hook if args.psgd_raw else _serialised(psgd.powerSGD_hook)
            ddp.register_comm_hook(state, hook)
        elif name in ("onebit", "int8"):
            state = squall.ddp.OnebitState(warmup_steps=args.warmup,
                                           codec="onebit" if name == "onebit" else "int8",
                                           momentum=0.9)
            ddp.register_comm_hook(state, squall.ddp.onebit_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
        times, net = [], []
        for step in range(1, args.steps + 1):
            x, y = batch(torch.Generator().manual_seed(1000 * step + rank), args.batch)
            b0 = _net_bytes()
            t0 = time.perf_counter()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
            times.append(time.perf_counter() - t0)
            b1 = _net_bytes()
            net.append((b1[0] - b0[0], b1[1] - b0[1]))
        with torch.no_grad():
            loss = torch.nn.functional.cross_entropy(m(held[0]), held[1]).item()
        results[name] = {"times": times, "net": net, "loss": loss,
                         "counters": state.counters() if hasattr(state, "counters") else None}
        if rank == 0:
            print(f"  {name}: step median {1e3 * statistics.median(times[1:]):.0f} ms, "
                  f"loss {loss:.4f}", file=sys.stderr, flush=True)
        if hasattr(state, "close"):
            state.close()
        del ddp, opt
        dist.barrier()
    if rank == 0:
        with open(args.worker_out, "w") as f:
            json.dump(results, f)
    dist.barrier()
    squall.shutdown()
    dist.destroy_process_group()


def _median(xs):
    return statistics.median(xs) if xs else float("nan")


def _cell(r, warmup):
    t = r["times"]
    after = t[warmup + 2:]
    warm = t[1:warmup]
    tx = _median([n[0] for n in r["net"][warmup + 2:]])
    return {"step_ms": 1e3 * _median(after), "warm_ms": 1e3 * _median(warm),
            "tx_bytes": tx, "loss": r["loss"]}


def _fmt_bytes(b):
    return f"{b / 1e6:.2f} MB" if b >= 1e6 else f"{b / 1e3:.0f} kB"


def add_options(ap):
    """This benchmark's own options (bench.py adds the shared --rates,
    --repeats, -w/--warmup and --out)."""
    ap.add_argument("--hooks", nargs="+", default=HOOKS, choices=HOOKS)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--sizes", default=ISSUE_SIZES, help="the MLP's layer widths")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--first-repeat", type=int, default=0,
                    help="number the repeats from here (to add repeats to an earlier --out)")
    ap.add_argument("--psgd-raw", action="store_true",
                    help="register torch's PowerSGD hook unwrapped (see _serialised)")


def _worker_main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker-out", required=True)
    ap.add_argument("--warmup", type=int, required=True)
    add_options(ap)
    _worker(ap.parse_args(argv))


def load_runs(args):
    """The <rate>_<repeat>.json of an earlier run in args.out."""
    runs = []
    for rate in args.rates:
        for rep in range(args.first_repeat + args.repeats):
            path = os.path.join(args.out, f"{rate}_{rep}.json")
            if os.path.exists(path):
                with open(path) as f:
                    runs.append((rate, rep, json.load(f)))
    return runs


def measure(args):
    """Every repeat and rate once (the hooks of a launch in rotated order);
    returns the runs that completed."""
    os.makedirs(args.out, exist_ok=True)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runs = []
    with open(os.path.join(args.out, "machine.txt"), "w") as f:
        f.write(subprocess.run(["sh", "-c", "date; uptime; nproc"], capture_output=True,
                               text=True).stdout)
    for rep in range(args.first_repeat, args.first_repeat + args.repeats):
        k = rep % len(args.hooks)
        order = args.hooks[k:] + args.hooks[:k]
        rates = args.rates if rep % 2 == 0 else args.rates[::-1]
        for rate in rates:
            path = os.path.join(args.out, f"{rate}_{rep}.json")
            cmd = [os.path.join(here, "links.sh"), "--rate", rate, "--ranks", "2", "--",
                   sys.executable, os.path.abspath(__file__), "--worker-out", path,
                   "--hooks", *order, "--steps", str(args.steps), "--warmup", str(args.warmup),
                   "--batch", str(args.batch), "--sizes", args.sizes, "--lr", str(args.lr),
                   "--threads", str(args.threads)] + (["--psgd-raw"] if args.psgd_raw else [])
            t0 = time.monotonic()
            rc = subprocess.run(cmd).returncode
            if rc == 77:
                return None
            print(f"repeat {rep} {rate}: rc {rc}, {time.monotonic() - t0:.0f} s, order "
                  f"{' '.join(order)}", flush=True)
            if rc != 0:
                continue
            with open(path) as f:
                runs.append((rate, rep, json.load(f)))
    return runs


def rows(args, runs):
    """The cells of the runs as (hook, rate, metric, unit, values) per repeat."""
    out = []
    for name in args.hooks:
        for rate in args.rates:
            cells = [_cell(res[name], args.warmup) for r, _, res in runs if r == rate and name in res]
            if not cells:
                continue
            for metric, unit, key in (("step", "ms", "step_ms"), ("warmup_step", "ms", "warm_ms"),
                                      ("tx_per_step", "bytes", "tx_bytes"),
                                      ("loss", "loss", "loss")):
                out.append((LABELS[name], {"hook": name, "link": rate}, metric, unit,
                            [c[key] for c in cells]))
    return out


def _summary(args, runs):
    table = {}
    for rate, rep, res in runs:
        for name, r in res.items():
            c = _cell(r, args.warmup)
            c["loss_gap"] = (r["loss"] / res["ddp"]["loss"] - 1) if "ddp" in res else float("nan")
            table.setdefault((name, rate), []).append(c)
    counts = ", ".join(f"{rate} x{sum(1 for r, _, _ in runs if r == rate)}" for rate in args.rates)
    lines = [f"runs per rate: {counts}; {args.steps} steps, warmup {args.warmup}, batch "
             f"{args.batch}/rank; step ms median [range]; warmup-step ms median",
             "", "| hook | " + " | ".join(f"{r} step | {r} warmup step" for r in args.rates)
             + " | bytes/step | loss | loss vs DDP, same launch |",
             "|---|" + "---|---|" * len(args.rates) + "---|---|---|"]
    for name in args.hooks:
        row = f"| {LABELS[name]} |"
        cells_all = []
        for rate in args.rates:
            cells = table.get((name, rate), [])
            cells_all += cells
            st = [c["step_ms"] for c in cells]
            wm = [c["warm_ms"] for c in cells]
            row += (f" {_median(st):.0f} [{min(st):.0f}–{max(st):.0f}] | {_median(wm):.0f} |"
                    if cells else " – | – |")
        row += (f" {_fmt_bytes(_median([c['tx_bytes'] for c in cells_all]))} |"
                f" {_median([c['loss'] for c in cells_all]):.3f} |"
                f" {100 * _median([c['loss_gap'] for c in cells_all]):+.1f}% |"
                ) if cells_all else " – | – | – |"
        lines.append(row)
    text = "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(text)
    return text


if __name__ == "__main__":  # one rank of a launch (bench.py ddp-hooks starts it)
    _worker_main(sys.argv[1:])
