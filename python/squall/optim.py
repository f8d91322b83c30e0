"""Optimizers over Squall's communicators: APMSqueeze (C core) and SlowMo.

APMSqueeze copies each parameter group into one contiguous fp32 buffer every
step (and the gradients into another), runs the C optimizer on it and copies
the result back into the parameters. Parameters stay ordinary tensors (any
storage); the price is two copies of the group per step. The flat buffers
live where the group lives:

* CPU parameters: host buffers, squallOptimizerStep.
* CUDA parameters (all on one GPU) with a communicator from NCCL: device
  buffers on that GPU, squallOptimizerStepOnStream on the current stream (the
  optimizer state lives on the GPU; nothing is staged through the host).
* CUDA parameters with a host communicator: device buffers, each copied to a
  host buffer and back around squallOptimizerStep (one copy each way per
  step, what squallOptimizerStepOnStream does in C, but it works with a
  libsquall built without CUDA).
"""

import ctypes
import gc
import hashlib
import logging
import math
import warnings
import weakref

import torch

from . import _cuda, _lib
from ._comm import Compressor, Traffic, get_default
from ._lib import SquallInvalidArgument, SquallInvalidUsage, SquallUnsupported, check, lib
from .codec import parse_codec

log = logging.getLogger("squall")

_MODES = {"apmsqueeze": _lib.MODE_APMSQUEEZE, "sync": _lib.MODE_SYNC, "local": _lib.MODE_LOCAL}
_TINY_LR = 1.1754943508222875e-38  # smallest normal fp32: stands for lr == 0 (0 means "configured")


def _same_everywhere(comm, value):
    """Collective: True on every rank when repr(value) is the same on all of them."""
    digest = int.from_bytes(hashlib.sha256(repr(value).encode()).digest()[:7], "little")
    v = _cuda.zeros(2, torch.int64, comm.device)  # a communicator from NCCL reduces on its GPU
    v[0], v[1] = digest, -digest
    comm.allreduce(v, "max")
    return int(v[0]) == digest and int(-v[1]) == digest


def _check_same_across_ranks(comm, params_groups, what):
    """Collective: raises on every rank when the parameter shapes differ."""
    shapes = [[tuple(p.shape) for p in g] for g in params_groups]
    if not _same_everywhere(comm, shapes):
        raise SquallInvalidUsage(
            f"squall: {what}: the parameter groups differ across ranks (number of groups, "
            f"parameters or shapes); this rank has {shapes if len(repr(shapes)) < 300 else '...'}."
            " Every rank must build the same model and the same parameter groups")


def _check_same_setting(comm, setting, what):
    """Collective: raises on every rank when the settings differ."""
    if not _same_everywhere(comm, setting):
        raise SquallInvalidUsage(
            f"squall: {what}: the settings differ across ranks; this rank has {setting!r}. "
            "Every rank must build it with the same arguments")


def _broadcast_params(comm, params_groups):
    """Collective: every rank's parameters become rank 0's, bit for bit."""
    for params in params_groups:
        numel = sum(p.numel() for p in params)
        if numel == 0:
            continue
        device = comm.device if comm._nccl is not None else None
        flat = _flatten_into(_cuda.zeros(numel, torch.float32, device), params)
        if comm._nccl is not None:  # NCCL communicators only reduce: everyone adds zeros
            if comm.rank != 0:
                flat.zero_()
            comm.allreduce(flat, "sum")
        else:
            comm.broadcast(flat, 0)
        with torch.no_grad():
            _unflatten_from(flat, params)


def _check_hyper_across_ranks(comm, rows, what):
    """Collective: raises on every rank when a hyper-parameter differs between
    ranks, naming the first rank that differs from rank 0, the name and both
    values. `rows` is a list of (name, float value)."""
    k = len(rows)
    table = _cuda.zeros(comm.size * k, torch.float64, comm.device)
    table[comm.rank * k:(comm.rank + 1) * k] = torch.tensor(
        [v for _, v in rows], dtype=torch.float64)
    comm.allreduce(table, "sum")  # every other slot adds zeros: a gather
    table = table.cpu().view(comm.size, k)
    for r in range(1, comm.size):
        for j, (name, _) in enumerate(rows):
            a, b = float(table[0, j]), float(table[r, j])
            if a != b and not (math.isnan(a) and math.isnan(b)):
                raise SquallInvalidUsage(
                    f"squall: {what}: rank {r} has {name}={b:g} where rank 0 has {a:g}; every "
                    "rank must pass the same hyper-parameters, or the replicas drift apart")


def _ddp_modules_over(params):
    """The live DistributedDataParallel modules that wrap any of `params`."""
    ddp_type = getattr(torch.nn.parallel, "DistributedDataParallel", None)
    if ddp_type is None:
        return []
    ids = {id(p) for p in params}
    # type(o), not isinstance: isinstance also reads o.__class__, and some
    # objects torch keeps alive warn when that is read (torch 2.x's deprecated
    # torch.distributed.reduce_op raises a FutureWarning), which fails a job
    # run under -W error.
    return [o for o in gc.get_objects()
            if issubclass(type(o), ddp_type) and not getattr(o, "_squall_local_hook", False)
            and any(id(p) in ids for p in o.module.parameters())]


def _flatten_into(flat, tensors):
    off = 0
    for t in tensors:
        n = t.numel()
        flat[off:off + n].copy_(t.detach().reshape(-1))
        off += n
    return flat


def _drift_into(flat, tensors, since):
    """flat = tensors (flattened) - since, in one pass."""
    off = 0
    for t in tensors:
        n = t.numel()
        torch.sub(t.detach().reshape(-1), since[off:off + n], out=flat[off:off + n])
        off += n
    return flat


def _unflatten_from(flat, params, mask=None):
    off = 0
    for i, p in enumerate(params):
        n = p.numel()
        if mask is None or mask[i]:
            p.detach().copy_(flat[off:off + n].view_as(p))
        off += n


