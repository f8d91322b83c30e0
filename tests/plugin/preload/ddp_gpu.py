#!/usr/bin/env python3
"""torch DDP over NCCL under libsquall-preload-nccl.so: 2 processes sharing GPU 0.

  ddp_gpu.py LIB OUT_DIR                      (the driver; run by tests/gpu/run.sh)
  ddp_gpu.py --fsdp LIB OUT_DIR               (the same model under FSDP2's fully_shard)
  ddp_gpu.py --fused LIB OUT_DIR              (the same model, its gradients fused as Horovod does)
  ddp_gpu.py --net-plugin PLUGIN OUT_DIR      (the same job over libnccl-net-squall.so)

Both use the NCCL that torch bundles (its nvidia-nccl wheel), with nothing on
LD_LIBRARY_PATH.

The driver trains the same small model twice, each time as 2 processes on the
one GPU (distinct NCCL_HOSTID so NCCL accepts two ranks on one device, and
NCCL_MNNVL_ENABLE=0): without the interposer, then with it. It checks that
the interposed run compressed DDP's gradient allreduces (every rank's report
non-empty, calls_compressed > 0 and fewer bytes than at full precision), that
its final loss is within 3% (plus 0.005 for a loss near zero) of the
uncompressed run's with the interposer's default codec, and that both ranks
hold bit-identical parameters. Prints PASS/FAIL lines; exit 0 only on PASS.

With --fsdp the model is sharded with fully_shard (each Linear, then the
root): its gradients travel in ncclReduceScatter, which the interposer must
compress (the report's by_collective.reduce_scatter.calls_compressed > 0, with
fewer bytes than at full precision), at the same loss bound; the parameters
are gathered whole (full_tensor) for the finiteness check.

With --fused the gradients go in allreduces of flat buffers the job makes
itself, as Horovod's fusion does: every gradient in one buffer on even steps
and each alone on odd ones, so the calls reveal the tensor edges inside the
fused buffer. The interposer must compress the fused calls cut at those
edges, the biases (2 KiB, under SQUALL_PRELOAD_MIN_BYTES) sent whole inside
them (the report's elements_kept_full > 0), at the same loss bound.

With --net-plugin the job runs once with NCCL_NET_PLUGIN=PLUGIN and
NCCL_NET=squall (Squall's net transport carries every byte between the two
ranks, at full precision): NCCL's log must show the plugin loaded, at ABI v12
where torch's NCCL is 2.30 or newer, the job must finish, and the ranks must
hold identical parameters.
"""
import json
import os
import pathlib
import socket
import subprocess
import sys


def fused_allreduce(params, step):
    """The gradients averaged as Horovod's fusion sends them: all in one flat
    buffer on even steps, each in its own on odd ones."""
    import torch
    import torch.distributed as dist
    grads = [p.grad for p in params]
    for group in ([grads] if step % 2 == 0 else [[g] for g in grads]):
        flat = torch.cat([g.reshape(-1) for g in group])
        dist.all_reduce(flat, op=dist.ReduceOp.AVG)
        offset = 0
        for g in group:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


def worker(out, fsdp=False, fused=False):
    import torch
    import torch.distributed as dist
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10)).cuda()
    if fsdp:
        from torch.distributed.fsdp import fully_shard
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        ddp = fully_shard(model)
    elif fused:
        ddp = model  # the same seed gives every rank the same initial weights
    else:
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
        if fused:
            fused_allreduce(list(model.parameters()), step)
        opt.step()
        losses.append(loss.item())
    flat = torch.cat([(p.full_tensor() if fsdp else p).detach().reshape(-1)
                      for p in model.parameters()])
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


def run(lib, out_dir, tag, extra_env=None, fsdp=False, fused=False):
    out = pathlib.Path(out_dir) / f"ddp-{tag}.json"
    port = free_port()
    procs, logs = [], []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   NCCL_HOSTID=f"squall-preload-{rank}", NCCL_MNNVL_ENABLE="0",
                   SQUALL_PRELOAD_REPORT=str(pathlib.Path(out_dir) / f"report-{tag}"),
                   SQUALL_PRELOAD_MIN_BYTES="4096", SQUALL_DEBUG="INFO", **(extra_env or {}))
        if lib:
            env["LD_PRELOAD"] = lib
        log = pathlib.Path(out_dir) / f"ddp-{tag}.{rank}.log"
        logs.append(log)
        with open(log, "w") as f:
            procs.append(subprocess.Popen(
                [sys.executable, __file__,
                 "--fsdp-worker" if fsdp else "--fused-worker" if fused else "--worker", str(out)],
                env=env, stdout=f, stderr=subprocess.STDOUT))
    codes = [p.wait(timeout=240) for p in procs]
    for log in logs:
        sys.stdout.write(log.read_text()[-4000:])
    if any(codes):
        raise SystemExit(f"FAIL: ddp {tag}: workers exited with {codes}")
    result = json.loads(out.read_text())
    result["logs"] = [log.read_text() for log in logs]
    return result


