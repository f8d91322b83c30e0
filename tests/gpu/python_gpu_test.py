#!/usr/bin/env python3
"""The Python binding's GPU path on a GPU: 2 processes sharing GPU 0.

Each rank joins a gloo process group on 127.0.0.1, sets its own NCCL_HOSTID
(so NCCL treats the ranks as two hosts on one GPU) and NCCL_MNNVL_ENABLE=0,
and creates two communicators: squall.init(transport="tcp") and
squall.init(transport="nccl"). With SQUALL_COMPRESSED_ALGO=twophase (the
algorithm the device runs) it checks:

  * allreduce: ncclAllReduce of CUDA tensors, closed forms;
  * compressed: the compressed allreduce of CUDA tensors on the NCCL
    communicator (squallCompressedAllReduceOnStream) has the bits of the host
    communicator's on the same inputs, over several calls (residuals carry
    over), for onebit and int8, fp32 and bf16 buffers, in and out of place;
    CUDA tensors on the host communicator (staged by Python) too;
  * reduce-scatter: the compressed reduce-scatter of CUDA tensors on the NCCL
    communicator (squallCompressedReduceScatterOnStream) has the bits of the
    host communicator's, call after call, for int4 (fp32, in place: the
    output a view of the rank's piece) and onebit (bf16), and a residual
    saved on the GPU loads into a host compressor that then gives the
    device's next result (each rank's shard differs: compared per rank);
  * all-gather: the quantized all-gather of CUDA tensors on the NCCL
    communicator (squallCompressedAllGatherOnStream) has the host
    communicator's bits, fp32 in place and bf16;
  * optimizer: APMSqueeze on CUDA parameters over NCCL
    (squallOptimizerStepOnStream), and on CUDA parameters over TCP (device
    buffers staged through the host), has the bits of APMSqueeze on the same
    CPU parameters over TCP, for 30 steps across the warmup switch with an LR
    schedule; a state_dict saved at step 20 on the GPU resumes bit-identically;
  * streamed SlowMo: SlowMo(SGD, tau=4, fragments=2, delay=1) on CUDA
    parameters over the TCP communicator, each fragment's sync overlapped
    with the next step; every merged fragment and the parameters after a
    final sync() are compared across ranks;
  * the parent checks that the ranks' outputs are bit-identical.

Run from the repository root with the CUDA build of libsquall:

    SQUALL_LIBRARY=build-gpu/src/core/libsquall.so PYTHONPATH=python \\
        python3 tests/gpu/python_gpu_test.py

Prints "rank R: PASS name" / "rank R: FAIL name: ..." lines and a final
PASS or FAIL; exits 0 only if everything passed. Without CUDA torch or a GPU
it prints SKIP and exits 0. The ranks are killed after 75 s.
"""

import datetime
import os
import shutil
import socket
import sys
import tempfile
import time
import traceback

import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

WORLD = 2
LIMIT_S = 75
N = 100_003  # not a multiple of the block size, nor of the ranks
HYPER = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)
WARMUP, STEPS, SAVE_AT = 10, 30, 20


def set_device():
    torch.cuda.set_device(0)


def to_gpu(t):
    return t.to("cuda")


def synchronize():
    torch.cuda.synchronize()


def bits(t):
    """The raw bits of a tensor on the host (NaN payloads included)."""
    t = t.detach().cpu().contiguous()
    return t.view({4: torch.int32, 2: torch.int16}[t.element_size()])


