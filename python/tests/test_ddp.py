"""DDP communication hooks on a tiny model."""

import pytest
import torch

import _dist


def _model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def _batch(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(4, 8, generator=g), torch.randn(4, 2, generator=g)


def _local_grads(model, rank, step):
    model.zero_grad()
    x, y = _batch(rank, step)
    torch.nn.functional.mse_loss(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


class _Stub:
    """Stands in for APMSqueeze: in warmup for the first `n` steps."""

    def __init__(self, n):
        self.n, self.steps = n, 0

    @property
    def in_warmup(self):
        return self.steps < self.n


# The hooks that compress after warmup, and their codecs.
COMPRESSING = {"onebit": "onebit", "onebit_mom": "onebit", "int4": "int4", "int2": "int2"}


def _ddp_worker(rank, world, hook_name, warmup, steps):
    import copy

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import squall
    import squall.ddp

    comm = squall.init()
    before = comm.stats
    model = _model()
    local = copy.deepcopy(model)
    ddp = DDP(model)
    if hook_name in COMPRESSING:
        state = squall.ddp.OnebitState(warmup_steps=warmup, codec=COMPRESSING[hook_name],
                                       keep_1d_full=hook_name == "onebit_mom")
        ddp.register_comm_hook(state, squall.ddp.onebit_hook)
    else:
        stub = _Stub(warmup)
        state = squall.ddp.APMSqueezeState(stub)
        ddp.register_comm_hook(state, squall.ddp.apmsqueeze_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    if hook_name == "onebit_mom":
        state.optimizer = opt  # built after the state: set before the first backward
    out = []
    for s in range(steps):
        local.load_state_dict(model.state_dict())
        mine = _local_grads(local, rank, s)
        everyone = [torch.zeros(sum(g.numel() for g in mine)) for _ in range(world)]
        dist.all_gather(everyone, torch.cat([g.reshape(-1) for g in mine]))
        opt.zero_grad()
        x, y = _batch(rank, s)
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        synced = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        out.append({"synced": synced, "mean": sum(everyone) / world,
                    "local": torch.cat([g.reshape(-1) for g in mine])})
        opt.step()
        if hook_name not in COMPRESSING:
            stub.steps += 1
    counters = state.counters()
    counters["comm_sent"] = comm.stats["bytes_sent"] - before["bytes_sent"]
    bufs = [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    state.close()
    return out, counters, [p.detach().clone() for p in model.parameters()] + bufs


@pytest.mark.parametrize("hook", ["onebit", "onebit_mom", "int4", "int2", "apmsqueeze"])
def test_ddp_hook(hook):
    warmup, steps = 2, 6
    (r0, c0, p0), (r1, c1, p1) = _dist.run(_ddp_worker, world=2, args=(hook, warmup, steps))
    for s in range(steps):
        a, b = r0[s], r1[s]
        if s < warmup:  # full precision: the true average, equal on both ranks
            assert torch.allclose(a["synced"], a["mean"], rtol=1e-5, atol=1e-6)
            assert torch.allclose(b["synced"], b["mean"], rtol=1e-5, atol=1e-6)
        elif hook in COMPRESSING:  # compressed: bit-identical across ranks, not the mean
            assert torch.equal(a["synced"], b["synced"])
            assert not torch.allclose(a["synced"], a["mean"])
        else:  # no communication: each rank keeps its local gradient
            assert torch.allclose(a["synced"], a["local"], rtol=1e-6, atol=1e-7)
            assert torch.allclose(b["synced"], b["local"], rtol=1e-6, atol=1e-7)
            assert not torch.allclose(a["synced"], b["synced"])
    if hook in COMPRESSING:
        assert c0["steps"] == steps and c0["warmup_steps"] == warmup
        assert c0["compressed_calls"] > 0 and c0["full_calls"] > 0
        assert c0["calls"] == c0["compressed_calls"] + c0["full_calls"]
        assert c0["bytes_sent"] > 0 and c0["torch_bytes"] > 0  # warmup on torch's allreduce
        assert c0["bytes_sent"] == c0["comm_sent"], c0  # exact: the hook alone used comm
        # same parameters and SGD momentum buffers everywhere
        assert all(torch.equal(x, y) for x, y in zip(p0, p1))
    else:
        assert c0["allreduced_calls"] > 0 and c0["skipped_calls"] > 0
        assert c0["calls"] == c0["allreduced_calls"] + c0["skipped_calls"]


class _FakeBucket:
    """What the hooks read of a DDP GradBucket."""

    def __init__(self, buf, params=None, index=0, last=True):
        self._buf, self._params, self._index, self._last = buf, params, index, last

    def buffer(self):
        return self._buf

    def index(self):
        return self._index

    def is_last(self):
        return self._last

    def parameters(self):
        return self._params or []


def _async_worker(rank, world, warmup):
    import time

    import torch.distributed as dist

    import squall
    import squall.ddp

    comm = squall.init()
    state = squall.ddp.OnebitState(warmup_steps=warmup, warmup_backend="squall")
    before = comm.stats
    out = []
    for step in range(2):
        buf = torch.full((1 << 12,), float(rank + 1 + step))
        dist.barrier()
        if rank == 1:
            time.sleep(2.0)  # rank 0's hook must return before this rank contributes
        t0 = time.monotonic()
        fut = squall.ddp.onebit_hook(state, _FakeBucket(buf))
        returned_s, done_at_return = time.monotonic() - t0, fut.done()
        value = fut.wait()
        out.append({"returned_s": returned_s, "done_at_return": done_at_return,
                    "waited_s": time.monotonic() - t0, "value": value.clone()})
    counters = state.counters()
    after = comm.stats
    counters["comm_sent"] = after["bytes_sent"] - before["bytes_sent"]
    counters["comm_received"] = after["bytes_received"] - before["bytes_received"]
    state.close()
    return out, counters


@pytest.mark.parametrize("warmup", [1, 0])
def test_hook_future_completes_after_return(warmup):
    """Rank 1 joins each allreduce 2 s late: rank 0's hook has returned an
    unfinished future by then, which completes once rank 1 has contributed."""
    (o0, c0), (o1, c1) = _dist.run(_async_worker, world=2, args=(warmup,),
                                   env={"PYTHONWARNINGS": "ignore"})
    for step in range(2):
        a, b = o0[step], o1[step]
        assert a["returned_s"] < 1.0 and not a["done_at_return"], a
        assert a["waited_s"] > 1.5, a
        assert torch.equal(a["value"], b["value"])  # bit-identical on both ranks
        mean = 1.5 + step
        if step < warmup:
            assert torch.allclose(a["value"], torch.full_like(a["value"], mean))
        else:  # a constant buffer survives 1-bit compression up to rounding
            assert torch.allclose(a["value"], torch.full_like(a["value"], mean), rtol=1e-3)
    for c in (c0, c1):
        assert c["steps"] == 2 and c["calls"] == 2
        assert c["warmup_steps"] == warmup and c["full_calls"] == warmup
        assert c["compressed_calls"] == 2 - warmup
        assert c["bytes_sent"] > 0 and c["bytes_received"] > 0 and c["torch_bytes"] == 0
        # the hook alone used the communicator: its counts are the communicator's
        assert (c["bytes_sent"], c["bytes_received"]) == (c["comm_sent"], c["comm_received"]), c


def _momentum_worker(rank, world, keep_1d_full):
    import squall
    import squall.ddp

    squall.init()
    beta, warmup, steps = 0.9, 2, 8
    weight = torch.zeros(40, 30)
    bias = torch.zeros(30)
    state = squall.ddp.OnebitState(warmup_steps=warmup, momentum=beta,
                                   keep_1d_full=keep_1d_full, warmup_backend="squall")
    sgd_buf = None
    true_m = torch.zeros(weight.numel() + bias.numel())
    out = []
    for s in range(steps):
        g = torch.Generator().manual_seed(100 * s + rank)
        grad = torch.randn(true_m.numel(), generator=g)
        other = torch.randn(true_m.numel(), generator=torch.Generator().manual_seed(
            100 * s + 1 - rank))
        true_m = beta * true_m + (grad + other) / 2
        got = squall.ddp.onebit_hook(state, _FakeBucket(grad.clone(), [weight, bias])).wait()
        sgd_buf = got.clone() if sgd_buf is None else beta * sgd_buf + got  # SGD's buffer
        out.append({"sgd_buf": sgd_buf.clone(), "true_m": true_m.clone()})
    b = state.buckets[0]
    lay = b.layout
    comp = torch.cat([sgd_buf[i:j] for i, j in lay.comp])
    full = torch.cat([sgd_buf[i:j] for i, j in lay.full]) if lay.full else None
    state.close()
    return out, comp, b.mbar.clone(), full


@pytest.mark.parametrize("keep_1d_full", [False, True])
def test_compressed_momentum(keep_1d_full):
    """With momentum, SGD's buffer fed by the hook equals the hook's shared
    averaged momentum, is bit-identical on both ranks, tracks the true averaged
    momentum, and the biases (keep_1d_full) get exactly the true average."""
    (o0, comp0, m0, f0), (o1, comp1, m1, f1) = _dist.run(_momentum_worker, world=2,
                                                          args=(keep_1d_full,))
    assert torch.allclose(comp0, m0, atol=1e-5) and torch.allclose(comp1, m1, atol=1e-5)
    for a, b in zip(o0, o1):
        assert torch.equal(a["sgd_buf"], b["sgd_buf"])
    for s in range(2):  # warmup: exact
        assert torch.allclose(o0[s]["sgd_buf"], o0[s]["true_m"], atol=1e-5)
    last = o0[-1]
    err = (last["sgd_buf"] - last["true_m"]).norm() / last["true_m"].norm()
    assert 0 < err < 0.9, err  # compressed, yet close: error feedback works on the momentum
    if keep_1d_full:
        assert torch.allclose(last["sgd_buf"][-30:], last["true_m"][-30:], atol=1e-5)
    else:
        assert not torch.allclose(last["sgd_buf"][-30:], last["true_m"][-30:], atol=1e-5)


def test_exit_with_the_hooks_completion_in_flight_does_not_abort():
    """A script that ends while the onebit hook's completion thread is inside a
    torch call of its last bucket exits cleanly (squall.ddp stops that thread
    before the interpreter finalises), 200 times in a row."""
    import json
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, os.path.join(here, "hook_exit_loop.py"), "200"],
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=os.path.dirname(here)))
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["runs"] == 200 and result["aborts"] == 0 and result["failures"] == 0, result


def _register_worker(rank, world, hook):
    """squall.ddp.register on a DDP model whose optimizer is built after the
    hook (given as a function, as squall.lightning does), or with no
    averaging at all ('local')."""
    import squall.ddp

    squall.init()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 8))
    box = []
    state = squall.ddp.register(model, hook, optimizer=lambda: box[0], warmup_steps=1)
    box.append(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    grads = []
    for step in range(4):
        g = torch.Generator().manual_seed(10 * rank + step)
        box[0].zero_grad()
        model(torch.randn(16, 64, generator=g)).square().mean().backward()
        grads.append(model.module.weight.grad.clone())
        box[0].step()
    momentum = state.momentum_of() if hook == "onebit" else None
    return grads, [p.detach().clone() for p in model.parameters()], momentum


@pytest.mark.parametrize("hook", ["onebit", "local"])
def test_register(hook):
    (g0, p0, m0), (g1, p1, _) = _dist.run(_register_worker, world=2, args=(hook,))
    if hook == "onebit":  # the optimizer found at the first bucket: its momentum
        assert m0 == 0.9
        assert all(torch.equal(a, b) for a, b in zip(g0, g1))
        assert all(torch.equal(a, b) for a, b in zip(p0, p1))
    else:  # every rank keeps its own gradient
        assert not any(torch.equal(a, b) for a, b in zip(g0, g1))


def test_register_refuses_what_it_cannot_hook():
    import squall.ddp

    with pytest.raises(TypeError, match="DistributedDataParallel"):
        squall.ddp.register(torch.nn.Linear(2, 2))


def _resume_worker(rank, world, codec, beta):
    """10 steps of DDP with the onebit hook (2 of warmup), checkpointed after
    6: the steps after it as run on, resumed with the hook's state, and
    resumed without it."""
    import io

    from torch.nn.parallel import DistributedDataParallel as DDP

    import squall
    import squall.ddp

    squall.init()

    def build():
        model = _model()
        ddp = DDP(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=beta)
        state = squall.ddp.OnebitState(warmup_steps=2, codec=codec, optimizer=opt)
        ddp.register_comm_hook(state, squall.ddp.onebit_hook)
        return model, ddp, opt, state

    def steps(ddp, opt, first, last):
        losses = []
        for s in range(first, last):
            opt.zero_grad()
            x, y = _batch(rank, s)
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    model, ddp, opt, state = build()
    steps(ddp, opt, 0, 6)
    saved = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()},
               saved)
    out = {"went_on": steps(ddp, opt, 6, 10), "saved_buckets": len(state.buckets)}
    state.close()
    for name, with_hook in (("resumed", True), ("without", False)):
        saved.seek(0)
        ck = torch.load(saved, weights_only=False)
        model, ddp, opt, state = build()
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        if with_hook:
            state.load_state_dict(ck["hook"])
        out[name] = steps(ddp, opt, 6, 10)
        out[name + "_counters"] = state.counters()
        state.close()
    wrong = squall.ddp.OnebitState(codec="int8")
    with pytest.raises(squall.SquallInvalidArgument, match="saved compressing with"):
        wrong.load_state_dict(ck["hook"])
    with pytest.raises(squall.SquallInvalidArgument, match="each rank loads the state it saved"):
        wrong.load_state_dict(dict(ck["hook"], rank=1 - rank, codec="int8"))
    wrong.close()
    return out


