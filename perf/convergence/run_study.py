#!/usr/bin/env python3
"""Convergence study: Adam vs APMSqueeze vs naive 1-bit vs SlowMo vs Local SGD.

Spawns `--world` CPU ranks (torch.multiprocessing, gloo on 127.0.0.1, one
torch thread each) that join one Squall communicator and run, for every task
and seed, the five methods in turn on the same model init, data order and LR
schedule. Each rank trains on a disjoint shard of every global batch.

Writes perf/convergence/results/results.json (all curves and finals) and
PNG plots (loss vs step, loss vs bytes sent per rank) per task.

    SQUALL_LIBRARY=$PWD/build/src/core/libsquall.so PYTHONPATH=$PWD/python \\
        python3 perf/convergence/run_study.py            # full study
    ... run_study.py --quick                               # smoke test (minutes)
    ... run_study.py --plots-only                          # replot results.json
"""

import argparse
import datetime
import json
import math
import os
import socket
import sys
import time

import torch
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
METHODS = ["adam", "apmsqueeze", "naive_onebit", "slowmo_adam", "local_sgd"]
LABELS = {
    "adam": "Adam (full precision)",
    "apmsqueeze": "APMSqueeze (1-bit, 15% warmup)",
    "naive_onebit": "naive 1-bit EF grads + Adam",
    "slowmo_adam": "SlowMo over local Adam (tau=12)",
    "local_sgd": "Local SGD (tau=12)",
}
ENV = {
    "SQUALL_SOCKET_IFNAME": "lo",
    "SQUALL_TRANSPORT": "tcp",
    "SQUALL_TIMEOUT_S": "120",
    "GLOO_SOCKET_IFNAME": "lo",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


# ---------------------------------------------------------------- tasks ----

class DigitsTask:
    """sklearn's 8x8 digits, fixed 80/20 split (random_state=0), MLP 64-128-10."""
    name = "digits"

    def __init__(self, args):
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
        d = load_digits()
        x = torch.tensor(d.data, dtype=torch.float32) / 16.0
        y = torch.tensor(d.target, dtype=torch.int64)
        idx = torch.arange(len(y)).numpy()
        tr, te = train_test_split(idx, test_size=0.2, random_state=0, stratify=d.target)
        self.dropped = []
        if args.digits_drop_constant:
            # pixels that are 0 in every training image give exactly-zero weight
            # gradients, hence a frozen variance of 0 in APMSqueeze (see docs)
            keep = x[tr].std(0) > 0
            self.dropped = torch.nonzero(~keep).view(-1).tolist()
            x = x[:, keep]
        self.nin = x.shape[1]
        self.xtr, self.ytr = x[tr], y[tr]
        self.xte, self.yte = x[te], y[te]
        self.batch = args.digits_batch
        self.lr = {"adam": args.digits_lr, "sgd": args.digits_sgd_lr}

    def model(self):
        return torch.nn.Sequential(torch.nn.Linear(self.nin, 128), torch.nn.ReLU(),
                                   torch.nn.Linear(128, 10))

    def batch_for(self, seed, step, rank, world):
        """The global batch of `step` (the same on every rank), then this rank's shard."""
        n = len(self.ytr)
        per_epoch = n // self.batch
        epoch, i = divmod(step, per_epoch)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + epoch))
        gb = perm[i * self.batch:(i + 1) * self.batch]
        mine = gb[rank::world]
        return self.xtr[mine], self.ytr[mine]

    def loss(self, model, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(model(x), y)

    @torch.no_grad()
    def evaluate(self, model):
        out = model(self.xte)
        return {"test_loss": float(torch.nn.functional.cross_entropy(out, self.yte)),
                "test_acc": float((out.argmax(1) == self.yte).float().mean()) * 100.0}


class CharLMTask:
    """Character-level LM on the (deduplicated) texts of /usr/share/common-licenses:
    last 10% of the concatenation is validation. 1-layer GRU, embedding 32, hidden 128."""
    name = "charlm"

    def __init__(self, args):
        root = "/usr/share/common-licenses"
        seen, parts = set(), []
        for f in sorted(os.listdir(root)):
            real = os.path.realpath(os.path.join(root, f))
            if real in seen or not os.path.isfile(real):
                continue
            seen.add(real)
            with open(real, "rb") as fh:
                parts.append(fh.read().decode("utf-8", "replace"))
        text = "\n".join(parts)
        chars = sorted(set(text))
        self.vocab = len(chars)
        stoi = {c: i for i, c in enumerate(chars)}
        data = torch.tensor([stoi[c] for c in text], dtype=torch.int64)
        cut = int(len(data) * 0.9)
        self.train, self.val = data[:cut], data[cut:]
        self.files, self.nchars = sorted(seen), len(data)
        self.seq = args.lm_seq
        self.batch = args.lm_batch
        self.lr = {"adam": args.lm_lr, "sgd": args.lm_sgd_lr}
        # fixed validation windows: non-overlapping, up to lm_val_windows of them
        L = args.lm_val_seq
        nwin = min(args.lm_val_windows, (len(self.val) - 1) // L)
        starts = torch.arange(nwin) * ((len(self.val) - 1 - L) // max(nwin - 1, 1))
        self.vx = torch.stack([self.val[s:s + L] for s in starts])
        self.vy = torch.stack([self.val[s + 1:s + 1 + L] for s in starts])

    def model(self):
        return CharGRU(self.vocab)

    def batch_for(self, seed, step, rank, world):
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        starts = torch.randint(0, len(self.train) - self.seq - 1, (self.batch,), generator=g)
        mine = starts[rank::world]
        x = torch.stack([self.train[s:s + self.seq] for s in mine])
        y = torch.stack([self.train[s + 1:s + 1 + self.seq] for s in mine])
        return x, y

    def loss(self, model, batch):
        x, y = batch
        out = model(x)
        return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    @torch.no_grad()
    def evaluate(self, model):
        return {"val_loss": float(self.loss(model, (self.vx, self.vy)))}


class CharGRU(torch.nn.Module):
    def __init__(self, vocab, emb=32, hidden=128):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, emb)
        self.rnn = torch.nn.GRU(emb, hidden, batch_first=True)
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, x):
        h, _ = self.rnn(self.emb(x))
        return self.head(h)


# ------------------------------------------------------------- training ----

def ring_bytes(n_elems, world):
    """Bytes one rank sends in a full-precision fp32 ring allreduce: 2(n-1)/n * 4N."""
    return 2.0 * (world - 1) / world * 4.0 * n_elems


def flat_grad(params):
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in params])