def same_bits(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


class Checks:
    def __init__(self, rank):
        self.rank, self.failed = rank, []

    def __call__(self, ok, name, detail=""):
        if ok:
            print(f"rank {self.rank}: PASS {name}", flush=True)
        else:
            print(f"rank {self.rank}: FAIL {name}: {detail}", flush=True)
            self.failed.append(name)


def _inputs(rank, call, dtype=torch.float32):
    g = torch.Generator().manual_seed(1000 * call + rank + 17)
    return torch.randn(N, generator=g).to(dtype)


def check_allreduce(squall, gpu, check, rank):
    a = torch.arange(1000, dtype=torch.float32)
    x = to_gpu(a + rank)
    gpu.allreduce(x, "sum")
    check(torch.equal(x.cpu(), 2 * a + 1), "allreduce-nccl-sum")
    y = to_gpu(torch.full((7,), rank, dtype=torch.int64))
    squall.allreduce(y, op="max", comm=gpu)
    z = to_gpu(a.half() + 2 * rank)
    gpu.allreduce(z, "avg")
    check(torch.equal(y.cpu(), torch.full((7,), WORLD - 1, dtype=torch.int64)) and
          torch.equal(z.cpu(), (a + 1).half()), "allreduce-nccl-max-avg")


def check_compressed(squall, gpu, host, check, rank, out):
    for codec, dtype, op, in_place in (("onebit", torch.float32, "avg", True),
                                       ("int8", torch.float32, "sum", False),
                                       ("onebit", torch.bfloat16, "avg", True)):
        name = f"compressed-{codec}-{str(dtype)[6:]}-{op}-{'in' if in_place else 'out'}-place"
        cg = squall.Compressor(gpu, N, codec)
        ch = squall.Compressor(host, N, codec)
        cs = squall.Compressor(host, N, codec)  # CUDA tensors on the host communicator
        ok, detail, results = True, "", []
        for call in range(4):
            x = _inputs(rank, call, dtype)
            xg, xh, xs = to_gpu(x), x.clone(), to_gpu(x)
            if in_place:
                cg.allreduce(xg, op)
                rg = xg
            else:
                rg = to_gpu(torch.full((N,), float("nan"), dtype=dtype))
                cg.allreduce(xg, op, out=rg)
                synchronize()
                if not same_bits(xg, x):
                    ok, detail = False, f"call {call}: the input changed out of place"
            ch.allreduce(xh, op)
            cs.allreduce(xs, op)
            synchronize()
            if not same_bits(rg, xh):
                ok, detail = False, f"call {call}: the NCCL result differs from the host one"
            if not same_bits(xs, xh):
                ok, detail = False, f"call {call}: CUDA tensors over TCP differ from CPU ones"
            results.append(rg.cpu())
        check(ok and cg.stats["calls"] == 4, name, detail)
        out[name] = results
        for c in (cg, ch, cs):
            c.close()


def check_reduce_scatter(squall, gpu, host, check, rank):
    n = WORLD * 50_001
    piece = n // WORLD
    for codec, dtype, in_place in (("int4:block=256", torch.float32, True),
                                   ("onebit", torch.bfloat16, False)):
        name = f"reduce-scatter-{codec.split(':')[0]}-{str(dtype)[6:]}"
        cg = squall.Compressor(gpu, n, codec, kind="reduce_scatter")
        ch = squall.Compressor(host, n, codec, kind="reduce_scatter")
        ok, detail = True, ""
        for call in range(4):
            g = torch.Generator().manual_seed(77 * call + rank)
            x = torch.randn(n, generator=g).to(dtype)
            xg = to_gpu(x)
            og = xg[rank * piece:(rank + 1) * piece] if in_place else to_gpu(
                torch.empty(piece, dtype=dtype))
            oh = torch.empty(piece, dtype=dtype)
            if call == 3:  # the device residual, checkpointed into the host compressor
                synchronize()
                ch.load_state(cg.save_state())
            cg.reduce_scatter(xg, og, "avg")
            ch.reduce_scatter(x, oh, "avg")
            synchronize()
            if not same_bits(og, oh):
                ok, detail = False, f"call {call}: the NCCL result differs from the host one"
        check(ok and cg.stats["calls"] == 4, name, detail)
        for c in (cg, ch):
            c.close()


def check_all_gather(squall, gpu, host, check, rank):
    n = 30_001
    for dtype, in_place in ((torch.float32, True), (torch.bfloat16, False)):
        name = f"all-gather-int8-{str(dtype)[6:]}"
        cg = squall.Compressor(gpu, n, "int8:block=256", kind="all_gather")
        ch = squall.Compressor(host, n, "int8:block=256", kind="all_gather")
        x = torch.randn(n, generator=torch.Generator().manual_seed(5 + rank)).to(dtype)
        og = to_gpu(torch.zeros(WORLD * n, dtype=dtype))
        if in_place:
            og[rank * n:(rank + 1) * n] = to_gpu(x)
            cg.all_gather(og[rank * n:(rank + 1) * n], og)
        else:
            cg.all_gather(to_gpu(x), og)
        oh = ch.all_gather(x, torch.empty(WORLD * n, dtype=dtype))
        synchronize()
        check(same_bits(og, oh), name, "the NCCL result differs from the host one")
        for c in (cg, ch):
            c.close()


def _params(device):
    g = torch.Generator().manual_seed(11)
    ps = [torch.randn(300, generator=g), torch.randn(40, 60, generator=g),
          torch.randn(50, generator=g), torch.randn(9, generator=g)]
    return [(to_gpu(p) if device == "cuda" else p).requires_grad_() for p in ps]


def _groups(ps):
    return [{"params": [ps[0], ps[1], ps[3]]}, {"params": [ps[2]], "lr": 3e-3}]


def _set_grads(ps, rank, step):
    for i, p in enumerate(ps[:3]):
        g = torch.Generator().manual_seed(100000 * i + 1000 * rank + step)
        grad = torch.round(torch.randn(p.shape, generator=g) * 1024) / 1024  # exact sums
        p.grad = grad if p.device.type == "cpu" else to_gpu(grad)
    ps[3].grad = None  # never moves


def _optimizer(squall, comm, ps):
    from squall.optim import APMSqueeze

    opt = APMSqueeze(_groups(ps), warmup=WARMUP, comm=comm, **HYPER)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + 0.05 * s))


