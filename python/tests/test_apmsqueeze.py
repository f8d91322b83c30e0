"""APMSqueeze over the C optimizer (include/squall/optim.h)."""

import pytest
import torch

import _dist
import squall

pytestmark = pytest.mark.skipif(
    not squall.HAVE_OPTIM,
    reason=f"the loaded libsquall ({squall.library_path}) has no squallOptimizerCreate: the C "
    "optimizer core (include/squall/optim.h) is not merged/built yet")

WORLD = 2


def _grad(rank, step, p, salt):
    g = torch.Generator().manual_seed(100000 * salt + 1000 * rank + step)
    return torch.randn(p.shape, generator=g) + 0.1 * p.detach()


def _params():
    g = torch.Generator().manual_seed(11)
    return [torch.randn(300, generator=g).requires_grad_(),        # group 0
            torch.randn(40, 60, generator=g).requires_grad_(),     # group 0 (2-D)
            torch.randn(50, generator=g).requires_grad_(),         # group 1
            torch.randn(25, generator=g).requires_grad_(),         # group 2: zero gradients
            torch.randn(9, generator=g).requires_grad_()]          # group 0: never gets a grad


def _groups(ps):
    return [{"params": [ps[0], ps[1], ps[4]]},
            {"params": [ps[2]], "lr": 3e-3, "weight_decay": 0.0},
            {"params": [ps[3]], "weight_decay": 0.0}]


HYPER = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)


def _set_grads(ps, rank, step, world=None):
    """Rank `rank`'s gradients; with world, the average over all ranks."""
    for i, p in enumerate(ps[:3]):
        if world is None:
            p.grad = _grad(rank, step, p, i)
        else:
            p.grad = sum(_grad(r, step, p, i) for r in range(world)) / world
    ps[2].grad[::3] = 0.0  # scattered always-zero gradients (group 1, no weight decay)
    ps[3].grad = torch.zeros_like(ps[3])
    ps[4].grad = None


def _schedule(opt):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + 0.1 * s))


def _apm_worker(rank, world, warmup, compressed_steps, warmup_codec="none", codec=None):
    from squall.optim import APMSqueeze

    squall.init()
    ps = _params()
    initial = [p.detach().clone() for p in ps]
    chosen = {} if codec is None else {"codec": codec}
    opt = APMSqueeze(_groups(ps), warmup=warmup, warmup_codec=warmup_codec, **chosen, **HYPER)
    sched = _schedule(opt)
    ref_ps = _params()
    ref = torch.optim.AdamW(_groups(ref_ps), **HYPER)
    ref_sched = _schedule(ref)
    out = {"warmup_diff": [], "snapshots": [], "phases": []}
    for s in range(warmup):
        assert opt.in_warmup
        _set_grads(ps, rank, s)
        opt.step()
        sched.step()
        _set_grads(ref_ps, rank, s, world)
        ref.step()
        ref_sched.step()
        out["warmup_diff"].append(max(float((a - b).abs().max()) for a, b in zip(ps, ref_ps)))
    out["info_after_warmup"] = opt.info(0)
    out["in_warmup_after"] = opt.in_warmup
    for s in range(warmup, warmup + compressed_steps):
        _set_grads(ps, rank, s)
        # non-contiguous gradients are fine (copied into the flat buffer)
        ps[1].grad = ps[1].grad.t().contiguous().t()
        assert not ps[1].grad.is_contiguous()
        opt.step()
        sched.step()
        out["snapshots"].append(torch.cat([p.detach().reshape(-1) for p in ps]))
    out["info"] = [opt.info(i) for i in range(3)]
    out["zero_moved"] = float((ps[3].detach() - initial[3]).abs().max())
    out["scattered_zero_moved"] = float((ps[2].detach() - initial[2])[::3].abs().max())
    out["others_moved"] = float((ps[2].detach() - initial[2])[1::3].abs().min())
    out["none_moved"] = float((ps[4].detach() - initial[4]).abs().max())
    out["moved"] = float((ps[0].detach() - initial[0]).abs().max())
    return out


@pytest.mark.parametrize("warmup_codec,codec", [("none", None), (None, None),
                                               ("none", "int4:block=64"), ("none", "int2:block=64")])
