"""APMSqueeze's compressed stage in the form that fits a sharded model, for
the FSDP2 study (perf/fsdp/study.py, methods apms_*): the question the
sharded default answers is whether to compress gradients (squall.fsdp's
default, AdamW on the averaged shard) or momentum, as APMSqueeze does.

APMSqueeze freezes Adam's variance after a full-precision warmup, then each
rank keeps the momentum of its own gradients and the ranks average that
momentum compressed, with error feedback. Sharded, the average is a
reduce-scatter: every FSDP module's MomentumReduceScatter keeps this rank's
momentum of the module's whole local gradient (the memory sharding exists
to save: 4 bytes per parameter per rank), and after `warmup` calls sends it
through squall.fsdp's compressed reduce-scatter, bias-corrected from the
freeze on (the local momentum starts at zero there), so each rank receives
the averaged momentum of its shard where FSDP puts its gradient.
FrozenVarianceAdam is the optimizer on the shards: AdamW for `warmup` steps,
then v frozen and the averaged momentum applied as it came,
p -= lr * m / (sqrt(v) + eps), with APMSqueeze's guard (elements whose
gradient stayed zero through the warmup do not move; no step over
max_update * lr).

State per rank, besides the parameter shards: momentum of the local
gradient, 4 bytes per parameter, plus the reduce-scatter's residual, 8 (4
with bf16 residuals), plus the frozen variance of the shard, 4 / N, against
8 + 8 / N for AdamW on compressed gradients (its m and v of the shard).
"""

import math

import torch

import squall.fsdp


class MomentumReduceScatter(squall.fsdp.ReduceScatter):
    """A module's reduce-scatter that, after the warmup's full-precision
    calls, sends this rank's momentum of its local gradient instead of the
    gradient (bias-corrected for its start at zero when the warmup ends)."""

    def __init__(self, codec, warmup, comms, beta1, name=""):
        super().__init__(codec, warmup, comms, name)
        self.beta1, self.momentum, self.since_freeze = beta1, None, 0

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        if self.calls < self.warmup:  # the warmup: the gradient at full precision
            return super().__call__(output_tensor, input_tensor, group, op, async_op)
        if self.momentum is None or self.momentum.numel() != input_tensor.numel():
            self.momentum = torch.zeros_like(input_tensor)
        self.momentum.mul_(self.beta1).add_(input_tensor, alpha=1 - self.beta1)
        self.since_freeze += 1
        sent = self.momentum / (1 - self.beta1 ** self.since_freeze)
        return super().__call__(output_tensor, sent, group, op, async_op)


def attach(model, codec, warmup, beta1):
    """A MomentumReduceScatter on every FSDPModule of the model; returns a
    squall.fsdp.Compressed over them (stats, bytes)."""
    modules, _ = squall.fsdp._fsdp_modules(model)
    comms = squall.fsdp._Comms(None)
    ids = {id(m) for m in modules}
    made = []
    for name, m in model.named_modules():
        if id(m) in ids:
            made.append(MomentumReduceScatter(codec, warmup, comms, beta1, name))
            m.set_custom_reduce_scatter(made[-1])
    return squall.fsdp.Compressed(made)


class FrozenVarianceAdam(torch.optim.Optimizer):
    """AdamW on the shards for `warmup` steps; then the variance frozen and
    each shard's gradient taken as the averaged momentum it already is."""

    def __init__(self, params, lr, warmup, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 max_update=None):
        b1, b2 = betas
        if max_update is None:  # the largest step full-precision Adam takes with these betas
            max_update = (1 - b1) / math.sqrt((1 - b2) * (1 - b1 * b1 / b2))
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.warmup, self.max_update, self.steps = warmup, max_update, 0

    @torch.no_grad()
    def step(self, closure=None):
        self.steps += 1
        frozen = self.steps > self.warmup
        for group in self.param_groups:
            b1, b2 = group["betas"]
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                x = p.to_local() if hasattr(p, "to_local") else p
                st = self.state[p]
                if not st:
                    st["m"], st["v"] = torch.zeros_like(x), torch.zeros_like(x)
                if wd:
                    x.mul_(1 - lr * wd)
                if not frozen:
                    st["m"].mul_(b1).add_(g, alpha=1 - b1)
                    st["v"].mul_(b2).addcmul_(g, g, value=1 - b2)
                    m_hat = st["m"] / (1 - b1 ** self.steps)
                    v_hat = st["v"] / (1 - b2 ** self.steps)
                    x.addcdiv_(m_hat, v_hat.sqrt().add_(eps), value=-lr)
                    if self.steps == self.warmup:  # freeze: bias-corrected, m no longer kept
                        st["v"], st["moving"] = v_hat, st["v"] > 0
                        del st["m"]
                    continue
                update = (g / (st["v"].sqrt() + eps)).clamp_(-self.max_update, self.max_update)
                x.sub_(lr * update * st["moving"])