def net_plugin(plugin, out_dir):
    import torch
    nccl = torch.cuda.nccl.version()
    want = "v12" if tuple(nccl) >= (2, 30, 0) else None
    print(f"torch {torch.__version__}, its NCCL {'.'.join(map(str, nccl))}")
    mine = run(None, out_dir, "net", {
        "NCCL_NET_PLUGIN": plugin, "NCCL_NET": "squall", "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET", "SQUALL_NET_TRANSPORT": "tcp",
        "SQUALL_SOCKET_IFNAME": "lo"})
    failed = []
    for rank, log in enumerate(mine.pop("logs")):
        loaded = [line for line in log.splitlines()
                  if "net plugin" in line.lower() and "squall" in line.lower()]
        print(f"rank {rank}: " + (loaded[0].strip() if loaded else "no plugin line"))
        if not loaded:
            failed.append(f"rank {rank}: NCCL's log does not show the plugin loaded")
        elif want and not any(want in line for line in loaded):
            failed.append(f"rank {rank}: NCCL {nccl} loaded the plugin, but not at {want}")
        if "using network squall" not in log.lower():
            failed.append(f"rank {rank}: NCCL's log does not show it using the squall network")
    if not (mine["identical"] and mine["finite"]):
        failed.append(f"ranks' parameters differ or are not finite: {mine}")
    for f in failed:
        print("FAIL: ddp-net-plugin:", f)
    if not failed:
        print(f"PASS: ddp-net-plugin ({mine})")
    return 1 if failed else 0


def main():
    if len(sys.argv) > 2 and sys.argv[1] in ("--worker", "--fsdp-worker", "--fused-worker"):
        return worker(sys.argv[2], fsdp=sys.argv[1] == "--fsdp-worker",
                      fused=sys.argv[1] == "--fused-worker")
    if len(sys.argv) > 3 and sys.argv[1] == "--net-plugin":
        return net_plugin(os.path.abspath(sys.argv[2]), sys.argv[3])
    mode = sys.argv[1] if len(sys.argv) > 3 and sys.argv[1] in ("--fsdp", "--fused") else ""
    fsdp, fused = mode == "--fsdp", mode == "--fused"
    args = sys.argv[2:] if mode else sys.argv[1:]
    lib, out_dir = os.path.abspath(args[0]), args[1]
    name = "preload-" + (mode[2:] if mode else "ddp")
    prefix = mode[2:] + "-" if mode else ""
    base = run(None, out_dir, prefix + "off", fsdp=fsdp, fused=fused)
    mine = run(lib, out_dir, prefix + "on", fsdp=fsdp, fused=fused)
    base.pop("logs")
    mine.pop("logs")
    print(f"uncompressed: {base}\ninterposed: {mine}")
    failed = []
    for rank in range(2):
        path = pathlib.Path(out_dir) / f"report-{prefix}on.{rank}.json"
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
        scatter = rep.get("by_collective", {}).get("reduce_scatter", {})
        if fsdp and not (scatter.get("calls_compressed", 0) > 0 and
                         scatter["bytes_sent"] < scatter["bytes_full_precision"]):
            failed.append(f"rank {rank} compressed no reduce-scatter: {scatter}")
        if fused and not rep.get("elements_kept_full", 0) > 0:
            failed.append(f"rank {rank} sent no bias whole inside a fused call "
                          f"(elements_kept_full {rep.get('elements_kept_full')})")
    if not (mine["identical"] and mine["finite"]):
        failed.append(f"ranks' parameters differ or are not finite: {mine}")
    rel = 100 * (mine["final_loss"] - base["final_loss"]) / base["final_loss"]
    print(f"final loss {mine['final_loss']:.4f} interposed, {base['final_loss']:.4f} "
          f"uncompressed ({rel:+.2f}%)")
    if mine["final_loss"] > 1.03 * base["final_loss"] + 0.005:
        failed.append(f"final loss {mine['final_loss']:.4f} vs {base['final_loss']:.4f} "
                      f"uncompressed ({rel:+.2f}%, more than 3%)")
    for f in failed:
        print(f"FAIL: {name}:", f)
    if not failed:
        print(f"PASS: {name}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main() or 0)
