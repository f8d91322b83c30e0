"""FSDP2 convergence study: plain FSDP2 AdamW against squall.fsdp's compressed
reduce-scatter (library defaults: int4:block=256 after 100 full-precision
calls per module) and with quantized parameter all-gathers too
(params="int8:block=256"), and APMSqueeze's form for sharded models
(apms_sharded.py: momentum compressed instead of gradients, methods
apms_onebit and apms_int4), on the convergence study's model families
(perf/convergence/run_study.py: the same data, models, seeds, batches, lr and
cosine schedule), 2 or 4 CPU ranks over gloo.

Every child module with parameters (the members of a ModuleList) is a
fully_shard unit, and the root too.
Judged at the last step on the family's held-out loss and accuracy, paired
per seed against plain FSDP2; bytes are rank 0's over the whole run: plain
FSDP's computed from the shards (an fp32 ring reduce-scatter and two fp32
all-gathers per unit and step: FSDP over gloo counts nothing), squall's from
its counters plus the full-precision calls of the warmup.

    SQUALL_LIBRARY=$PWD/build/src/core/libsquall.so build/venv-torch/bin/python \\
        perf/fsdp/study.py --world 2 --seeds 3 --out perf/results/fsdp-study/w2

Needs torch >= 2.9 (FSDP2's custom collectives) and scikit-learn in the
same environment; one torch thread per rank.
"""

import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "convergence"))
import run_study  # noqa: E402  (the tasks)

import apms_sharded  # noqa: E402  (APMSqueeze's sharded form, methods apms_*)

METHODS = {
    "plain": None,
    "squall": {},  # squall.fsdp.compress's defaults
    "squall_params": {"params": "int8:block=256"},
    "squall_bf16res": {},  # the defaults with residuals kept at bf16 precision (ENV)
    # APMSqueeze's form for sharded models (apms_sharded.py): momentum of the
    # local gradient compressed after the same 100 full-precision calls, under
    # the frozen-variance update; in APMSqueeze's code and in squall's.
    "apms_onebit": {"codec": "onebit:block=64:scale=rms"},
    "apms_int4": {"codec": "int4:block=256"},
}
APMS_WARMUP = 100  # squall.fsdp's default warmup, so only the compressed stage differs
# Variables a method runs under (read when its compressors are made).
ENV = {"squall_bf16res": {"SQUALL_RESIDUAL_PRECISION": "bf16"}}
TASKS = "transformer,charcnn,digits_cnn,digits"


def shard(model):
    from torch.distributed.fsdp import fully_shard

    def units(module):
        for child in module.children():
            if isinstance(child, (torch.nn.ModuleList, torch.nn.ModuleDict)):
                yield from units(child)  # containers have no forward of their own
            elif any(True for _ in child.parameters()):
                yield child

    for unit in list(units(model)):
        fully_shard(unit)
    fully_shard(model)
    return model


def fp32_bytes(model, world):
    """Rank 0's bytes of one plain FSDP2 step: a ring reduce-scatter and two
    ring all-gathers (forward, and again in backward) of every unit's shards,
    each (world - 1) shards of 4 bytes per element."""
    from torch.distributed.tensor import DTensor

    local = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel()
                for p in model.parameters())
    return 3 * (world - 1) * 4 * local


def train(rank, world, task, method, seed, steps):
    saved_env = {k: os.environ.get(k) for k in ENV.get(method, {})}
    os.environ.update(ENV.get(method, {}))
    try:
        return _train(rank, world, task, method, seed, steps)
    finally:
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _train(rank, world, task, method, seed, steps):
    import squall.fsdp

    torch.manual_seed(seed)
    model = shard(task.model())
    compressed = None
    lr = task.lr["adam"]
    if method.startswith("apms_"):
        compressed = apms_sharded.attach(model, METHODS[method]["codec"], APMS_WARMUP, 0.9)
        opt = apms_sharded.FrozenVarianceAdam(model.parameters(), lr, APMS_WARMUP, eps=1e-8)
    else:
        if METHODS[method] is not None:
            compressed = squall.fsdp.compress(model, **METHODS[method])
        opt = torch.optim.AdamW(model.parameters(), lr=lr, eps=1e-8, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps, eta_min=lr / 10)
    losses = []
    t0 = time.time()
    for step in range(steps):
        batch = task.batch_for(seed, step, rank, world)
        opt.zero_grad(set_to_none=True)
        loss = task.loss(model, batch)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss))
    elapsed = time.time() - t0
    final = task.evaluate(model)  # every rank: FSDP's forward gathers
    per_step = fp32_bytes(model, world)
    if compressed is None:
        sent = per_step * steps
    else:
        st = compressed.stats
        gathers = st.get("all_gather", {"bytes_sent": 0, "full_calls": 0, "calls": 0})
        # full-precision calls (warmup, and gathers left uncompressed) at fp32 prices
        rs_full = st["full_calls"] / max(st["calls"], 1) * steps * per_step / 3
        ag_full = (2 * steps * per_step / 3) if not gathers["calls"] else (
            gathers["full_calls"] / gathers["calls"] * 2 * steps * per_step / 3)
        sent = st["bytes_sent"] + gathers["bytes_sent"] + rs_full + ag_full
    return {"losses": losses, "final": final, "bytes": sent, "fp32_bytes": per_step * steps,
            "elapsed_s": elapsed}


