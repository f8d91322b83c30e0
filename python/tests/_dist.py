"""Multi-process test helper: spawns `world` processes that join a gloo
process group on 127.0.0.1 and run fn(rank, world, *args); returns the list
of their return values. A join timeout kills stragglers."""

import datetime
import os
import random
import shutil
import socket
import sys
import tempfile
import time

import torch
import torch.multiprocessing as mp

ENV = {
    "SQUALL_SOCKET_IFNAME": "lo",
    "SQUALL_TRANSPORT": "tcp",
    "SQUALL_TIMEOUT_S": "30",
    "GLOO_SOCKET_IFNAME": "lo",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port():
    """A port for MASTER_PORT that is free, and whose Squall offset
    (MASTER_PORT + SQUALL_PORT_OFFSET, 17) is free too. Taken below the
    kernel's ephemeral range: a port the kernel just handed out for bind(0)
    is where it hands out the next ones, so MASTER_PORT + 17 could be taken by
    any connection the test makes meanwhile."""
    high = _ephemeral_low() - 18
    for _ in range(200):
        port = random.randint(10000, max(10001, high))
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as a, \
                    socket.socket(socket.AF_INET, socket.SOCK_STREAM) as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 17))
            return port
        except OSError:
            continue
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stage(tmpdir, rank, what):
    """Marks how far this rank got (run() names it if the rank dies)."""
    with open(os.path.join(tmpdir, f"stage{rank}"), "w") as f:
        f.write(what)


def _entry(rank, fn, world, port, tmpdir, args, env):
    os.environ.update(env)
    torch.set_num_threads(1)
    import torch.distributed as dist

    _stage(tmpdir, rank, "joining the gloo group")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    _stage(tmpdir, rank, "running the test body")
    result = fn(rank, world, *args)
    torch.save(result, os.path.join(tmpdir, f"result{rank}.pt"))
    # Every rank has finished its Squall collectives before any exits: a rank
    # exiting right after a collective can cut a slower peer's short.
    _stage(tmpdir, rank, "in the final barrier (result saved)")
    dist.barrier()
    # Then the group is destroyed (a local step once every rank is past the
    # barrier), and the rank leaves without the interpreter's teardown: with
    # torch 2.15 a rank whose gloo group (or any thread holding torch state)
    # outlives the interpreter aborts now and then at exit ("terminate called
    # without an active exception"), after its work is done and saved.
    _stage(tmpdir, rank, "destroying the gloo group (result saved)")
    dist.destroy_process_group()
    _stage(tmpdir, rank, "done")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _stages(tmpdir, world):
    def read(rank):
        try:
            with open(os.path.join(tmpdir, f"stage{rank}")) as f:
                return f.read()
        except OSError:
            return "not started"
    return "; ".join(f"rank {r}: {read(r)}" for r in range(world))


def run(fn, world=2, args=(), timeout=90, env=None):
    tmpdir = tempfile.mkdtemp(prefix="squall-test-")
    full_env = dict(ENV)
    full_env.update(env or {})
    try:
        ctx = mp.start_processes(_entry, args=(fn, world, free_port(), tmpdir, args, full_env),
                                 nprocs=world, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        try:
            while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    raise AssertionError(f"{fn.__name__}: ranks still running after {timeout} s "
                                         f"({_stages(tmpdir, world)})")
        except mp.ProcessExitedException as e:
            raise AssertionError(f"{fn.__name__}: {e} ({_stages(tmpdir, world)})") from e
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                    p.join(5)
        return [torch.load(os.path.join(tmpdir, f"result{r}.pt")) for r in range(world)]
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
