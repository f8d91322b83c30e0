"""The patches squallrun installs in a worker before the user's script runs
(see squall/run.py). Each acts when the script builds the object it patches."""

import functools
import json
import os
import weakref

_installed = False
_rank = None  # this process's rank, once its default process group exists
_uncompressed = []  # why some of the script's training was left as it is


def _comm():
    import squall

    try:
        return squall.get_default()
    except squall.SquallInvalidUsage:
        # Normally made when the script created its process group (below);
        # this is for a group made some other way. Collective: every rank
        # builds its model and optimizer alike.
        return squall.init()


def _after_process_group():
    """Runs where every rank runs: right after the script (or its framework:
    Lightning, Accelerate, a spawned worker) created the default process
    group. Makes the Squall communicator there, not inside a constructor that
    only some ranks may reach."""
    global _rank
    import torch.distributed as dist

    import squall

    _rank = dist.get_rank()
    if os.environ.get("SQUALL_RUN_REPORT"):
        # A rank forked by multiprocessing (Accelerate's notebook_launcher)
        # leaves through os._exit, past atexit; its finalizers still run.
        import multiprocessing.util

        multiprocessing.util.Finalize(None, _report, args=(os.environ["SQUALL_RUN_REPORT"],),
                                      exitpriority=0)
    squall.init()


def _sharded(params):
    """Why these parameters are shards of a model (FSDP2's DTensors, FSDP1's
    flat parameters or the original ones it flattened), or None. Squall's
    optimizers and hooks average whole replicas, which shards are not."""
    for p in params:
        if type(p).__name__ == "DTensor" or type(p).__name__ == "FlatParameter" or getattr(
                p, "_fsdp_flattened", False):
            return "FSDP shards them (each rank holds a different piece of each parameter)"
    return None


def _leave_uncompressed(what, reason):
    """Says once per process, on the first rank, that `what` trains as the
    script wrote it and why: nothing stays uncompressed silently."""
    line = f"squallrun: {what} left as the script wrote it, uncompressed: {reason}"
    if line not in _uncompressed:
        _uncompressed.append(line)
        if _rank in (None, 0):
            import sys

            print(line, file=sys.stderr, flush=True)


_fsdp_compressed_params = set()  # ids of the parameters of FSDP modules compressed below
_fsdp_reduce_scatters = []  # their squall.fsdp.ReduceScatter objects
_fsdp_all_gathers = []  # squall.fsdp.AllGather objects (--fsdp-params)


def _compress_fsdp(config):
    """Every module FSDP2's fully_shard makes, and every FSDP1 unit, gets
    squall.fsdp's compressed reduce-scatter (one set of communicators for the
    process)."""
    try:
        import torch.distributed.fsdp as fsdp_pkg
        from torch.distributed.fsdp._fully_shard import _fully_shard as impl
    except Exception:  # noqa: BLE001 - no FSDP2 (torch 1.13's fsdp fails to import on 3.11)
        return
    import squall.fsdp

    original = impl.fully_shard
    comms = squall.fsdp._Comms(None)

    def fully_shard(module, *args, **kwargs):
        result = original(module, *args, **kwargs)
        for m in result if isinstance(result, (list, tuple)) else [result]:
            _fsdp_reduce_scatters.append(squall.fsdp.attach(
                m, config.get("fsdp_codec") or squall.fsdp.DEFAULT_CODEC, config["warmup"],
                comms))
            if config.get("fsdp_params"):
                _fsdp_all_gathers.append(squall.fsdp.AllGather(
                    config["fsdp_params"], comms, reuse=not config.get("fsdp_no_reuse"),
                    module=m))
                m.set_custom_all_gather(_fsdp_all_gathers[-1])
            _fsdp_compressed_params.update(id(p) for p in m.parameters())
        return result

    # Its name, doc and attributes (fully_shard.state, which torch's own code
    # reads through the defining module's global, so that one is left as it is).
    functools.update_wrapper(fully_shard, original)
    for holder in (fsdp_pkg, getattr(fsdp_pkg, "_fully_shard", None)):
        if holder is not None and getattr(holder, "fully_shard", None) is original:
            holder.fully_shard = fully_shard

    # FSDP1: each unit (the auto-wrapped ones are made through this same
    # constructor) gets the compressed reduce-scatter as its communication hook.
    fsdp1 = fsdp_pkg.FullyShardedDataParallel
    original_init = fsdp1.__init__

    def fsdp1_init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        rs, why = squall.fsdp.attach_fsdp1(
            self, config.get("fsdp_codec") or squall.fsdp.DEFAULT_CODEC, config["warmup"], comms)
        if rs is None:
            _leave_uncompressed("an FSDP1 unit", why)
            return
        _fsdp_reduce_scatters.append(rs)
        _fsdp_compressed_params.update(id(p) for p in self.parameters())
        if config.get("fsdp_params"):
            _leave_uncompressed("an FSDP1 unit's parameter all-gather",
                                "FSDP1 takes no custom all-gather (--fsdp-params is FSDP2's)")

    fsdp1.__init__ = fsdp1_init