def unflat_grad(params, flat):
    off = 0
    for p in params:
        n = p.numel()
        p.grad = flat[off:off + n].view_as(p).clone()
        off += n


def train_one(task, method, seed, steps, rank, world, args):
    import squall
    import squall.optim

    torch.manual_seed(seed)  # identical init on every rank
    model = task.model()
    params = [p for p in model.parameters()]
    nparam = sum(p.numel() for p in params)
    lr = task.lr["sgd" if method == "local_sgd" else "adam"]
    comp = None
    if method in ("adam", "naive_onebit"):
        opt = torch.optim.AdamW(params, lr=lr, eps=args.eps, weight_decay=0.0)
        if method == "naive_onebit":
            comp = squall.Compressor(None, nparam, "onebit")
    elif method == "apmsqueeze":
        opt = squall.optim.APMSqueeze(params, lr=lr, eps=args.eps, weight_decay=0.0,
                                      warmup=args.warmup, total_steps=steps,
                                      codec=args.apm_codec, guard=bool(args.apm_guard),
                                      max_update=args.apm_max_update)
    elif method == "slowmo_adam":
        base = torch.optim.AdamW(params, lr=lr, eps=args.eps, weight_decay=0.0)
        opt = squall.optim.SlowMo(base,
                                  tau=args.tau, alpha=1.0, beta=0.5)
    elif method == "local_sgd":
        opt = squall.optim.SlowMo(torch.optim.SGD(params, lr=lr, momentum=0.9),
                                  tau=args.tau, alpha=1.0, beta=0.0)
    else:
        raise ValueError(method)
    # the same schedule for every method: cosine from lr to lr/10 over the run
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps, eta_min=lr / 10)

    losses, bytes_cum, evals = [], [], []
    sent = 0.0
    t0 = time.time()
    for step in range(steps):
        batch = task.batch_for(seed, step, rank, world)
        opt.zero_grad(set_to_none=True)
        loss = task.loss(model, batch)
        loss.backward()
        if method == "adam":
            g = flat_grad(params)
            squall.allreduce(g)  # full precision average
            unflat_grad(params, g)
            sent += ring_bytes(nparam, world)
        elif method == "naive_onebit":
            g = flat_grad(params)
            squall.allreduce(g, compressor=comp)
            unflat_grad(params, g)
        opt.step()
        sched.step()
        if method == "naive_onebit":
            sent += float(comp.stats["last_bytes_sent"])
        elif method == "apmsqueeze":
            sent = float(opt.info()["bytes_sent"])
        elif method in ("slowmo_adam", "local_sgd") and (step + 1) % args.tau == 0:
            sent += ring_bytes(nparam, world)
        losses.append(float(loss))
        bytes_cum.append(sent)
        # evaluate at multiples of eval_every (multiples of tau: SlowMo ranks are synced)
        if rank == 0 and ((step + 1) % args.eval_every == 0 or step + 1 == steps):
            e = task.evaluate(model)
            e["step"] = step + 1
            evals.append(e)
    elapsed = time.time() - t0
    extra = {}
    if method == "apmsqueeze":
        inf = opt.info()
        extra = {"warmup_steps": inf["warmup_steps"], "skipped_steps": inf["skipped_steps"]}
        opt.close()
    if comp is not None:
        extra = {"compressor_calls": comp.stats["calls"],
                 "skipped_calls": comp.stats["skipped_calls"]}
        comp.close()
    return {"losses": losses, "bytes": bytes_cum, "evals": evals, "nparam": nparam,
            "elapsed_s": elapsed, "lr": lr, **extra}


