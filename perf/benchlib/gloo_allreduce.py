#!/usr/bin/python3
"""gloo's allreduce (torch.distributed), timed as fp_bench times Squall
and Open MPI (perf/bench.py peers starts one per rank): -w warmup calls, -n timed calls each after a barrier, the
slowest rank's median, one JSON object per size on stdout (rank 0).

Reads torchrun's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; set
GLOO_SOCKET_IFNAME to the interface (lo on one host, eth0 in perf/links.sh).
"""
import argparse
import json
import time

import torch
import torch.distributed as dist


def size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text[-1].upper() in units:
        return int(float(text[:-1]) * units[text[-1].upper()])
    return int(text)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("-b", type=size, default=1 << 20)
    p.add_argument("-e", type=size, default=256 << 20)
    p.add_argument("-f", type=float, default=4)
    p.add_argument("-n", type=int, default=10)
    p.add_argument("-w", type=int, default=3)
    p.add_argument("-d", default="float", choices=["float", "double", "half", "bfloat16", "int32", "int64"])
    p.add_argument("-o", default="sum", choices=["sum", "min", "max"])
    p.add_argument("--label", default="")
    a = p.parse_args()
    # One intra-op thread, as each of the other libraries uses: with several
    # ranks per host, torch's default (one per core) makes them fight over
    # the cores in every tensor copy.
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    dtype = {"float": torch.float32, "double": torch.float64, "half": torch.float16,
             "bfloat16": torch.bfloat16, "int32": torch.int32, "int64": torch.int64}[a.d]
    op = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[a.o]
    esize = torch.empty(0, dtype=dtype).element_size()
    b = float(a.b)
    while b <= a.e:
        count = int(b) // esize
        b *= a.f
        if count == 0:
            continue
        # torch reduces in place; a copy into the output buffer per call is
        # what a caller keeping its input pays, and what the other two do.
        src = (torch.arange(count) % 32).to(dtype)
        out = torch.empty_like(src)
        for _ in range(a.w):
            out.copy_(src)
            dist.all_reduce(out, op=op)
        times = []
        for _ in range(a.n):
            dist.barrier()
            t0 = time.perf_counter()
            out.copy_(src)
            dist.all_reduce(out, op=op)
            times.append(time.perf_counter() - t0)
        times.sort()
        stats = torch.tensor([times[len(times) // 2], -times[0]], dtype=torch.float64)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        if rank == 0:
            print(json.dumps({"lib": "gloo", "label": a.label, "ranks": n, "bytes": count * esize,
                              "type": a.d, "op": a.o, "median_us": stats[0].item() * 1e6,
                              "min_us": -stats[1].item() * 1e6}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
