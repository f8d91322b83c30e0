"""What keeps squall.ddp.onebit_hook at fp32's loss under momentum SGD.

2 CPU ranks (gloo + Squall TCP on 127.0.0.1, one torch thread each) train
two small model families on endless synthetic streams (so the held-out loss
measures optimisation, not over-fitting) with torch.optim.SGD(momentum=0.9)
for --steps steps, once per hook variant, for each --seeds seed; every
variant of one (family, seed) starts from the same weights and sees the same
batches. Reports the held-out loss at the last step and its gap to plain DDP
(fp32) of the same seed.

    perf/bench.py ddp-quality --steps 1000 --seeds 0 1 2 --out DIR

Families: "mlp" (a teacher-student classification, 32 -> 256 -> 256 -> 10,
labels drawn from the teacher's softmax) and "cnn" (12x12 images: class
templates shifted by up to 2 pixels plus noise, two conv layers and a
linear head, 10% of labels flipped). DDP puts each model in one bucket
(its first bucket takes 1 MB); --small-buckets caps every bucket at
0.05 MB, so that min_compress_numel has small buckets to act on.
"""

import datetime
import json
import os
import socket
import statistics
import tempfile
import time

torch = mp = None  # imported by run() and _worker(): bench.py builds its parser without torch


def _import_torch():
    global torch, mp
    import torch
    import torch.multiprocessing as mp

VARIANTS = {
    # name: OnebitState keyword arguments (None: plain DDP)
    "fp32": None,
    "grad_w100": dict(warmup_steps=100),
    "grad_w100_1d": dict(warmup_steps=100, keep_1d_full=True),
    "mom_w100": dict(warmup_steps=100, momentum=0.9),
    "mom_w100_1d": dict(warmup_steps=100, momentum=0.9, keep_1d_full=True),
    "mom_w100_b256": dict(warmup_steps=100, momentum=0.9, codec="onebit:block=256"),
    "mom_w100_rms": dict(warmup_steps=100, momentum=0.9, codec="onebit:scale=rms"),
    "mom_w100_small": dict(warmup_steps=100, momentum=0.9, min_compress_numel=16384),
    "mom_w10": dict(warmup_steps=10, momentum=0.9),
    "mom_w300": dict(warmup_steps=300, momentum=0.9),
    # plain DDP at 0.8 x lr: 1-bit with the mean-magnitude block scale shrinks
    # the update's norm (mean|x| <= rms(x)); is that all it does?
    "fp32_lr0.8": dict(lr_scale=0.8),
}
LR, MOMENTUM, BATCH = 0.05, 0.9, 32


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 10))


def _cnn():
    return torch.nn.Sequential(torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.MaxPool2d(2), torch.nn.Conv2d(16, 32, 3, padding=1),
                               torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                               torch.nn.Linear(32 * 9, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 10))


class _Task:
    def __init__(self, family, seed):
        self.family = family
        g = torch.Generator().manual_seed(10_000 + seed)
        if family == "mlp":
            self.t1 = torch.randn(32, 64, generator=g) / 32 ** 0.5
            self.t2 = torch.randn(64, 10, generator=g) * 3 / 64 ** 0.5
        else:
            self.templates = torch.randn(10, 1, 12, 12, generator=g)
        self.held = self.batch(torch.Generator().manual_seed(20_000 + seed), 2048)

    def model(self):
        return _mlp() if self.family == "mlp" else _cnn()

    def batch(self, g, n):
        if self.family == "mlp":
            x = torch.randn(n, 32, generator=g)
            logits = torch.tanh(x @ self.t1) @ self.t2
            y = torch.multinomial(torch.softmax(logits, 1), 1, generator=g).reshape(-1)
            return x, y
        y = torch.randint(0, 10, (n,), generator=g)
        x = self.templates[y]
        dx, dy = torch.randint(-2, 3, (2,), generator=g).tolist()
        x = torch.roll(x, (dx, dy), (2, 3)) + 1.5 * torch.randn(n, 1, 12, 12, generator=g)
        flip = torch.rand(n, generator=g) < 0.1
        y = torch.where(flip, torch.randint(0, 10, (n,), generator=g), y)
        return x, y


