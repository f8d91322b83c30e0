#!/usr/bin/env python3
"""torch DDP over NCCL under libsquall-preload-nccl.so: 2 processes sharing GPU 0.

  ddp_gpu.py LIB OUT_DIR          (the driver; run by tests/gpu/run.sh)

The driver trains the same small model twice, each time as 2 processes on the
one GPU (distinct NCCL_HOSTID so NCCL accepts two ranks on one device, and
NCCL_MNNVL_ENABLE=0): without the interposer, then with it. It checks that
the interposed run compressed DDP's gradient allreduces (every rank's report
non-empty, calls_compressed > 0 and fewer bytes than at full precision), that
its final loss is within 10% of the uncompressed run's, and that both ranks
hold bit-identical parameters. Prints PASS/FAIL lines; exit 0 only on PASS.
"""
import json
import os
import pathlib
import socket
import subprocess
import sys


def worker(out):
    import torch
    import torch.distributed as dist
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10)).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    centers = torch.randn(10, 64, generator=g)
    losses = []
    for step in range(100):
        y = torch.randint(0, 10, (64,), generator=g)
        x = centers[y] + torch.randn(64, 64, generator=g)
        x, y = x[rank::2].cuda(), y[rank::2].cuda()  # each rank its half
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    both = [torch.empty_like(flat) for _ in range(2)]
    dist.all_gather(both, flat)
    identical = torch.equal(both[0], both[1])
    finite = bool(torch.isfinite(flat).all())
    if rank == 0:
        pathlib.Path(out).write_text(json.dumps({
            "final_loss": sum(losses[-20:]) / 20, "identical": identical, "finite": finite}))
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(lib, out_dir, tag):
    out = pathlib.Path(out_dir) / f"ddp-{tag}.json"
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   NCCL_HOSTID=f"squall-preload-{rank}", NCCL_MNNVL_ENABLE="0",
                   SQUALL_PRELOAD_REPORT=str(pathlib.Path(out_dir) / f"report-{tag}"),
                   SQUALL_PRELOAD_MIN_BYTES="4096", SQUALL_DEBUG="INFO")
        if lib:
            env["LD_PRELOAD"] = lib
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", str(out)], env=env))
    codes = [p.wait(timeout=240) for p in procs]
    if any(codes):
        raise SystemExit(f"FAIL: preload-ddp {tag}: workers exited with {codes}")
    return json.loads(out.read_text())


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        return worker(sys.argv[2])
    lib, out_dir = os.path.abspath(sys.argv[1]), sys.argv[2]
    base = run(None, out_dir, "off")
    mine = run(lib, out_dir, "on")
    print(f"uncompressed: {base}\ninterposed: {mine}")
    failed = []
    for rank in range(2):
        path = pathlib.Path(out_dir) / f"report-on.{rank}.json"
        if not path.exists():
            failed.append(f"rank {rank} wrote no report")
            continue
        rep = json.loads(path.read_text())
        print(f"rank {rank} report: {json.dumps(rep, sort_keys=True)}")
        if rep["calls_compressed"] == 0:
            failed.append(f"rank {rank} compressed nothing (passed by reason: "
                          f"{rep['calls_by_reason']})")
        elif not rep["bytes_sent"] < rep["bytes_full_precision"]:
            failed.append(f"rank {rank} sent no fewer bytes than at full precision")
    if not (mine["identical"] and mine["finite"]):
        failed.append(f"ranks' parameters differ or are not finite: {mine}")
    if mine["final_loss"] > 1.1 * base["final_loss"] + 0.02:
        failed.append(f"final loss {mine['final_loss']:.4f} vs {base['final_loss']:.4f} uncompressed")
    for f in failed:
        print("FAIL: preload-ddp:", f)
    if not failed:
        print("PASS: preload-ddp")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main() or 0)