def _clock(seconds):
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """Run k of N, elapsed and an ETA: the time per training step so far, per
    task (their steps cost differently), times the steps still planned."""

    def __init__(self, plan):
        self.plan, self.done, self.t0 = plan, 0, time.time()
        self.spent = {}  # task -> (seconds, steps) of finished runs
        self.run_t0 = self.t0

    def start(self, task, method, seed, steps):
        self.run_t0 = time.time()
        print(f"[run {self.done + 1}/{len(self.plan)}] {task} seed={seed} {method} ({steps} "
              f"steps) ...; elapsed {_clock(self.run_t0 - self.t0)}, ETA {self.eta()}",
              flush=True)
        self.task = task

    def finish(self, steps):
        secs, n = self.spent.get(self.task, (0.0, 0))
        self.spent[self.task] = (secs + time.time() - self.run_t0, n + steps)
        self.done += 1
        return f"[{self.done}/{len(self.plan)} done, ETA {self.eta()}]"

    def eta(self):
        rest = self.plan[self.done:]
        if not rest:
            return _clock(0)
        known = [s / n for s, n in self.spent.values() if n]
        if not known:
            return "unknown (after the first run)"
        fallback = sum(known) / len(known)
        total = 0.0
        for task, _, _, steps in rest:
            s, n = self.spent.get(task, (0.0, 0))
            total += steps * (s / n if n else fallback)
        return _clock(total)


def worker(rank, world, port, args, plan, out_path):
    os.environ.update(ENV)
    torch.set_num_threads(1)
    import torch.distributed as dist
    import squall

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=600))
    squall.init()
    tasks = {}
    records, meta = [], {}
    if rank == 0 and os.path.exists(out_path) and args.resume:
        with open(out_path) as f:
            records = json.load(f)["runs"]
    progress = Progress(plan) if rank == 0 else None
    for task_name, method, seed, steps in plan:
        if progress is not None:
            progress.start(task_name, method, seed, steps)
        if task_name not in tasks:
            tasks[task_name] = DigitsTask(args) if task_name == "digits" else CharLMTask(args)
        task = tasks[task_name]
        r = train_one(task, method, seed, steps, rank, world, args)
        # gather per-rank losses and bytes (measurement only; not counted)
        allr = [None] * world
        dist.all_gather_object(allr, {"losses": r["losses"], "bytes": r["bytes"][-1],
                                      "elapsed_s": r["elapsed_s"]})
        if rank == 0:
            losses = torch.tensor([a["losses"] for a in allr]).mean(0).tolist()
            rec = {"task": task_name, "method": method, "seed": seed, "steps": steps,
                   "world": world, **{k: v for k, v in r.items() if k != "losses"},
                   "train_loss": losses,
                   "bytes_per_rank_final": [a["bytes"] for a in allr],
                   "elapsed_max_s": max(a["elapsed_s"] for a in allr)}
            records = [x for x in records if not (x["task"] == task_name and
                       x["method"] == method and x["seed"] == seed)] + [rec]
            meta.update({"args": vars(args), "world": world,
                         "compressed_algo": os.environ.get("SQUALL_COMPRESSED_ALGO", "auto")})
            if task_name == "digits":
                meta["digits"] = {"dropped_pixels": task.dropped, "inputs": task.nin}
            if task_name == "charlm":
                meta["charlm"] = {"files": task.files, "chars": task.nchars,
                                  "vocab": task.vocab}
            with open(out_path + ".tmp", "w") as f:
                json.dump({"meta": meta, "runs": records}, f)
            os.replace(out_path + ".tmp", out_path)
            last = rec["evals"][-1]
            print(f"[{task_name} seed={seed} {method:>13}] {r['elapsed_s']:.0f}s "
                  f"final {last} bytes/rank {rec['bytes_per_rank_final'][0]:.3g} "
                  f"{progress.finish(steps)}", flush=True)
    squall.shutdown()