def _worker(rank, world, port, family, seed, steps, variants, out_dir, small_buckets):
    _import_torch()
    os.environ.update({"SQUALL_SOCKET_IFNAME": "lo", "SQUALL_TRANSPORT": "tcp",
                       "GLOO_SOCKET_IFNAME": "lo"})
    torch.set_num_threads(1)
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import squall
    import squall.ddp

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    squall.init()
    task = _Task(family, seed)
    results = {}
    for name in variants:
        torch.manual_seed(seed)
        model = task.model()
        if small_buckets:
            # DDP gives the first bucket (the last layers) 1 MB whatever the cap,
            # which holds these models whole; cap that one too.
            dist._DEFAULT_FIRST_BUCKET_BYTES = int(0.05 * 2 ** 20)
        ddp = DDP(model, bucket_cap_mb=0.05)
        state = None
        kwargs = dict(VARIANTS[name] or {})
        lr = LR * kwargs.pop("lr_scale", 1.0)
        if kwargs:
            state = squall.ddp.OnebitState(**kwargs)
            ddp.register_comm_hook(state, squall.ddp.onebit_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=MOMENTUM)
        curve = []
        t0 = time.monotonic()
        for step in range(1, steps + 1):
            g = torch.Generator().manual_seed(seed * 1_000_003 + step * 7 + rank)
            x, y = task.batch(g, BATCH)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
            if step % max(1, steps // 10) == 0 or step == steps:
                with torch.no_grad():
                    hx, hy = task.held
                    curve.append((step, torch.nn.functional.cross_entropy(model(hx), hy).item()))
        results[name] = {"loss": curve[-1][1], "curve": curve,
                         "s_per_step": (time.monotonic() - t0) / steps,
                         "counters": state.counters() if state else None}
        if state is not None:
            state.close()
        dist.barrier()
    if rank == 0:
        with open(os.path.join(out_dir, "r.json"), "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def summarize(rows, families, variants):
    """Markdown: per family, the median over seeds of the loss at the last step
    and of its gap to fp32 of the same seed (range over seeds), and the same
    for the mean of the last three evaluations (80%, 90%, 100% of the run),
    which averages out some of the step-to-step noise."""
    out = ["| variant | " + " | ".join(f"{f} loss | {f} gap [range] | {f} gap, last 3 evals"
                                       for f in families) + " |",
           "|---|" + "---|---|---|" * len(families)]
    base = {(r["family"], r["seed"]): r for r in rows if r["variant"] == "fp32"}
    for name in variants:
        line = f"| {name} |"
        for family in families:
            sel = [r for r in rows if r["variant"] == name and r["family"] == family]
            if not sel:
                line += " – | – | – |"
                continue
            gaps = [100 * r["gap"] for r in sel]
            tail = [100 * (statistics.mean(v for _, v in r["curve"][-3:]) /
                           statistics.mean(v for _, v in base[(family, r["seed"])]["curve"][-3:])
                           - 1) for r in sel]
            line += (f" {statistics.median(r['loss'] for r in sel):.4f} |"
                     f" {statistics.median(gaps):+.2f}% [{min(gaps):+.2f}, {max(gaps):+.2f}] |"
                     f" {statistics.median(tail):+.2f}% [{min(tail):+.2f}, {max(tail):+.2f}] |")
        out.append(line)
    return "\n".join(out)


def add_options(ap):
    """This study's own options (bench.py adds the shared --out: the results
    go to OUT/quality.json)."""
    ap.add_argument("--summarize", metavar="JSON", help="print the table of an earlier quality.json")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--families", nargs="+", default=["mlp", "cnn"])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--small-buckets", action="store_true",
                    help="cap DDP's first bucket at 0.05 MB too (else each model is one bucket)")


def run(args):
    """Trains every (family, seed, variant), or reads --summarize's file;
    prints the table and returns the rows (one per family, seed, variant)."""
    if args.summarize:
        with open(args.summarize) as f:
            rows = json.load(f)["rows"]
        fams = [f for f in args.families if any(r["family"] == f for r in rows)]
        names = [v for v in args.variants if any(r["variant"] == v for r in rows)]
        print(summarize(rows, fams, names))
        return rows
    if "fp32" not in args.variants:
        args.variants.insert(0, "fp32")
    _import_torch()
    rows = []
    t0 = time.monotonic()
    for family in args.families:
        for seed in args.seeds:
            with tempfile.TemporaryDirectory() as d:
                mp.start_processes(_worker, args=(2, _port(), family, seed, args.steps,
                                                  args.variants, d, args.small_buckets),
                                   nprocs=2, start_method="spawn")
                with open(os.path.join(d, "r.json")) as f:
                    res = json.load(f)
            base = res["fp32"]["loss"]
            for name, r in res.items():
                rows.append({"family": family, "seed": seed, "variant": name, **r,
                             "gap": r["loss"] / base - 1})
            print(f"[{time.monotonic() - t0:6.0f} s] {family} seed {seed}: " + ", ".join(
                f"{n} {r['loss']:.4f}" for n, r in res.items()), flush=True)
    print("\n" + summarize(rows, args.families, args.variants))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "quality.json"), "w") as f:
            json.dump({"steps": args.steps, "seeds": args.seeds, "lr": LR, "momentum": MOMENTUM,
                       "batch_per_rank": BATCH, "rows": rows}, f, indent=1)
    return rows
