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


def _ddp_worker(rank, world, hook_name, warmup, steps):
    import copy

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import squall
    import squall.ddp

    squall.init()
    model = _model()
    local = copy.deepcopy(model)
    ddp = DDP(model)
    if hook_name == "onebit":
        state = squall.ddp.OnebitState(warmup_steps=warmup, codec="onebit")
        ddp.register_comm_hook(state, squall.ddp.onebit_hook)
    else:
        stub = _Stub(warmup)
        state = squall.ddp.APMSqueezeState(stub)
        ddp.register_comm_hook(state, squall.ddp.apmsqueeze_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
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
        if hook_name != "onebit":
            stub.steps += 1
    counters = {k: v for k, v in vars(state).items() if isinstance(v, int)}
    return out, counters, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("hook", ["onebit", "apmsqueeze"])
def test_ddp_hook(hook):
    warmup, steps = 2, 6
    (r0, c0, p0), (r1, c1, p1) = _dist.run(_ddp_worker, world=2, args=(hook, warmup, steps))
    for s in range(steps):
        a, b = r0[s], r1[s]
        if s < warmup:  # full precision: the true average, equal on both ranks
            assert torch.allclose(a["synced"], a["mean"], rtol=1e-5, atol=1e-6)
            assert torch.allclose(b["synced"], b["mean"], rtol=1e-5, atol=1e-6)
        elif hook == "onebit":  # compressed: bit-identical across ranks, not the mean
            assert torch.equal(a["synced"], b["synced"])
            assert not torch.allclose(a["synced"], a["mean"])
        else:  # no communication: each rank keeps its local gradient
            assert torch.allclose(a["synced"], a["local"], rtol=1e-6, atol=1e-7)
            assert torch.allclose(b["synced"], b["local"], rtol=1e-6, atol=1e-7)
            assert not torch.allclose(a["synced"], b["synced"])
    if hook == "onebit":
        assert c0["step"] == steps and c0["compressed_buckets"] > 0 and c0["full_buckets"] > 0
        assert all(torch.equal(x, y) for x, y in zip(p0, p1))  # same updates everywhere
    else:
        assert c0["allreduced_buckets"] > 0 and c0["skipped_buckets"] > 0
