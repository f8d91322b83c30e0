"""Regression tests for what a new user met first (issue: a package that
installs and never hangs): each test failed before its fix."""

import inspect
import logging
import os
import subprocess
import sys
import warnings

import pytest
import torch

import _dist
import squall

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)


def _python(code, timeout=60, env=None):
    """Runs `code` in a fresh interpreter importing this checkout's package."""
    full = dict(os.environ)
    full["PYTHONPATH"] = PYTHON_DIR + os.pathsep + full.get("PYTHONPATH", "")
    full.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=full)


def test_set_default_twice_does_not_hang():
    # Before: set_default held a plain lock while the old default's __del__
    # -> close() took it again, and the process hung forever.
    code = """
import squall
uid = squall.get_unique_id()
a = squall.Communicator.from_unique_id(uid, 1, 0, transport="tcp")
squall.set_default(a)
del a
squall.set_default(squall.Communicator.from_unique_id(squall.get_unique_id(), 1, 0,
                                                        transport="tcp"))
print("ok", squall.get_default().size)
"""
    r = _python(code, timeout=30, env={"SQUALL_SOCKET_IFNAME": "lo"})
    assert r.returncode == 0 and "ok 1" in r.stdout, r.stderr


def test_submodules_after_import_squall():
    # Before: squall.optim and squall.ddp raised AttributeError after `import squall`.
    r = _python("import squall; print(squall.optim.APMSqueeze.__name__, "
                "squall.ddp.onebit_hook.__name__)")
    assert r.returncode == 0 and "APMSqueeze onebit_hook" in r.stdout, r.stderr


def test_one_version_format():
    # Before: squall.version() returned 100 while __version__ was "0.1.0".
    assert squall.version() == squall.__version__
    assert squall._lib.version_code() == 100


def test_apmsqueeze_signature_matches_adamw():
    # Before: weight_decay defaulted to 0.0 where AdamW has 0.01.
    from squall.optim import APMSqueeze

    ours = inspect.signature(APMSqueeze).parameters
    theirs = inspect.signature(torch.optim.AdamW).parameters
    for name in ("lr", "betas", "eps", "weight_decay", "amsgrad"):
        assert name in ours, name
        assert ours[name].default == theirs[name].default, name
    assert list(ours)[:6] == list(theirs)[:6]  # positional order: params .. amsgrad


def _drift_worker(rank, world):
    from torch.nn.parallel import DistributedDataParallel as DDP

    import squall.ddp
    from squall.optim import APMSqueeze, SlowMo

    out = {}
    squall.init()
    comm = squall.init()  # before: hung forever on every rank
    out["init_twice"] = comm.size

    # Exact counters: a direct allreduce of 1000 fp32 on 2 ranks moves 4000 bytes each way.
    before = comm.stats
    comm.allreduce(torch.ones(1000))
    after = comm.stats
    out["allreduce_bytes"] = (after["bytes_sent"] - before["bytes_sent"],
                              after["bytes_received"] - before["bytes_received"],
                              after["operations"] - before["operations"])
    c = squall.Compressor(comm, 10000, "onebit")
    before = comm.stats["bytes_sent"]
    for _ in range(3):
        c.allreduce(torch.randn(10000))
    st = c.stats
    out["compressor"] = (st["bytes_sent"], comm.stats["bytes_sent"] - before,
                         st["last_bytes_sent"])

    # Replicas start equal: rank-dependent initial parameters are broadcast.
    p = torch.full((50,), float(rank + 1), requires_grad=True)
    opt = APMSqueeze([p], lr=1e-2, warmup=2)
    out["broadcast"] = p.detach().clone()
    q = torch.full((5,), float(rank + 1), requires_grad=True)
    APMSqueeze([q], lr=1e-2, warmup=2, broadcast_initial=False)
    out["no_broadcast"] = q.detach().clone()

    # Phase switch: one readable line, once, at the default level.
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("squall").addHandler(handler)
    for s in range(4):
        p.grad = torch.randn(50, generator=torch.Generator().manual_seed(rank * 10 + s))
        opt.step()
    logging.getLogger("squall").removeHandler(handler)
    out["phase_log"] = [r.getMessage() for r in records if r.levelno >= logging.WARNING]
    out["apm_stats"] = opt.stats

    # A hyper-parameter that differs on one rank is named at the first step.
    r = torch.zeros(8, requires_grad=True)
    bad = APMSqueeze([r], lr=1e-3 if rank == 0 else 2e-3, warmup=2)
    r.grad = torch.ones(8)
    with pytest.raises(squall.SquallInvalidUsage) as e:
        bad.step()
    out["hyper_error"] = str(e.value)

    # Misuse: SlowMo over DDP refuses; APMSqueeze over DDP without the hook warns.
    model = torch.nn.Linear(4, 2)
    ddp = DDP(model)
    with pytest.raises(squall.SquallInvalidUsage) as e:
        SlowMo(torch.optim.SGD(model.parameters(), lr=0.1))
    out["slowmo_ddp"] = str(e.value)
    apm = APMSqueeze(ddp.parameters(), warmup=2)
    ddp(torch.ones(3, 4)).sum().backward()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apm.step()
    out["apm_ddp_warning"] = [str(w.message) for w in caught]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        squall.ddp.OnebitState(warmup_steps=0)
    out["onebit_warning"] = [str(w.message) for w in caught]

    # SlowMo and the DDP hooks count their bytes too.
    local = torch.nn.Linear(4, 2)
    slow = SlowMo(torch.optim.SGD(local.parameters(), lr=0.1), tau=1)
    local(torch.ones(3, 4)).sum().backward()
    before = comm.stats["bytes_sent"]
    slow.step()
    out["slowmo_sync_bytes"] = (slow.stats["bytes_sent"], comm.stats["bytes_sent"] - before)
    hooked = DDP(torch.nn.Linear(4, 2))
    state = squall.ddp.OnebitState(warmup_steps=1)
    hooked.register_comm_hook(state, squall.ddp.onebit_hook)
    for _ in range(2):
        hooked(torch.ones(3, 4)).sum().backward()
    out["onebit_stats"] = state.stats

    # squallrun --slowmo 2: its patches (as the injected sitecustomize installs
    # them) wrap the script's SGD in SlowMo and keep DDP's gradients local.
    import json

    from squall import _patch

    os.environ["SQUALL_RUN_CONFIG"] = json.dumps(
        {"optimizer": None, "hook": None, "slowmo": 2, "warmup": 1, "codec": "onebit"})
    _patch.install()
    net = torch.nn.Linear(4, 2)
    script_ddp = DDP(net)
    script_opt = torch.optim.SGD(script_ddp.parameters(), lr=0.1)
    out["slowmo_type"] = type(script_opt).__name__
    snapshots = []
    for s in range(2):
        script_opt.zero_grad()
        script_ddp(torch.full((3, 4), float(rank + s))).sum().backward()
        script_opt.step()
        snapshots.append([p.detach().clone() for p in net.parameters()])
    out["slowmo_snapshots"] = snapshots
    return out