# ---------------------------------------------------------------- report ----

def _mean(xs):
    xs = list(xs)
    return sum(xs) / len(xs)


def _std(xs):  # sample std; NaN/inf pass through (statistics.stdev raises on them)
    xs = list(xs)
    if len(xs) < 2:
        return 0.0
    mu = _mean(xs)
    return math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1))


def summarize(runs):
    out = {}
    for task in sorted({r["task"] for r in runs}):
        rows = {}
        adam_bytes = None
        for m in METHODS:
            rs = [r for r in runs if r["task"] == task and r["method"] == m]
            if not rs:
                continue
            keys = [k for k in rs[0]["evals"][-1] if k != "step"]
            keys.append("final_train_loss")
            vals = {}
            for k in keys:
                if k == "final_train_loss":  # mean over the last 10% of steps
                    xs = [sum(r["train_loss"][-max(1, len(r["train_loss"]) // 10):]) /
                          max(1, len(r["train_loss"]) // 10) for r in rs]
                else:
                    xs = [r["evals"][-1][k] for r in rs]
                vals[k] = (_mean(xs), _std(xs))
            b = _mean(sum(r["bytes_per_rank_final"]) / len(r["bytes_per_rank_final"])
                                for r in rs)
            bmax = _mean(max(r["bytes_per_rank_final"]) for r in rs)
            if m == "adam":
                adam_bytes = b
            rows[m] = {"n_seeds": len(rs), "metrics": vals, "bytes_per_rank": b,
                       "bytes_max_rank": bmax}
        for m in rows:
            rows[m]["bytes_vs_adam"] = (adam_bytes / rows[m]["bytes_per_rank"]
                                        if adam_bytes and rows[m]["bytes_per_rank"] else None)
        out[task] = rows
    return out


def markdown_table(summary):
    lines = []
    for task, rows in summary.items():
        keys = list(next(iter(rows.values()))["metrics"].keys())
        lines.append(f"### {task}\n")
        lines.append("| method | seeds | " + " | ".join(keys) +
                     " | MB sent / rank (mean) | MB sent, busiest rank | Adam bytes / method bytes |")
        lines.append("|---" * (len(keys) + 5) + "|")
        for m, row in rows.items():
            cells = []
            for k in keys:
                mu, sd = row["metrics"][k]
                cells.append(f"{mu:.2f} ± {sd:.2f}" if k.endswith("acc") else
                             f"{mu:.4f} ± {sd:.4f}")
            ratio = row["bytes_vs_adam"]
            lines.append(f"| {LABELS[m]} | {row['n_seeds']} | " + " | ".join(cells) +
                         f" | {row['bytes_per_rank'] / 1e6:.3f} | {row['bytes_max_rank'] / 1e6:.3f} | "
                         f"{'%.1fx' % ratio if ratio else '-'} |")
        lines.append("")
    return "\n".join(lines)


def plot(runs, outdir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = dict(zip(METHODS, ["k", "tab:red", "tab:orange", "tab:blue", "tab:green"]))
    paths = []
    for task in sorted({r["task"] for r in runs}):
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), dpi=80)
        for m in METHODS:
            rs = [r for r in runs if r["task"] == task and r["method"] == m]
            if not rs:
                continue
            n = min(len(r["train_loss"]) for r in rs)
            mean = torch.tensor([r["train_loss"][:n] for r in rs]).mean(0)
            w = max(1, n // 30)  # moving average for readability
            sm = torch.nn.functional.avg_pool1d(mean.view(1, 1, -1), w, 1).view(-1)
            steps = torch.arange(len(sm)) + w
            bts = torch.tensor([sum(r["bytes"][:n][i] for r in rs) / len(rs)
                                for i in range(n)])[w - 1:]
            axes[0].plot(steps.tolist(), sm.tolist(), color=colors[m], label=LABELS[m], lw=1.2)
            ok = bts > 0
            axes[1].plot(bts[ok].tolist(), sm[ok].tolist(), color=colors[m], lw=1.2)
        axes[0].set_xlabel("step")
        axes[0].set_ylabel(f"train loss (mean over ranks & {len(set(r['seed'] for r in runs if r['task'] == task))} seeds, smoothed)")
        axes[1].set_xscale("log")
        axes[1].set_xlabel("cumulative bytes sent by rank 0 (the busiest)")
        axes[1].set_ylabel("train loss")
        for a in axes:
            a.grid(alpha=0.3)
        axes[0].legend(fontsize=7)
        fig.suptitle(f"{task}: {runs[0]['world']} ranks")
        fig.tight_layout()
        p = os.path.join(outdir, f"{task}_loss.png")
        fig.savefig(p)
        plt.close(fig)
        paths.append(p)
    return paths


def report(out_path, outdir):
    with open(out_path) as f:
        res = json.load(f)
    summary = summarize(res["runs"])
    with open(os.path.join(outdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    table = markdown_table(summary)
    with open(os.path.join(outdir, "table.md"), "w") as f:
        f.write(table + "\n")
    print(table)
    for p in plot(res["runs"], outdir):
        print("wrote", p, os.path.getsize(p), "bytes")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--tasks", default="digits,charlm")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--digits-seeds", type=int, default=3)
    ap.add_argument("--lm-seeds", type=int, default=2)
    ap.add_argument("--digits-steps", type=int, default=300)
    ap.add_argument("--lm-steps", type=int, default=240)
    ap.add_argument("--digits-batch", type=int, default=64, help="global batch")
    ap.add_argument("--digits-drop-constant", type=int, default=0,
                    help="drop input pixels constant (0) over the training set (1/0)")
    ap.add_argument("--digits-lr", type=float, default=3e-3)
    ap.add_argument("--digits-sgd-lr", type=float, default=0.1)
    ap.add_argument("--lm-batch", type=int, default=16, help="global batch (sequences)")
    ap.add_argument("--lm-seq", type=int, default=48)
    ap.add_argument("--lm-lr", type=float, default=3e-3)
    ap.add_argument("--lm-sgd-lr", type=float, default=0.5)
    ap.add_argument("--lm-val-seq", type=int, default=128)
    ap.add_argument("--lm-val-windows", type=int, default=48)
    ap.add_argument("--warmup", type=float, default=0.15, help="APMSqueeze warmup fraction")
    ap.add_argument("--eps", type=float, default=1e-8, help="Adam eps (every Adam method)")
    ap.add_argument("--apm-codec", default="onebit", help="APMSqueeze's codec")
    ap.add_argument("--apm-guard", type=int, default=1,
                    help="APMSqueeze's guard (1, default) or the plain update (0)")
    ap.add_argument("--apm-max-update", type=float, default=None,
                    help="APMSqueeze's clip (default: the bound of Adam for the betas)")
    ap.add_argument("--tau", type=int, default=12)
    ap.add_argument("--eval-every", type=int, default=48)
    ap.add_argument("--quick", action="store_true", help="1 seed, 48 steps: smoke test")
    ap.add_argument("--resume", action="store_true",
                    help="keep runs already in results.json (others are replaced)")
    ap.add_argument("--plots-only", action="store_true")
    ap.add_argument("--replot-all", action="store_true",
                    help="re-make table.md, summary.json and the plots of every results.json "
                         "under --out (the study and all its variants), then exit")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    if args.quick:
        args.digits_seeds = args.lm_seeds = 1
        args.digits_steps = args.lm_steps = 48
        args.eval_every = 24
    os.makedirs(args.out, exist_ok=True)
    if args.replot_all:
        found = sorted(d for d, _, files in os.walk(args.out) if "results.json" in files)
        for i, d in enumerate(found):
            print(f"[{i + 1}/{len(found)}] {os.path.relpath(d, args.out) or '.'}", flush=True)
            report(os.path.join(d, "results.json"), d)
        return 0
    out_path = os.path.join(args.out, "results.json")
    if not args.plots_only:
        plan = []
        for t in args.tasks.split(","):
            nseeds = args.digits_seeds if t == "digits" else args.lm_seeds
            steps = args.digits_steps if t == "digits" else args.lm_steps
            for seed in range(nseeds):
                for m in args.methods.split(","):
                    plan.append((t, m, seed, steps))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        t0 = time.time()
        mp.start_processes(worker, args=(args.world, port, args, plan, out_path),
                           nprocs=args.world, join=True, start_method="spawn")
        print(f"study took {time.time() - t0:.0f} s", flush=True)
    report(out_path, args.out)


if __name__ == "__main__":
    sys.exit(main())