def check_optimizer(squall, gpu, host, check, rank, out):
    runs = {"cpu-tcp": (host, _params("cpu")), "cuda-nccl": (gpu, _params("cuda")),
            "cuda-tcp": (host, _params("cuda"))}
    opts = {k: _optimizer(squall, c, ps) for k, (c, ps) in runs.items()}
    first_diff = {}
    saved = None
    for s in range(STEPS):
        for k, (opt, sched) in opts.items():
            _set_grads(runs[k][1], rank, s)
            opt.step()
            sched.step()
        synchronize()
        for k in ("cuda-nccl", "cuda-tcp"):
            if k not in first_diff and not all(
                    same_bits(a, b) for a, b in zip(runs["cpu-tcp"][1], runs[k][1])):
                first_diff[k] = s
        if s + 1 == SAVE_AT:
            opt, sched = opts["cuda-nccl"]
            saved = ([p.detach().cpu().clone() for p in runs["cuda-nccl"][1]],
                     opt.state_dict(), sched.state_dict())
    info = opts["cuda-nccl"][0].info(0)
    check(info["phase"] == "compressed" and info["step"] == STEPS, "optimizer-nccl-phase",
          str(info))
    for k in ("cuda-nccl", "cuda-tcp"):
        check(k not in first_diff, f"optimizer-{k}-equals-cpu-tcp",
              f"parameters differ from step {first_diff.get(k)} on")
    moved = (runs["cuda-nccl"][1][0].detach().cpu() - _params("cpu")[0].detach()).abs().max()
    still = torch.equal(runs["cuda-nccl"][1][3].detach().cpu(), _params("cpu")[3].detach())
    check(float(moved) > 0 and still, "optimizer-moves-only-params-with-grads")
    # resume from the state saved at SAVE_AT
    ps = _params("cuda")
    with torch.no_grad():
        for p, v in zip(ps, saved[0]):
            p.copy_(to_gpu(v))
    opt, sched = _optimizer(squall, gpu, ps)
    opt.load_state_dict(saved[1])
    sched.load_state_dict(saved[2])
    for s in range(SAVE_AT, STEPS):
        _set_grads(ps, rank, s)
        opt.step()
        sched.step()
    synchronize()
    check(all(same_bits(a, b) for a, b in zip(ps, runs["cuda-nccl"][1])),
          "optimizer-nccl-state-dict-resume")
    out["params"] = [p.detach().cpu() for p in runs["cuda-nccl"][1]]