def test_drift_counters_and_misuse():
    res = _dist.run(_drift_worker, world=2, timeout=120)
    for rank, out in enumerate(res):
        assert out["init_twice"] == 2
        assert out["allreduce_bytes"] == (4000, 4000, 1)
        total, measured, last = out["compressor"]
        assert total == measured and total == 3 * last and last > 0  # cumulative, exact
        assert torch.equal(out["broadcast"], torch.ones(50)), "rank 0's parameters everywhere"
        assert torch.equal(out["no_broadcast"], torch.full((5,), float(rank + 1)))
        assert "rank 1 has param group 0 lr=0.002 where rank 0 has 0.001" in out["hyper_error"]
        assert "DistributedDataParallel" in out["slowmo_ddp"]
        assert any("apmsqueeze_hook" in w for w in out["apm_ddp_warning"]), out
        assert any("warmup_steps >= 1" in w for w in out["onebit_warning"]), out
        sync, measured = out["slowmo_sync_bytes"]
        assert measured > 0 and sync >= measured
        assert out["onebit_stats"]["bytes_sent"] > 0
        assert out["apm_stats"]["bytes_sent"] > 0
    assert res[0]["slowmo_type"] == "SlowMo"
    after1 = [r["slowmo_snapshots"][0] for r in res]
    after2 = [r["slowmo_snapshots"][1] for r in res]
    assert not all(torch.equal(a, b) for a, b in zip(*after1)), "step 1: local gradients"
    assert all(torch.equal(a, b) for a, b in zip(*after2)), "step 2 = tau: averaged"
    lines = res[0]["phase_log"]
    assert len(lines) == 1 and "switched to 1-bit compressed momentum after step 2" in lines[0] \
        and "sent by rank 0 so far" in lines[0], lines
    assert res[1]["phase_log"] == []
    assert torch.equal(res[0]["broadcast"], res[1]["broadcast"])


def test_init_without_torch_distributed_under_srun_and_mpirun():
    # squall.init() with no process group reads the launchers' variables.
    code = """
import squall
c = squall.init(transport="tcp")
print("ok", c.rank, c.size, squall.get_default() is c)
"""
    port = str(_dist.free_port())
    for launcher in ({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0",
                      "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0",
                      "SLURM_JOB_NODELIST": "localhost", "SQUALL_PORT": port},
                     {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1",
                      "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
                      "OMPI_MCA_ess_base_jobid": "77", "SQUALL_PORT": port}):
        env = {k: v for k, v in os.environ.items()
               if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
        env.update(launcher, SQUALL_SOCKET_IFNAME="lo")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=30, env=dict(env, PYTHONPATH=PYTHON_DIR))
        assert r.returncode == 0 and "ok 0 1 True" in r.stdout, r.stderr