class APMSqueeze(torch.optim.Optimizer):
    """Adam with a full-precision warmup, then frozen variance and 1-bit
    compressed momentum (the C core's squallOptimizer, include/squall/optim.h).

    Every rank builds the same model and parameter groups and calls step()
    with its local gradients; the optimizer does the communication (do not
    average gradients yourself, or use squall.ddp.apmsqueeze_hook with DDP).

    warmup: an int is a number of steps; a float in (0, 1) is a fraction of
    total_steps (required then). Only `lr` may change after construction (LR
    schedulers work: each step passes the group's current lr); betas, eps and
    weight_decay are fixed when the group is created.

    Parameters are copied into a flat fp32 buffer and back each step; all
    parameters of a group must be fp32 (master weights) on one device. CUDA
    groups keep their flat buffers on their GPU; with a communicator from NCCL
    (squall.init(transport="nccl")) the C optimizer runs there too, on the
    current stream, and every group must be on that communicator's GPU. A
    parameter whose .grad is None takes a zero gradient and is not written
    back (it does not move, as in torch's optimizers); every rank must agree
    on which ones.

    guard (default True): in the compressed stage, elements whose gradient was
    zero through the whole warmup do not move, and no element's step exceeds
    lr * max_update (None: the largest step full-precision Adam can take with
    these betas, 7.27 lr for (0.9, 0.999)). guard=False is the plain update of
    the paper, which can blow up where the frozen variance is (near) zero.
    See docs/optim.md, "The guard".

    freeze_threshold, freeze_window (None: the library's defaults): the
    adaptive warmup. The warmup ends at the first multiple t of freeze_window
    (t >= 2 freeze_window) where the bias-corrected variance changed by less
    than freeze_threshold (relative, L1) over the last window, and at the
    latest after `warmup`, which becomes an upper bound; freeze_threshold=0 is
    the fixed warmup. See docs/optim.md, "When the warmup ends".

    compressed_algo: "bytes" (default: the compressed allreduce that sends
    fewer bytes, two-phase from 3 ranks on), "time" (the communicator's
    latency/bandwidth model), "twophase" or "allgather".

    warmup_codec (None: the library's default): the warmup's gradient
    average in fp32 ("none"), "fp16" or "bf16" (half the bytes; stateless
    rounding, the sum in fp32). See docs/optim.md, "A cheaper warmup".
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, maximize=False, foreach=None, capturable=False,
                 differentiable=False, fused=None, warmup=0.15, total_steps=None,
                 codec="onebit:block=64:scale=rms", comm=None, mode="apmsqueeze", guard=True,
                 max_update=None,
                 broadcast_initial=True, freeze_threshold=None, freeze_window=None,
                 compressed_algo="bytes", warmup_codec=None):
        _lib.require_optim()
        for name, value in (("amsgrad", amsgrad), ("maximize", maximize),
                            ("capturable", capturable), ("differentiable", differentiable),
                            ("fused", fused)):
            if value:
                raise SquallUnsupported(
                    f"squall.optim.APMSqueeze: {name}=True is not supported (the C optimizer "
                    f"runs one Adam variant); leave {name} at its default")
        if not lr > 0:
            raise SquallInvalidArgument(f"squall.optim.APMSqueeze: lr must be positive, not {lr}")
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise SquallInvalidArgument(
                f"squall.optim.APMSqueeze: betas must be in [0, 1): {betas}")
        if not eps > 0 or weight_decay < 0:
            raise SquallInvalidArgument(
                "squall.optim.APMSqueeze: eps must be > 0 and weight_decay >= 0")
        if mode not in _MODES:
            raise SquallInvalidArgument(
                f"squall.optim.APMSqueeze: mode must be one of {', '.join(_MODES)}, not {mode!r}")
        if not isinstance(guard, bool):
            raise SquallInvalidArgument(
                f"squall.optim.APMSqueeze: guard is True or False, not {guard!r}")
        if max_update is not None and not (isinstance(max_update, (int, float))
                                           and 0 < max_update < math.inf):
            raise SquallInvalidArgument(
                "squall.optim.APMSqueeze: max_update is None (the bound of full-precision Adam "
                f"for these betas) or a finite number > 0, not {max_update!r}")
        self.guard, self.max_update = guard, max_update
        if freeze_threshold is None:
            freeze_threshold = _lib.FREEZE_THRESHOLD
        if freeze_window is None:
            freeze_window = _lib.FREEZE_WINDOW
        if isinstance(freeze_threshold, bool) or not (
                isinstance(freeze_threshold, (int, float)) and 0 <= freeze_threshold < math.inf):
            raise SquallInvalidArgument(
                "squall.optim.APMSqueeze: freeze_threshold is 0 (the fixed warmup) or a finite "
                f"relative change > 0, not {freeze_threshold!r}")
        if isinstance(freeze_window, bool) or not isinstance(freeze_window, int) \
                or freeze_window < 1:
            raise SquallInvalidArgument(
                f"squall.optim.APMSqueeze: freeze_window is a number of steps >= 1, not "
                f"{freeze_window!r}")
        self.freeze_threshold, self.freeze_window = float(freeze_threshold), freeze_window
        if compressed_algo not in _lib.OPTIM_ALGOS:
            raise SquallInvalidArgument(
                f"squall.optim.APMSqueeze: compressed_algo is one of "
                f"{', '.join(_lib.OPTIM_ALGOS)}, not {compressed_algo!r}")
        self.compressed_algo = compressed_algo
        if warmup_codec is None:
            warmup_codec = _lib.WARMUP_CODEC
        if warmup_codec not in _lib.WARMUP_CODECS:
            raise SquallInvalidArgument(
                f"squall.optim.APMSqueeze: warmup_codec is one of "
                f"{', '.join(_lib.WARMUP_CODECS)}, not {warmup_codec!r}")
        self.warmup_codec = warmup_codec
        self.mode = mode
        self.codec = codec
        self._spec = parse_codec(codec)
        self._warmup_steps, self._warmup_fraction, self._total_steps = self._resolve_warmup(
            warmup, total_steps, mode)
        self.comm = comm if comm is not None else get_default()
        self.traffic = Traffic()  # what this optimizer's own collectives moved
        self._first_step_checked = False
        self._hooked = False  # set by squall.ddp.APMSqueezeState
        self._compressed_logged = False
        self._opts = []
        # Destroyed with this object, not with a copy of its __dict__: Lightning's
        # LightningOptimizer copies the optimizer's attributes into a wrapper
        # whose class derives from this one, and a __del__ of the wrapper would
        # close the handles the optimizer still uses.
        # (Not at interpreter exit: the communicator may be gone by then.)
        weakref.finalize(self, _destroy_handles, self._opts).atexit = False
        self._created = []  # the hyperparameters each C optimizer was made with
        self._flat = []  # (params fp32, grads fp32) per group, on the group's device
        self._devices = []  # per group: its CUDA device, or None for the host path
        self._staging = []  # per group: host copies of _flat (CUDA group, host communicator)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay))
        with self.traffic.measure(self.comm):
            _check_same_across_ranks(self.comm, [g["params"] for g in self.param_groups],
                                     "APMSqueeze")
        for group in self.param_groups:
            self._create(group)
        if broadcast_initial:  # replicas start equal, as SlowMo's and DDP's do
            with self.traffic.measure(self.comm):
                _broadcast_params(self.comm, [g["params"] for g in self.param_groups])
        self._ready = True
        self.comm._children.add(self)

    @staticmethod
    def _resolve_warmup(warmup, total_steps, mode):
        if total_steps is not None and (int(total_steps) != total_steps or total_steps < 0):
            raise SquallInvalidArgument(
                f"squall.optim.APMSqueeze: total_steps must be a non-negative int: {total_steps}")
        total = int(total_steps or 0)
        if isinstance(warmup, bool):
            raise SquallInvalidArgument("squall.optim.APMSqueeze: warmup is an int or a float")
        if isinstance(warmup, int):
            if warmup < 0:
                raise SquallInvalidArgument(
                    f"squall.optim.APMSqueeze: warmup steps must be >= 0, not {warmup}")
            return warmup, 0.15, total
        if isinstance(warmup, float):
            if not 0.0 < warmup < 1.0:
                raise SquallInvalidArgument(
                    f"squall.optim.APMSqueeze: a float warmup is a fraction of total_steps in "
                    f"(0, 1), not {warmup}; pass an int for a number of steps")
            if total_steps is None and mode == "apmsqueeze":
                raise SquallInvalidArgument(
                    f"squall.optim.APMSqueeze: warmup={warmup} is a fraction of total_steps; "
                    "pass total_steps=<planned steps> or an int warmup")
            return -1, warmup, total
        raise SquallInvalidArgument(
            f"squall.optim.APMSqueeze: warmup must be an int or a float, not {warmup!r}")

    def _hyper(self, group):
        return (tuple(float(b) for b in group["betas"]), float(group["eps"]),
                float(group["weight_decay"]))

    def _group_device(self, params):
        """The CUDA device whose flat buffers a group gets, or None (host)."""
        i = len(self._opts)
        devices = {_cuda.device_of(p) for p in params}
        if len(devices) > 1:
            raise SquallInvalidArgument(
                f"squall.optim.APMSqueeze: param group {i} has parameters on "
                f"{', '.join(sorted(str(d) for d in devices))}; a group is flattened into one "
                "buffer on one device: give each device's parameters their own param group")
        nccl = self.comm._nccl is not None
        device = devices.pop() if devices else (self.comm.device if nccl else None)
        if nccl and device != self.comm.device:
            raise SquallInvalidUsage(
                f"squall.optim.APMSqueeze: param group {i} is on {device}, but the communicator "
                f"comes from NCCL on {self.comm.device} and steps parameters of that GPU only; "
                "move them there, or use a host communicator (squall.init()) for CPU parameters")
        return device if device is not None and device.type == "cuda" else None

    def _create(self, group):
        params = group["params"]
        dtypes = {p.dtype for p in params}
        if dtypes != {torch.float32}:
            detail = ("mixes " + ", ".join(sorted(str(d) for d in dtypes))) if len(dtypes) > 1 \
                else f"holds {next(iter(dtypes))}"
            raise SquallInvalidArgument(
                f"squall.optim.APMSqueeze: param group {len(self._opts)} {detail}; APMSqueeze "
                "keeps fp32 master parameters, so every parameter must be torch.float32")
        for p in params:
            if p.layout != torch.strided:
                raise SquallInvalidArgument("squall.optim.APMSqueeze: sparse parameters are "
                                            "not supported")
        device = self._group_device(params)
        numel = sum(p.numel() for p in params)
        cfg = _lib.OptimConfig()
        cfg.mode = _MODES[self.mode]
        cfg.lr = float(group["lr"])
        (cfg.beta1, cfg.beta2), cfg.eps, cfg.weightDecay = self._hyper(group)
        cfg.warmupSteps = self._warmup_steps
        cfg.warmupFraction = self._warmup_fraction
        cfg.totalSteps = self._total_steps
        cfg.codec = self._spec
        cfg.guard = 1 if self.guard else 0
        cfg.maxUpdate = float(self.max_update or 0.0)
        cfg.freezeThreshold = self.freeze_threshold
        cfg.freezeWindow = self.freeze_window
        cfg.compressedAlgo = _lib.OPTIM_ALGOS[self.compressed_algo]
        cfg.warmupCodec = _lib.WARMUP_CODECS[self.warmup_codec]
        h = ctypes.c_void_p()
        with _cuda.device_guard(self.comm.device):  # from NCCL: the state lives on its GPU
            check(lib.squallOptimizerCreate(self.comm.handle, numel, ctypes.byref(cfg),
                                            ctypes.byref(h)), "squallOptimizerCreate")
        self._opts.append(h)
        self._created.append(self._hyper(group))
        self._flat.append((_cuda.zeros(numel, torch.float32, device),
                           _cuda.zeros(numel, torch.float32, device)))
        self._devices.append(device)
        staging = None
        if device is not None and self.comm._nccl is None:
            pinned = torch.cuda.is_available()
            staging = tuple(torch.zeros(numel, dtype=torch.float32, pin_memory=pinned)
                            for _ in range(2))
        self._staging.append(staging)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        if getattr(self, "_ready", False):  # after construction: collective on every rank
            _check_same_across_ranks(self.comm, [param_group["params"]],
                                     "APMSqueeze.add_param_group")
            self._create(self.param_groups[-1])

    def _handle(self, i):
        h = self._opts[i]
        if h is None:
            raise SquallInvalidUsage("squall.optim.APMSqueeze: the optimizer was closed")
        return h

    def _hyper_rows(self):
        rows = [("warmup", float(self._warmup_steps)),
                ("warmup fraction", float(self._warmup_fraction)),
                ("total_steps", float(self._total_steps)), ("guard", float(self.guard)),
                ("max_update", float(self.max_update or 0.0)),
                ("freeze_threshold", self.freeze_threshold),
                ("freeze_window", float(self.freeze_window)),
                ("compressed_algo", float(_lib.OPTIM_ALGOS[self.compressed_algo])),
                ("warmup_codec", float(_lib.WARMUP_CODECS[self.warmup_codec])),
                ("mode", float(_MODES[self.mode])), ("codec", float(self._spec.codec)),
                ("codec block", float(self._spec.blockSize))]
        for i, g in enumerate(self.param_groups):
            (b1, b2), eps, wd = self._hyper(g)
            rows += [(f"param group {i} lr", float(g["lr"])), (f"param group {i} beta1", b1),
                     (f"param group {i} beta2", b2), (f"param group {i} eps", eps),
                     (f"param group {i} weight_decay", wd)]
        return rows

    def _check_first_step(self):
        self._first_step_checked = True
        with self.traffic.measure(self.comm):
            _check_hyper_across_ranks(self.comm, self._hyper_rows(), "APMSqueeze")
        if not self._hooked and self.mode == "apmsqueeze":
            params = [p for g in self.param_groups for p in g["params"]]
            if _ddp_modules_over(params):
                warnings.warn(
                    "squall.optim.APMSqueeze steps parameters of a DistributedDataParallel model "
                    "without squall.ddp.apmsqueeze_hook: DDP averages every gradient and the "
                    "optimizer communicates again (twice the traffic; after the warmup DDP's full-"
                    "precision average cancels the compression). Register the hook: "
                    "ddp.register_comm_hook(squall.ddp.APMSqueezeState(opt), "
                    "squall.ddp.apmsqueeze_hook)", stacklevel=3)

    def _log_phase(self):
        if self._compressed_logged or self.mode != "apmsqueeze":
            return
        info = self.info(0)
        if info["phase"] != "compressed":
            return
        self._compressed_logged = True
        if self.comm.rank == 0:
            log.warning("squall: APMSqueeze switched to 1-bit compressed momentum after step %d "
                        "(warmup done; %s sent by rank 0 so far)", info["step"],
                        _format_bytes(self.stats["bytes_sent"]))

    @property
    def stats(self):
        """Cumulative {'bytes_sent', 'bytes_received'} of this rank: every byte
        this optimizer's steps and checks handed to the transport, as counted
        by the library (squallCommGetStats); warmup and compressed steps alike."""
        return self.traffic.as_dict()

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self._first_step_checked:
            self._check_first_step()
        with self.traffic.measure(self.comm):
            self._step_groups()
        self._log_phase()
        return loss

    def _step_groups(self):
        for i, group in enumerate(self.param_groups):
            if self._hyper(group) != self._created[i]:
                raise SquallInvalidUsage(
                    f"squall.optim.APMSqueeze: param group {i}: betas, eps and weight_decay are "
                    "fixed when the optimizer is created; only lr may change")
            lr = float(group["lr"])
            if lr < 0 or math.isnan(lr):
                raise SquallInvalidArgument(f"squall.optim.APMSqueeze: lr must be >= 0, not {lr}")
            with _cuda.device_guard(self._devices[i]):  # copies on the GPU's current stream
                self._step_group(i, group["params"], lr if lr > 0 else _TINY_LR)

    def _step_group(self, i, params, lr):
        flat_p, flat_g = self._flat[i]
        has_grad = []
        off = 0
        for p in params:
            n = p.numel()
            flat_p[off:off + n].copy_(p.detach().reshape(-1))
            g = p.grad
            if g is None:
                flat_g[off:off + n].zero_()
            else:
                if g.layout != torch.strided:
                    raise SquallInvalidArgument(
                        "squall.optim.APMSqueeze: sparse gradients are not supported (use "
                        "dense embeddings: sparse=False)")
                if g.shape != p.shape:
                    raise SquallInvalidArgument(
                        f"squall.optim.APMSqueeze: a gradient of shape {tuple(g.shape)} "
                        f"belongs to a parameter of shape {tuple(p.shape)}")
                flat_g[off:off + n].copy_(g.reshape(-1))  # any layout, device, float dtype
            has_grad.append(g is not None)
            off += n
        device, staging = self._devices[i], self._staging[i]
        if device is None:  # host buffers
            check(lib.squallOptimizerStep(self._handle(i), flat_p.data_ptr(), flat_g.data_ptr(),
                                          lr), "squallOptimizerStep")
        elif staging is None:  # a communicator from NCCL: the device optimizer
            check(lib.squallOptimizerStepOnStream(self._handle(i), flat_p.data_ptr(),
                                                  flat_g.data_ptr(), lr,
                                                  _cuda.current_stream(device)),
                  "squallOptimizerStepOnStream")
        else:  # a host communicator: one copy to the host and one back
            host_p, host_g = staging
            host_p.copy_(flat_p)
            host_g.copy_(flat_g)
            check(lib.squallOptimizerStep(self._handle(i), host_p.data_ptr(), host_g.data_ptr(),
                                          lr), "squallOptimizerStep")
            flat_p.copy_(host_p)
        _unflatten_from(flat_p, params, has_grad)

    # -- introspection -----------------------------------------------------
    def info(self, group=0):
        """step, phase ('warmup'/'compressed'), warmup_steps, bytes_sent, skipped_steps."""
        inf = _lib.OptimInfo()
        check(lib.squallOptimizerGetInfo(self._handle(group), ctypes.byref(inf)))
        return {"step": inf.step,
                "phase": "compressed" if inf.phase == _lib.PHASE_COMPRESSED else "warmup",
                "warmup_steps": inf.warmupSteps, "bytes_sent": inf.bytesSent,
                "skipped_steps": inf.skippedSteps}

    @property
    def in_warmup(self):
        """True while APMSqueeze runs its full-precision warmup (the next step
        is a warmup step). Always False in the 'sync' and 'local' modes."""
        if self.mode != "apmsqueeze":
            return False
        return any(self.info(i)["phase"] == "warmup" for i in range(len(self._opts)))

    # -- checkpoints -------------------------------------------------------
    def state_dict(self):
        """torch's state dict (param_groups) plus 'squall': one uint8 tensor per
        group holding squallOptimizerSaveState's blob."""
        sd = super().state_dict()
        blobs = []
        for i in range(len(self._opts)):
            size = ctypes.c_size_t()
            written = ctypes.c_size_t()
            with _cuda.device_guard(self.comm.device):  # from NCCL: copied from the GPU
                check(lib.squallOptimizerStateSize(self._handle(i), ctypes.byref(size)))
                blob = torch.zeros(max(size.value, 1), dtype=torch.uint8)
                check(lib.squallOptimizerSaveState(self._handle(i), blob.data_ptr(), size.value,
                                                   ctypes.byref(written)),
                      "squallOptimizerSaveState")
            blobs.append(blob[:written.value].clone())
        sd["squall"] = {"format": 1, "mode": self.mode, "blobs": blobs,
                        "numels": [f[0].numel() for f in self._flat]}
        return sd

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        extra = state_dict.pop("squall", None)
        if extra is None or "blobs" not in extra:
            raise SquallInvalidArgument(
                "squall.optim.APMSqueeze.load_state_dict: not an APMSqueeze state dict (no "
                "'squall' entry)")
        if len(extra["blobs"]) != len(self._opts):
            raise SquallInvalidArgument(
                f"squall.optim.APMSqueeze.load_state_dict: the state holds {len(extra['blobs'])}"
                f" param groups, this optimizer {len(self._opts)}")
        for i, (n, f) in enumerate(zip(extra["numels"], self._flat)):
            if n != f[0].numel():
                raise SquallInvalidArgument(
                    f"squall.optim.APMSqueeze.load_state_dict: param group {i} held {n} "
                    f"elements when saved, {f[0].numel()} now")
        super().load_state_dict(state_dict)
        for i, blob in enumerate(extra["blobs"]):
            b = torch.as_tensor(blob, dtype=torch.uint8).contiguous().cpu() \
                if not isinstance(blob, (bytes, bytearray)) else torch.frombuffer(
                    bytearray(blob), dtype=torch.uint8)
            with _cuda.device_guard(self.comm.device):
                check(lib.squallOptimizerLoadState(self._handle(i), b.data_ptr(), b.numel()),
                      "squallOptimizerLoadState")
        self._created = [self._hyper(g) for g in self.param_groups]

    def close(self):
        _destroy_handles(self._opts)