def _param_list(params):
    """(params as a list, whether tensors or groups; every tensor in them)."""
    params = list(params)
    if params and isinstance(params[0], dict):
        return params, [p for g in params for p in g["params"]]
    return params, params


class _LazyApmState:
    """apmsqueeze_hook's state for a DDP model whose optimizer is built later:
    finds the APMSqueeze over the model's parameters at the first bucket."""

    def __init__(self, module):
        import squall.ddp

        self._module, self._state = module, None
        self._make = squall.ddp.APMSqueezeState

    def _resolve(self):
        if self._state is None:
            ids = {id(p) for p in self._module.parameters()}
            for opt in _optimizers:
                if any(id(p) in ids for g in opt.param_groups for p in g["params"]):
                    self._state = self._make(opt)
                    break
            else:
                return None
        return self._state

    def __getattr__(self, name):  # optimizer, comm, counters: the real state's
        state = self._resolve()
        if state is None:
            raise AttributeError(name)
        return getattr(state, name)


def _apm_hook(state, bucket):
    import squall.ddp

    real = state._resolve()
    if real is None:  # no APMSqueeze over this model (yet): plain average
        buf = bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()
        _comm().allreduce(buf, "avg")
        fut = __import__("torch").futures.Future()
        fut.set_result(buf)
        return fut
    return squall.ddp.apmsqueeze_hook(real, bucket)


class _LazyOptimizer:
    """onebit_hook's `optimizer` for a DDP model whose optimizer is built later:
    the param_groups of the first optimizer over the model's parameters, found
    at the first bucket; none found: no momentum (gradients are compressed)."""

    _NONE = [{"momentum": 0.0, "dampening": 0.0}]

    def __init__(self, module):
        self._module, self._opt = module, None

    @property
    def param_groups(self):
        if self._opt is None:
            ids = {id(p) for p in self._module.parameters()}
            for ref in _all_optimizers:
                opt = ref()
                if opt is not None and any(id(p) in ids for g in opt.param_groups
                                           for p in g["params"]):
                    self._opt = opt
                    break
            else:
                return self._NONE
        return self._opt.param_groups


_all_optimizers = []  # weak references to every torch optimizer (--hook onebit)
_optimizers = []  # the APMSqueeze optimizers made by the patched Adam/AdamW
_states = []  # the hook states registered on DDP models
_slowmo_count = [0]  # optimizers wrapped in SlowMo


def _momentum_or_reason(state):
    """The hook's momentum for the report, or why it has none (a report at
    exit must not fail on an optimizer the hook cannot follow)."""
    try:
        return state.momentum_of()
    except (ValueError, RuntimeError) as e:
        return f"unavailable: {e}"


def _report(directory):
    """At exit: what the patches did on this rank, as JSON (SQUALL_RUN_REPORT).
    A process that is no rank (a launcher, the parent of spawned ranks)
    writes nothing."""
    rank = _rank if _rank is not None else os.environ.get("RANK",
                                                           os.environ.get("SLURM_PROCID"))
    if rank is None:
        return
    report = {"ddp_hooks": len(_states), "optimizers": len(_optimizers),
              "slowmo_optimizers": _slowmo_count[0], "uncompressed": _uncompressed,
              "fsdp_modules": len(_fsdp_reduce_scatters),
              "fsdp_compressed_calls": sum(r.compressed_calls for r in _fsdp_reduce_scatters),
              "fsdp_bytes_sent": sum(r.stats["bytes_sent"] for r in _fsdp_reduce_scatters),
              "fsdp_all_gather_calls": sum(g.compressed_calls for g in _fsdp_all_gathers),
              "fsdp_all_gather_reused_calls": sum(g.reused_calls for g in _fsdp_all_gathers),
              "fsdp_all_gather_bytes_sent": sum(g.stats["bytes_sent"] for g in _fsdp_all_gathers),
              "compressed_buckets": sum(getattr(s, "compressed_buckets", 0) for s in _states),
              "bytes_sent": sum(s.stats["bytes_sent"] for s in _states
                                if hasattr(s, "traffic")),
              "hook_momentum": [_momentum_or_reason(s) for s in _states
                                if hasattr(s, "momentum_of")]}
    with open(os.path.join(directory, f"squallrun-rank{rank}.json"), "w") as f:
        json.dump(report, f)