def worker(rank, world, port, plan, args, out_path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    options = run_study.parser().parse_args([])
    tasks = {}
    records = []
    if os.path.exists(out_path):
        with open(out_path) as f:
            records = json.load(f)["runs"]
    done = {(r["task"], r["method"], r["seed"]) for r in records}
    t_start = time.time()
    for i, (name, method, seed, steps) in enumerate(plan):
        if (name, method, seed) in done:
            continue
        if name not in tasks:
            tasks[name] = run_study.make_task(name, options)
        r = train(rank, world, tasks[name], method, seed, steps)
        allr = [None] * world
        dist.all_gather_object(allr, r["losses"])
        if rank == 0:
            rec = {"task": name, "method": method, "seed": seed, "steps": steps, "world": world,
                   "train_loss": torch.tensor(allr).mean(0).tolist(), "final": r["final"],
                   "bytes": r["bytes"], "fp32_bytes": r["fp32_bytes"],
                   "elapsed_s": r["elapsed_s"]}
            records.append(rec)
            with open(out_path + ".tmp", "w") as f:
                json.dump({"runs": records}, f)
            os.replace(out_path + ".tmp", out_path)
            print(f"[{i + 1}/{len(plan)}] {name} {method} seed={seed}: {r['final']} "
                  f"{r['bytes'] / 1e6:.1f} MB ({r['elapsed_s']:.0f} s; "
                  f"{time.time() - t_start:.0f} s so far)", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def table(out_path):
    with open(out_path) as f:
        runs = json.load(f)["runs"]
    by = {(r["task"], r["method"], r["seed"]): r for r in runs}
    world = runs[0]["world"] if runs else 0
    lines = [f"{world} ranks, paired per seed against plain FSDP2 (mean [min, max]):", "",
             "| family | method | seeds | held-out loss vs plain | accuracy vs plain, points "
             "| bytes, fewer than plain |", "|---|---|---|---|---|---|"]
    for task in TASKS.split(","):
        for method in METHODS:
            if method == "plain":
                continue
            seeds = sorted(s for (t, m, s) in by if t == task and m == method
                           and (t, "plain", s) in by)
            if not seeds:
                continue
            dl, da, ratio = [], [], []
            for s in seeds:
                a, b = by[(task, method, s)], by[(task, "plain", s)]
                lk = next(k for k in a["final"] if k.endswith("loss"))
                ak = next(k for k in a["final"] if k.endswith("acc"))
                dl.append(100 * (a["final"][lk] / b["final"][lk] - 1))
                da.append(a["final"][ak] - b["final"][ak])
                ratio.append(b["bytes"] / a["bytes"])

            def cell(xs, fmt):
                return f"{fmt % (sum(xs) / len(xs))} [{fmt % min(xs)}, {fmt % max(xs)}]"

            lines.append(f"| {task} | {method} | {len(seeds)} | {cell(dl, '%+.2f%%')} | "
                         f"{cell(da, '%+.2f')} | {sum(ratio) / len(ratio):.1f}x |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--tasks", default=TASKS)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--steps", type=int, default=0, help="every task (default: each task's own)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    out_path = os.path.join(args.out, "results.json")
    if not args.table_only:
        plan = [(t, m, s, args.steps or run_study.TASKS[t][1]) for t in args.tasks.split(",")
                for s in range(args.seeds) for m in args.methods.split(",")]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(GLOO_SOCKET_IFNAME="lo", SQUALL_SOCKET_IFNAME="lo",
                          SQUALL_TRANSPORT="tcp", OMP_NUM_THREADS="1")
        mp.start_processes(worker, args=(args.world, port, plan, args, out_path),
                           nprocs=args.world, join=True, start_method="spawn")
    text = table(out_path)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