@pytest.mark.parametrize("codec,beta", [("onebit", 0.9), ("int4:block=256", 0.0)])
def test_onebit_state_checkpoint_resumes_exactly(codec, beta):
    """OnebitState.state_dict in a checkpoint with the model and the
    optimizer: the resumed job's losses are the ones of the job that went on,
    bit for bit (residuals, shared momentum and step count restored), and
    without the hook's state they are not (warmup again, residuals lost)."""
    for r in _dist.run(_resume_worker, world=2, args=(codec, beta)):
        assert r["saved_buckets"] >= 1
        assert r["resumed"] == r["went_on"], r
        assert r["without"] != r["went_on"], r
        c = r["resumed_counters"]
        assert c["steps"] == 10 and c["full_calls"] == 2 and c["compressed_calls"] == 8, c
        assert r["without_counters"]["full_calls"] == 2, r


def _rebuild_worker(rank, world, keep_1d_full):
    from torch.nn.parallel import DistributedDataParallel as DDP

    import squall
    import squall.ddp

    squall.init()
    model = _model()
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    state = squall.ddp.OnebitState(warmup_steps=3, codec="onebit", optimizer=opt,
                                   keep_1d_full=keep_1d_full)
    ddp.register_comm_hook(state, squall.ddp.onebit_hook)
    for s in range(8):
        opt.zero_grad()
        x, y = _batch(rank, s)
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    (b,) = state.buckets.values()
    # DDP's first layout is the model's order here (the rebuilt one its reverse)
    params = list(model.parameters())
    comp = [p for p in params if not keep_1d_full or p.dim() > 1]
    sgd = torch.cat([opt.state[p]["momentum_buffer"].reshape(-1) for p in comp])
    state.close()
    return sgd, b.mbar.clone()


@pytest.mark.parametrize("keep_1d_full", [False, True])
def test_momentum_survives_ddps_bucket_rebuild(keep_1d_full):
    """DDP reorders its bucket after the first iteration (here the reverse of
    the first layout): the hook's shared momentum follows each parameter, so
    SGD's momentum buffers still equal it after the warmup and the compressed
    steps (before, the momentum kept the first layout's order while the
    gradients came in the new one)."""
    for sgd, mbar in _dist.run(_rebuild_worker, world=2, args=(keep_1d_full,)):
        assert torch.allclose(sgd, mbar, atol=1e-6), (sgd - mbar).abs().max()