def test_apmsqueeze_warmup_equals_adamw_then_identical_ranks(warmup_codec, codec):
    """fp32 warmup: AdamW to 1e-6; the default (bf16) warmup: within one step (lr) of it.
    Not closer: where the ranks' gradients nearly cancel, the rounded average differs
    in relative terms, and Adam's early steps are about lr * sign(g) there. The
    compressed phase with the default codec (1-bit momentum) and with int4 and int2."""
    warmup, compressed = 6, 50
    res = _dist.run(_apm_worker, world=WORLD, args=(warmup, compressed, warmup_codec, codec),
                    timeout=120)
    for r in res:
        if warmup_codec == "none":
            assert max(r["warmup_diff"]) < 1e-6, r["warmup_diff"]
        else:
            assert 0 < max(r["warmup_diff"]) < HYPER["lr"], r["warmup_diff"]
        assert r["info_after_warmup"]["phase"] == "compressed"
        assert r["info_after_warmup"]["warmup_steps"] == warmup
        assert not r["in_warmup_after"]
        assert r["info"][0]["step"] == warmup + compressed
        assert r["zero_moved"] == 0.0, "a group with zero gradients moved"
        # Scattered zeros share codec blocks with live elements: the guard holds them.
        assert r["scattered_zero_moved"] == 0.0, "always-zero gradients moved"
        assert r["others_moved"] > 0
        assert r["none_moved"] == 0.0, "a parameter without a gradient moved"
        assert r["moved"] > 0
    for a, b in zip(res[0]["snapshots"], res[1]["snapshots"]):
        assert torch.equal(a, b)  # bit-identical on every rank, every compressed step


def _ckpt_worker(rank, world, path, resume):
    from squall.optim import APMSqueeze

    squall.init()
    ps = _params()
    opt = APMSqueeze(_groups(ps), warmup=0.25, total_steps=16, **HYPER)  # 4 warmup steps
    start = 0
    if resume:
        ck = torch.load(f"{path}.{rank}")
        with torch.no_grad():
            for p, v in zip(ps, ck["params"]):
                p.copy_(v)
        opt.load_state_dict(ck["opt"])
        start = 7
        assert opt.info(0)["step"] == 7 and not opt.in_warmup
    for s in range(start, 16):
        if s == 7 and not resume:
            torch.save({"params": [p.detach().clone() for p in ps], "opt": opt.state_dict()},
                       f"{path}.{rank}")
        _set_grads(ps, rank, s)
        opt.step()
    return [p.detach().clone() for p in ps], opt.info(0)


def test_apmsqueeze_state_dict_resumes_bit_identically(tmp_path):
    path = str(tmp_path / "apm.pt")
    first = _dist.run(_ckpt_worker, world=WORLD, args=(path, False))
    again = _dist.run(_ckpt_worker, world=WORLD, args=(path, True))
    assert first[0][1]["warmup_steps"] == 4
    for (pa, ia), (pb, ib) in zip(first, again):
        assert all(torch.equal(x, y) for x, y in zip(pa, pb))
        assert ia["step"] == ib["step"] == 16
    assert all(torch.equal(x, y) for x, y in zip(first[0][0], first[1][0]))


def _bad_worker(rank, world):
    from squall.optim import APMSqueeze

    squall.init()
    raised = []

    def expect(exc, match, fn):
        with pytest.raises(exc, match=match):
            fn()
        raised.append(match)

    p32 = torch.zeros(4, requires_grad=True)
    p16 = torch.zeros(4, dtype=torch.float16, requires_grad=True)
    expect(squall.SquallInvalidArgument, "mixes",
           lambda: APMSqueeze([p32, p16], warmup=2))
    expect(squall.SquallInvalidArgument, "float32",
           lambda: APMSqueeze([p16], warmup=2))
    expect(squall.SquallInvalidArgument, "total_steps", lambda: APMSqueeze([p32]))
    expect(squall.SquallInvalidArgument, "fraction", lambda: APMSqueeze([p32], warmup=1.5))
    expect(squall.SquallInvalidArgument, "lr", lambda: APMSqueeze([p32], lr=0.0, warmup=1))
    expect(squall.SquallInvalidArgument, "max_update",
           lambda: APMSqueeze([p32], warmup=1, max_update=-1.0))
    expect(squall.SquallInvalidArgument, "guard", lambda: APMSqueeze([p32], warmup=1, guard=1))
    shape = (5,) if rank == 0 else (6,)
    expect(squall.SquallInvalidUsage, "differ across ranks",
           lambda: APMSqueeze([torch.zeros(shape, requires_grad=True)], warmup=1))
    emb = torch.nn.Embedding(10, 3, sparse=True)
    opt = APMSqueeze(emb.parameters(), warmup=1)
    emb(torch.tensor([1, 2])).sum().backward()
    expect(squall.SquallInvalidArgument, "sparse gradients", opt.step)
    opt2 = APMSqueeze([p32], warmup=1)
    opt2.param_groups[0]["betas"] = (0.5, 0.5)
    p32.grad = torch.ones(4)
    expect(squall.SquallInvalidUsage, "only lr may change", opt2.step)
    expect(squall.SquallInvalidArgument, "not an APMSqueeze state dict",
           lambda: opt2.load_state_dict({"state": {}, "param_groups": []}))
    # the communicator still works after all of that
    x = torch.ones(2)
    squall.allreduce(x, op="sum")
    assert (x == world).all()
    return raised


