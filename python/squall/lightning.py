"""Squall in Lightning: a DDP strategy that makes the Squall communicator
when Lightning creates the process group (on every rank, whichever way
Lightning started it) and puts a Squall comm hook on the DDP model, on CPU
as on GPU::

    import lightning as L
    import squall.lightning

    trainer = L.Trainer(devices=4, strategy=squall.lightning.DDPStrategy(hook="onebit"))

hook='onebit' (any optimizer; compressed momentum for momentum SGD),
'apmsqueeze' (configure_optimizers returns a squall.optim.APMSqueeze) or
'local' (it returns a squall.optim.SlowMo). Lightning's own DDPStrategy
registers ``ddp_comm_hook=`` on CUDA devices only; this one registers
everywhere. Works with ``lightning`` (``lightning.pytorch``) and, when that is
absent, ``pytorch_lightning``.
"""

import squall
import squall.ddp

try:
    from lightning.pytorch.strategies import DDPStrategy as _LightningDDP
except ImportError:  # the standalone package
    from pytorch_lightning.strategies import DDPStrategy as _LightningDDP


class DDPStrategy(_LightningDDP):
    """Lightning's DDPStrategy with a Squall comm hook (see the module).

    warmup: full-precision steps of the 'onebit' hook (APMSqueeze has its
    own); codec: the hook's code; transport and timeout: squall.init()'s.
    Every other argument is Lightning's."""

    strategy_name = "squall_ddp"

    def __init__(self, hook="onebit", warmup=squall.ddp.DEFAULT_WARMUP_STEPS,
                 codec=squall.ddp.DEFAULT_CODEC, transport=None, timeout=None, **kwargs):
        if hook not in ("onebit", "apmsqueeze", "local"):
            raise ValueError(f"squall.lightning.DDPStrategy: hook is 'onebit', 'apmsqueeze' or "
                             f"'local', not {hook!r}")
        super().__init__(**kwargs)
        self.squall_hook, self.squall_warmup, self.squall_codec = hook, warmup, codec
        self._squall_init = {"transport": transport, "timeout": timeout}
        self.squall_state = None

    def setup_distributed(self):
        super().setup_distributed()  # every rank: the process group exists now
        squall.init(**self._squall_init)

    def _register_ddp_hooks(self):
        self.squall_state = squall.ddp.register(
            self.model, self.squall_hook, optimizer=self._squall_optimizer,
            warmup_steps=self.squall_warmup, codec=self.squall_codec)

    def _squall_optimizer(self):
        if not self.optimizers:
            raise squall.SquallInvalidUsage(
                "squall.lightning.DDPStrategy: the model ran a backward pass before Lightning "
                "set up its optimizer; return one from configure_optimizers")
        return self.optimizers[0]