def install():
    global _installed
    if _installed:
        return
    _installed = True
    config = json.loads(os.environ["SQUALL_RUN_CONFIG"])
    import torch

    import squall
    import squall.ddp
    import squall.optim

    if os.environ.get("SQUALL_RUN_REPORT"):
        import atexit

        atexit.register(_report, os.environ["SQUALL_RUN_REPORT"])
    if config.get("hook") or config.get("optimizer") or config.get("slowmo"):
        import torch.distributed as dist
        from torch.distributed import distributed_c10d

        original_init_pg = distributed_c10d.init_process_group

        def init_process_group(*args, **kwargs):
            result = original_init_pg(*args, **kwargs)
            _after_process_group()
            return result

        init_process_group.__doc__ = original_init_pg.__doc__
        init_process_group.__wrapped__ = original_init_pg
        dist.init_process_group = distributed_c10d.init_process_group = init_process_group

    ddp_type = torch.nn.parallel.DistributedDataParallel
    original_ddp_init = ddp_type.__init__

    def ddp_init(self, *args, **kwargs):
        original_ddp_init(self, *args, **kwargs)
        sharded = _sharded(self.module.parameters())
        if sharded:
            _leave_uncompressed("a DistributedDataParallel model", sharded)
        elif config.get("hook") == "onebit":
            state = squall.ddp.OnebitState(comm=_comm(), warmup_steps=config["warmup"],
                                           codec=config["codec"],
                                           optimizer=_LazyOptimizer(self.module))
            _states.append(state)
            self.register_comm_hook(state, squall.ddp.onebit_hook)
        elif config.get("optimizer") == "apmsqueeze":
            _comm()
            self.register_comm_hook(_LazyApmState(self.module), _apm_hook)
        elif config.get("slowmo"):
            squall.ddp.register(self, "local")  # SlowMo averages the parameters itself

    ddp_type.__init__ = ddp_init

    if config.get("hook") == "onebit":
        _compress_fsdp(config)
        original_opt_init = torch.optim.Optimizer.__init__

        def opt_init(self, *args, **kwargs):
            original_opt_init(self, *args, **kwargs)
            _all_optimizers[:] = [ref for ref in _all_optimizers if ref() is not None]
            _all_optimizers.append(weakref.ref(self))
            params = [p for g in self.param_groups for p in g["params"]]
            sharded = _sharded(p for p in params if id(p) not in _fsdp_compressed_params)
            if sharded:  # shards of a model whose reduce-scatter is not compressed
                _leave_uncompressed(f"torch.optim.{type(self).__name__} and its model "
                                    "(--hook onebit compresses DistributedDataParallel and "
                                    "FSDP's sharded strategies only)", sharded)

        torch.optim.Optimizer.__init__ = opt_init

    if config.get("optimizer") == "apmsqueeze":
        def replacement(name, coupled_decay):
            original = getattr(torch.optim, name)

            def make(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                     weight_decay=0.0 if coupled_decay else 1e-2, amsgrad=False,
                     decoupled_weight_decay=not coupled_decay, **kwargs):
                params, flat = _param_list(params)
                sharded = _sharded(flat)
                if sharded:
                    _leave_uncompressed(f"torch.optim.{name}", sharded)
                    extra = {} if name == "AdamW" or not decoupled_weight_decay else {
                        "decoupled_weight_decay": True}
                    return original(params, lr=lr, betas=betas, eps=eps,
                                    weight_decay=weight_decay, amsgrad=amsgrad, **extra,
                                    **kwargs)
                # torch 2.x's Adam(decoupled_weight_decay=True) is AdamW.
                if not decoupled_weight_decay and weight_decay:
                    raise squall.SquallUnsupported(
                        f"squallrun: torch.optim.Adam(weight_decay={weight_decay}) adds the decay "
                        "to the gradient (L2); APMSqueeze decays the weights (AdamW). Use "
                        "torch.optim.AdamW in the script, or run without --optimizer")
                for key in ("foreach", "capturable", "differentiable", "fused", "maximize"):
                    if not kwargs.get(key):
                        kwargs.pop(key, None)  # torch's defaults: APMSqueeze takes them as is
                opt = squall.optim.APMSqueeze(params, lr=lr, betas=betas, eps=eps,
                                              weight_decay=weight_decay, amsgrad=amsgrad,
                                              warmup=config["warmup"], codec=config["codec"],
                                              comm=_comm(), **kwargs)
                _optimizers.append(opt)
                return opt

            make.__name__ = make.__qualname__ = name
            return make

        torch.optim.Adam = replacement("Adam", True)
        torch.optim.AdamW = replacement("AdamW", False)

    if config.get("slowmo"):
        tau = int(config["slowmo"])
        fragments, delay = config.get("slowmo_stream") or (1, 0)
        for name in ("SGD", "Adam", "AdamW", "RMSprop", "Adagrad"):
            base_type = getattr(torch.optim, name, None)
            if base_type is None:
                continue

            def wrapped(*args, _base=base_type, **kwargs):
                base = _base(*args, **kwargs)
                sharded = _sharded(p for g in base.param_groups for p in g["params"])
                if sharded:
                    _leave_uncompressed(f"torch.optim.{_base.__name__} (--slowmo)", sharded)
                    return base
                _slowmo_count[0] += 1
                return squall.optim.SlowMo(base, tau=tau, fragments=fragments, delay=delay,
                                           comm=_comm())

            wrapped.__name__ = wrapped.__qualname__ = name
            setattr(torch.optim, name, wrapped)