def _format_bytes(n):
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n} B"


def _destroy_handles(handles):
    """Destroys the C optimizers in `handles` and leaves None in their place."""
    for i, h in enumerate(handles):
        if h is not None:
            handles[i] = None
            lib.squallOptimizerDestroy(h)


class _Piece:
    """The part of one parameter group in one fragment: what a sync moves."""

    def __init__(self, group, params, fragment):
        self.group, self.params, self.fragment = group, params, fragment
        self.numel = sum(p.numel() for p in params)
        self.x_prev = _flatten_into(torch.zeros(self.numel, dtype=torch.float32), params)
        self.u = torch.zeros(self.numel, dtype=torch.float32)
        self.compressor = None


class _InFlight:
    """A piece's sync between its launch and its merge."""

    def __init__(self, piece, request, lr, land, launched):
        self.piece, self.request, self.lr, self.land = piece, request, lr, land
        self.launched = launched  # the piece's parameters at launch (merge="carry"), else None


def _fragment_parts(params, fragments):
    """Per parameter, its parts as (fragment, tensor): the parameters'
    elements in order are cut into `fragments` equal runs (fragment f holds
    elements [total * f // fragments, total * (f + 1) // fragments)), so every
    fragment's sync moves the same bytes; a tensor crossing a cut goes as
    flat views of its pieces, which share its storage. A non-contiguous
    tensor (it has no flat view) goes whole, to the run holding its middle."""
    total = sum(p.numel() for p in params)
    ends = [total * (f + 1) // fragments for f in range(fragments)]
    out, before = [], 0
    for p in params:
        n = p.numel()
        if not p.is_contiguous():
            middle = before + n // 2
            out.append([(next(f for f, e in enumerate(ends) if middle < e or e == total), p)])
        else:
            parts, a = [], 0
            while a < n:
                f = next(f for f, e in enumerate(ends) if before + a < e)
                b = min(n, ends[f] - before)
                parts.append((f, p if a == 0 and b == n else p.detach().view(-1)[a:b]))
                a = b
            out.append(parts or [(0, p)])  # an empty tensor: anywhere
        before += n
    return out


class SlowMo(torch.optim.Optimizer):
    """Slow momentum (Wang et al., 2020) and its streamed form around any torch optimizer.

    step() runs base.step() (local: no communication); every `tau` steps the
    parameters are averaged across ranks and, per param group with lr the
    group's lr when the sync started:

        delta  = x_prev - x_avg                       # the outer gradient
        u      = beta * u + delta / lr
        x_prev = x_prev - alpha * lr * u               (nesterov: alpha * (delta + beta * lr * u))
        x      = x_prev

    alpha=1, beta=0 is exactly periodic averaging (Local SGD / local Adam);
    nesterov=True, alpha=0.7, beta=0.9 is DiLoCo's outer Nesterov step.
    beta=None (the default) takes the value measured best at the period:
    0.5 below tau LONG_PERIOD (100), 0 (no outer momentum, the periods'
    plain average) from it on (docs/optim.md, "Long periods").
    mode 'compressed' (the default) averages the drift x - x_prev through an
    error-compensated compressed allreduce with `codec` (x_avg = x_prev +
    avg(x - x_prev); default int4, which ended within 0.2% of the full-precision
    sync on six model families where onebit lost 2-11%: docs/codecs.md);
    'full' averages the parameters in full precision.

    Streaming (fragments > 1): the parameters' elements are cut into
    `fragments` equal runs (a tensor crossing a cut goes as flat views of its
    pieces, so no fragment waits on one large tensor), and fragment f syncs
    every tau steps at its own offset (tau * (f + 1) // fragments), so no step
    carries a whole-model sync. delay > 0 overlaps each sync with the next `delay`
    inner steps: the sync starts in the background and its result is merged
    `delay` steps later (on every rank at the same step, from the same bytes).
    merge says what the merge keeps of the inner steps made meanwhile:
    'replace' none (the fragment becomes x_prev, bit-identical on every
    rank), 'carry' all of them (x = x_prev + the fragment's local change
    since the launch; the next sync averages it). docs/optim.md has the
    measured choice.

    The base optimizer's own state (e.g. Adam moments) stays local. With
    broadcast_initial (default), rank 0's parameters are broadcast at
    construction so all ranks start equal. With lr == 0 a sync sets
    x = x_avg and leaves u unchanged. An average that comes back non-finite
    (a rank diverged) is not applied: the fragment returns to x_prev on every
    rank, u keeps its value, and `skipped_syncs` counts it. Do not wrap the
    model in DDP (or average gradients otherwise): SlowMo only communicates
    parameters. It keeps x_prev and u on the host and needs a host communicator.

    The update runs in torch, in torch's fp32 order, not through the C
    optimizer's SlowMo step (which evaluates x_prev from the old u so that
    alpha=1, beta=0 is exact without a special case): the parameters after a
    synchronisation can differ from the C path's in the last bits, while
    all ranks of a job agree with each other (docs/optim.md, "SlowMo").
    """

    # From this period on the default beta is 0. Over 40 syncs, paired against
    # AdamW (docs/convergence.md): at tau 100 and 250 plain averaging beat an
    # outer momentum of 0.5 on the conv LM by 5.5 and 8.4 points of loss and
    # on the GRU LM by 0.2 and 4.2; at tau 50 it won on the conv LM (4.7) and
    # lost on the GRU (2.2), and at tau 12 momentum won on both (1.3 to 5).
    LONG_PERIOD = 100

    def __init__(self, base, tau=12, alpha=1.0, beta=None, mode="compressed", codec="int4",
                 comm=None, broadcast_initial=True, nesterov=False, fragments=1, delay=0,
                 merge="replace"):
        if not isinstance(base, torch.optim.Optimizer):
            raise SquallInvalidArgument("squall.optim.SlowMo wraps a torch.optim.Optimizer")
        if int(tau) != tau or tau < 1:
            raise SquallInvalidArgument(f"squall.optim.SlowMo: tau must be an int >= 1: {tau}")
        if mode not in ("full", "compressed"):
            raise SquallInvalidArgument(
                f"squall.optim.SlowMo: mode is 'full' or 'compressed', not {mode!r}")
        if int(fragments) != fragments or not 1 <= fragments <= tau:
            raise SquallInvalidArgument(
                f"squall.optim.SlowMo: fragments must be an int from 1 to tau ({tau}): "
                f"{fragments} (each fragment syncs once every tau steps, at its own step)")
        if int(delay) != delay or not 0 <= delay < tau:
            raise SquallInvalidArgument(
                f"squall.optim.SlowMo: delay must be an int from 0 to tau - 1 ({tau - 1}): "
                f"{delay} (a fragment's sync must land before its next one starts)")
        if merge not in ("replace", "carry"):
            raise SquallInvalidArgument(
                f"squall.optim.SlowMo: merge is 'replace' or 'carry', not {merge!r}")
        # Deliberately not calling Optimizer.__init__: groups and state are base's.
        self.base = base
        if beta is None:
            beta = 0.0 if tau >= SlowMo.LONG_PERIOD else 0.5
        self.tau, self.alpha, self.beta = int(tau), float(alpha), float(beta)
        self.mode, self.codec, self.nesterov = mode, codec, bool(nesterov)
        self.fragments, self.delay, self.merge = int(fragments), int(delay), merge
        self.comm = comm if comm is not None else get_default()
        if self.comm._nccl is not None:
            raise SquallInvalidUsage(
                "squall.optim.SlowMo averages host copies of the parameters and needs a host "
                "communicator (squall.init() without transport='nccl'); this one comes from NCCL")
        self.steps = 0
        self.skipped_syncs = 0
        self.traffic = Traffic()  # what the averaging and the checks moved
        self._in_flight, self._window = [], None
        self._refuse_ddp()
        with self.traffic.measure(self.comm):
            _check_same_across_ranks(self.comm, [g["params"] for g in base.param_groups],
                                     "SlowMo")
            _check_same_setting(self.comm, self._setting(), "SlowMo")
        self._pieces = []
        every = [p for g in base.param_groups for p in g["params"]]
        self._assign(range(len(base.param_groups)), _fragment_parts(every, self.fragments),
                     broadcast_initial)

    def _setting(self):
        return (self.tau, self.alpha, self.beta, self.mode, self.codec, self.nesterov,
                self.fragments, self.delay, self.merge)

    def _refuse_ddp(self):
        if _ddp_modules_over([p for g in self.base.param_groups for p in g["params"]]):
            raise SquallInvalidUsage(
                "squall.optim.SlowMo: the parameters belong to a DistributedDataParallel model; "
                "DDP averages the gradients of every step, so the ranks never train locally and "
                "SlowMo's averaging is redundant. Build the base optimizer over the unwrapped "
                "model (no DDP): SlowMo does all the communication")

    @property
    def stats(self):
        """Cumulative {'bytes_sent', 'bytes_received'} of this rank (the initial
        broadcast, the checks and every averaging), as counted by the library."""
        return self.traffic.as_dict()

    param_groups = property(lambda self: self.base.param_groups)
    state = property(lambda self: self.base.state)
    defaults = property(lambda self: self.base.defaults)

    def _assign(self, groups, parts_of, broadcast):
        """Pieces for the groups of these indices (parts_of[j]: their j-th tensor's
        parts, as (fragment, tensor or flat view of it))."""
        j = 0
        for gi in groups:
            params = self.base.param_groups[gi]["params"]
            for p in params:
                if p.layout != torch.strided or not p.is_floating_point():
                    raise SquallInvalidArgument("squall.optim.SlowMo: parameters must be dense "
                                                "floating-point tensors")
            for f in range(self.fragments):
                mine = [t for k in range(len(params)) for g, t in parts_of[j + k] if g == f]
                if mine:
                    self._add_piece(_Piece(gi, mine, f), broadcast)
            j += len(params)
        self._pieces.sort(key=lambda piece: (piece.fragment, piece.group))

    def _add_piece(self, piece, broadcast):
        if broadcast:
            with self.traffic.measure(self.comm):
                self.comm.broadcast(piece.x_prev, 0)
            with torch.no_grad():
                _unflatten_from(piece.x_prev, piece.params)
        if self.mode == "compressed":
            # Syncs are rare (and, streamed, overlapped): the algorithm that
            # sends fewer bytes, two-phase from 3 ranks on, not the time model's
            piece.compressor = Compressor(
                self.comm, piece.numel, self.codec,
                algorithm="bytes" if _lib.HAVE_COMPRESSOR_ALGO else "time")
        self._pieces.append(piece)

    def add_param_group(self, param_group):
        """Adds a group (collective); its tensors join the smallest fragment."""
        self.base.add_param_group(param_group)
        gi = len(self.base.param_groups) - 1
        size = [0] * self.fragments
        for piece in self._pieces:
            size[piece.fragment] += piece.numel
        smallest = size.index(min(size))
        self._assign([gi], [[(smallest, p)] for p in self.base.param_groups[gi]["params"]], True)

    def zero_grad(self, set_to_none=None):
        if set_to_none is None:  # the base optimizer's own default
            self.base.zero_grad()
        else:
            self.base.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        if self.steps == 0:
            self._refuse_ddp()  # a DDP built after the optimizer
        loss = self.base.step(closure) if closure is not None else self.base.step()
        self.steps += 1
        with torch.no_grad():
            for f in range(self.fragments):
                if self.steps % self.tau == self.tau * (f + 1) // self.fragments % self.tau:
                    for piece in self._pieces:
                        if piece.fragment == f:
                            self._launch(piece, self.steps + self.delay)
            self._land(self.steps)
        return loss

    @torch.no_grad()
    def sync(self):
        """Merges the syncs in flight, then averages every fragment and applies
        the slow momentum now (collective)."""
        self._land(None)
        for piece in self._pieces:
            self._launch(piece, self.steps)
        self._land(None)

    def _launch(self, piece, land):
        if not self._in_flight:
            self._window = self.comm._bytes()
        carry = self.merge == "carry" and land > self.steps
        if piece.compressor is not None and not carry:
            # The drift since the last sync, not the parameters: it is small
            # and zero-mean-ish, what an error-feedback code carries well;
            # x_prev is the same on every rank, so x_avg is too. One pass.
            x = _drift_into(torch.empty_like(piece.x_prev), piece.params, piece.x_prev)
        else:
            x = _flatten_into(torch.empty_like(piece.x_prev), piece.params)
        launched = x.clone() if carry else None
        if piece.compressor is not None:
            if carry:
                x.sub_(piece.x_prev)
            request = piece.compressor.allreduce(x, "avg", async_op=True)
        else:
            request = self.comm.allreduce(x, "avg", async_op=True)
        lr = float(self.base.param_groups[piece.group]["lr"])
        self._in_flight.append(_InFlight(piece, request, lr, land, launched))

    def _land(self, step):
        """Merges, in launch order, the syncs due at `step` (None: all of them)."""
        due = [s for s in self._in_flight if step is None or s.land <= step]
        if not due:
            return
        self._in_flight = [s for s in self._in_flight if not (step is None or s.land <= step)]
        try:
            for s in due:
                self._merge(s)
        finally:
            if not self._in_flight:
                self._close_window()

    def _close_window(self):
        """Counts what the syncs moved since the first of those now finished started."""
        if self._window is not None:
            self.traffic.add(self._window, self.comm._bytes())
            self._window = None

    def _wait_in_flight(self):
        """Waits for every sync in flight without merging it (each merges at its
        own step later, from the average held here); returns them."""
        for s in self._in_flight:
            s.request = _Landed(s.request.wait())
        return self._in_flight

    def _drop_in_flight(self):
        self._wait_in_flight()
        self._in_flight = []
        self._close_window()

    def _merge(self, s):
        piece, lr = s.piece, s.lr
        x = s.request.wait()
        xp, u = piece.x_prev, piece.u
        # d = x_avg - x_prev: what the compressed sync averaged (the drift),
        # or the average less x_prev. Every update below is one fused pass
        # over the fragment (at most four in all: SlowMo's arithmetic runs on
        # the training thread, and a whole-model fragment is tens of MB).
        exact = self.alpha == 1.0 and self.beta == 0.0  # x_prev becomes the average
        full = piece.compressor is None
        # A finite sum means every element is finite (NaN and inf carry
        # through it); only a sum that overflowed needs the element-wise
        # check, which costs 8x the sum's time. x is the same on every rank,
        # so is the verdict.
        if not torch.isfinite(x.sum()) and not torch.isfinite(x).all():
            self.skipped_syncs += 1
            warnings.warn(
                f"squall.optim.SlowMo: the average of fragment {piece.fragment} (group "
                f"{piece.group}) at step {self.steps} is not finite (a rank diverged): not "
                "applied; its parameters return to the last synchronised values on every rank",
                RuntimeWarning, stacklevel=3)
            _unflatten_from(xp, piece.params)
            return
        if full and (exact or lr <= 0):
            if lr > 0:  # u = (x_prev - x_avg) / lr
                torch.sub(xp, x, out=u).div_(lr)
            xp.copy_(x)  # exactly the average
        else:
            d = x.sub_(xp) if full else x
            if lr > 0:
                u.mul_(self.beta).sub_(d, alpha=1.0 / lr)  # u = beta u + (x_prev - x_avg) / lr
            if exact or lr <= 0:
                xp.add_(d)
            elif self.nesterov:  # x_prev -= alpha ((x_prev - x_avg) + beta lr u)
                xp.add_(d, alpha=self.alpha).sub_(u, alpha=self.alpha * self.beta * lr)
            else:  # x_prev -= alpha lr u
                xp.sub_(u, alpha=self.alpha * lr)
        if s.launched is None:
            _unflatten_from(xp, piece.params)
        else:  # keep the inner steps made while the sync ran
            now = _flatten_into(torch.empty_like(xp), piece.params)
            _unflatten_from(now.sub_(s.launched).add_(xp), piece.params)

    def state_dict(self):
        """The base optimizer's state and SlowMo's (x_prev, u, this rank's
        residuals, the syncs in flight with their landed averages): a resumed
        run continues bit for bit. Waits for the syncs in flight (it does not
        merge them early)."""
        held = [{"piece": self._pieces.index(s.piece), "land": s.land, "lr": s.lr,
                 "average": s.request.wait().clone(),
                 "launched": None if s.launched is None else s.launched.clone()}
                for s in self._wait_in_flight()]
        return {"base": self.base.state_dict(),
                "slowmo": {"steps": self.steps, "tau": self.tau, "alpha": self.alpha,
                           "beta": self.beta, "nesterov": self.nesterov,
                           "fragments": self.fragments, "delay": self.delay, "merge": self.merge,
                           "x_prev": [p.x_prev.clone() for p in self._pieces],
                           "u": [p.u.clone() for p in self._pieces],
                           "in_flight": held, "skipped_syncs": self.skipped_syncs,
                           # compressed mode: each piece's residuals (this rank's)
                           "codec": self.codec if self.mode == "compressed" else None,
                           "residuals": [p.compressor.save_state()
                                         if p.compressor is not None else None
                                         for p in self._pieces]}}

    def load_state_dict(self, state_dict):
        if "slowmo" not in state_dict or "base" not in state_dict:
            raise SquallInvalidArgument("squall.optim.SlowMo.load_state_dict: not a SlowMo "
                                        "state dict (needs 'base' and 'slowmo')")
        s = state_dict["slowmo"]
        if s.get("fragments", 1) != self.fragments:
            raise SquallInvalidArgument(
                f"squall.optim.SlowMo.load_state_dict: saved with fragments={s.get('fragments', 1)}"
                f", this optimizer has fragments={self.fragments}; build it with the saved value")
        if len(s["x_prev"]) != len(self._pieces) or any(
                a.numel() != p.numel for a, p in zip(s["x_prev"], self._pieces)):
            raise SquallInvalidArgument(
                "squall.optim.SlowMo.load_state_dict: the parameter groups differ from the saved "
                "ones (or, with fragments > 1, the state was saved by a Squall that cut fragments "
                "at whole tensors; resume it with that version, or start SlowMo's state afresh "
                "with opt.base.load_state_dict(saved['base']) alone)")
        residuals = s.get("residuals") or [None] * len(self._pieces)
        if s.get("codec") != (self.codec if self.mode == "compressed" else None):
            residuals = [None] * len(self._pieces)  # another code's (or none): start afresh
        self.base.load_state_dict(state_dict["base"])
        self._drop_in_flight()  # this run's syncs: finished, not merged
        self.steps = int(s["steps"])
        self.skipped_syncs = int(s.get("skipped_syncs", 0))
        for piece, xp, u in zip(self._pieces, s["x_prev"], s["u"]):
            piece.x_prev.copy_(xp)
            piece.u.copy_(u)
        for piece, saved in zip(self._pieces, residuals):
            if piece.compressor is None:
                continue
            if saved is None:
                piece.compressor.reset()
            else:
                piece.compressor.load_state(saved)
        for h in s.get("in_flight", []):
            launched = h["launched"].clone() if h["launched"] is not None else None
            self._in_flight.append(_InFlight(self._pieces[h["piece"]],
                                             _Landed(h["average"].clone()), float(h["lr"]),
                                             int(h["land"]), launched))
        if self._in_flight:
            self._window = self.comm._bytes()

    def __repr__(self):
        extra = (f", fragments={self.fragments}, delay={self.delay}, merge={self.merge!r}"
                 if self.fragments > 1 or self.delay else "")
        return (f"SlowMo(tau={self.tau}, alpha={self.alpha}, beta={self.beta}, "
                f"mode={self.mode!r}{extra}, base={self.base!r})")

    def __getstate__(self):
        raise TypeError("squall.optim.SlowMo cannot be pickled; save state_dict() instead")


class _Landed:
    """A sync whose average is already here (waited for, or from a checkpoint)."""

    def __init__(self, result):
        self._result = result

    def wait(self):
        return self._result