def _defaults_worker(rank, world):
    from squall import _lib
    from squall.optim import APMSqueeze

    squall.init()
    opt = APMSqueeze([torch.zeros(4, requires_grad=True)], warmup=1)
    cfg = _lib.OptimConfig()  # what a C caller's SQUALL_OPTIM_CONFIG_INIT holds
    return ((opt._spec.codec, opt._spec.scale, opt._spec.blockSize),
            (cfg.codec.codec, cfg.codec.scale, cfg.codec.blockSize))


def test_apmsqueeze_default_codec_is_rms_onebit_in_64_element_blocks():
    """The study's default (docs/convergence.md): the same in Python and in the C config."""
    from squall import _lib

    want = (_lib.CODEC_ONEBIT, _lib.SCALE_RMS, 64)
    for py, c in _dist.run(_defaults_worker, world=WORLD):
        assert py == want and c == want


def test_apmsqueeze_bad_input():
    res = _dist.run(_bad_worker, world=WORLD)
    assert res[0] == res[1] and len(res[0]) == 11


def _ddp_apm_worker(rank, world, warmup, steps):
    from torch.nn.parallel import DistributedDataParallel as DDP

    import squall.ddp
    from squall.optim import APMSqueeze

    squall.init()
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    ddp = DDP(model)
    opt = APMSqueeze(ddp.parameters(), lr=1e-2, warmup=warmup)
    state = squall.ddp.APMSqueezeState(opt)
    ddp.register_comm_hook(state, squall.ddp.apmsqueeze_hook)
    for s in range(steps):
        g = torch.Generator().manual_seed(1000 * rank + s)
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 2, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()], state.allreduced_buckets, \
        state.skipped_buckets


def test_ddp_apmsqueeze_hook_with_optimizer():
    (p0, a0, s0), (p1, a1, s1) = _dist.run(_ddp_apm_worker, world=WORLD, args=(3, 8))
    assert all(torch.equal(x, y) for x, y in zip(p0, p1))
    assert a0 > 0 and s0 > 0 and (a0, s0) == (a1, s1)


def _wrapper_copy_worker(rank, world):
    """A wrapper made as Lightning's LightningOptimizer makes one (a class
    derived from the optimizer's, the optimizer's __dict__ copied in), then
    dropped: the optimizer itself goes on stepping."""
    import gc

    from squall.optim import APMSqueeze

    squall.init()
    p = torch.nn.Parameter(torch.ones(64))
    opt = APMSqueeze([p], lr=1e-2, warmup=1)

    class Wrapper:
        def __init__(self, optimizer):
            self.__dict__ = {k: v for k, v in optimizer.__dict__.items() if k != "step"}
            self.__class__ = type("Wrapped" + type(optimizer).__name__,
                                  (Wrapper, type(optimizer)), {})

    Wrapper(opt)
    gc.collect()
    for step in range(3):
        p.grad = torch.full_like(p, 0.1 * (rank + 1))
        opt.step()
    return p.detach().clone()


def test_a_copy_of_the_optimizer_does_not_close_it():
    results = _dist.run(_wrapper_copy_worker, world=WORLD)
    assert torch.equal(results[0], results[1])
    assert not torch.equal(results[0], torch.ones(64))