def check_slowmo_streamed(squall, host, check, rank, out, device="cuda"):
    """Streamed SlowMo over CUDA parameters and a host communicator: fragment
    syncs overlapped with the next step, every merge bit-identical across
    ranks (compared by main), the same steps as over CPU parameters."""
    from squall.optim import SlowMo

    ps = _params(device)
    opt = SlowMo(torch.optim.SGD(_groups(ps), lr=0.05, momentum=0.9), tau=4, fragments=2,
                 delay=1, comm=host)
    merged = []
    for s in range(13):
        _set_grads(ps, rank, s)
        landing = [t.piece.fragment for t in opt._in_flight if t.land <= opt.steps + 1]
        opt.step()
        if landing:
            merged += [p.detach().cpu().clone() for t in landing for p in _params_of(opt, t)]
    if device == "cuda":
        synchronize()
    check(len(merged) > 0 and opt.stats["bytes_sent"] > 0, "slowmo-streamed-syncs",
          f"{len(merged)} merged tensors, {opt.stats}")
    opt.sync()
    if device == "cuda":
        synchronize()
    out["slowmo_streamed_merges"] = merged
    out["slowmo_streamed_final"] = [p.detach().cpu() for p in ps]


def _params_of(opt, fragment):
    return [p for piece in opt._pieces if piece.fragment == fragment for p in piece.params]


def _worker(rank, port, outdir):
    os.environ.update({
        "NCCL_HOSTID": f"squall-python-gpu-{rank}", "NCCL_MNNVL_ENABLE": "0",
        "SQUALL_COMPRESSED_ALGO": "twophase", "SQUALL_SOCKET_IFNAME": "lo",
        "SQUALL_TIMEOUT_S": "30", "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"})
    check = Checks(rank)
    out = {}
    try:
        set_device()
        import torch.distributed as dist

        import squall

        print(f"rank {rank}: libsquall {squall.library_path}, HAVE_GPU={squall.HAVE_GPU}, "
              f"torch {torch.__version__} (CUDA {torch.version.cuda})", flush=True)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=WORLD, timeout=datetime.timedelta(seconds=60))
        host = squall.init(transport="tcp", set_as_default=False)
        gpu = squall.init(transport="nccl")
        check(gpu.transport == "nccl" and gpu.device == torch.device("cuda", 0) and
              (gpu.rank, gpu.size) == (rank, WORLD), "init-nccl", repr(gpu))
        check_allreduce(squall, gpu, check, rank)
        check_compressed(squall, gpu, host, check, rank, out)
        check_reduce_scatter(squall, gpu, host, check, rank)
        check_all_gather(squall, gpu, host, check, rank)
        check_optimizer(squall, gpu, host, check, rank, out)
        check_slowmo_streamed(squall, host, check, rank, out)
        gpu.close()
        host.close()
        check(gpu.closed, "close")
        dist.barrier()
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - reported as a failure of this rank
        traceback.print_exc()
        check(False, "exception", "see the traceback above")
    out["failed"] = check.failed
    torch.save(out, os.path.join(outdir, f"rank{rank}.pt"))


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    if not torch.cuda.is_available():
        print(f"SKIP: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU")
        return 0
    outdir = tempfile.mkdtemp(prefix="squall-python-gpu-")
    try:
        ctx = mp.start_processes(_worker, args=(_free_port(), outdir), nprocs=WORLD,
                                 join=False, start_method="spawn")
        deadline = time.monotonic() + LIMIT_S
        try:
            while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    print(f"FAIL: the ranks were still running after {LIMIT_S} s")
                    return 1
        except Exception as e:  # noqa: BLE001 - a rank died
            print(f"FAIL: a rank failed: {e}")
            return 1
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                    p.join(5)
        res = [torch.load(os.path.join(outdir, f"rank{r}.pt")) for r in range(WORLD)]
        failed = [f"rank {r}: {name}" for r, o in enumerate(res) for name in o["failed"]]
        for key in sorted(k for k in res[0] if k != "failed"):
            same = key in res[1] and len(res[0][key]) == len(res[1][key]) and all(
                same_bits(a, b) for a, b in zip(res[0][key], res[1][key]))
            print(f"{'PASS' if same else 'FAIL'}: {key} bit-identical across ranks")
            if not same:
                failed.append(f"{key} across ranks")
        if failed:
            print("FAIL: " + "; ".join(failed))
            return 1
        print("PASS: the Python GPU path")
        return 0
    finally:
        shutil.rmtree(outdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
