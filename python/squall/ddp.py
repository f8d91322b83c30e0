"""DDP communication hooks over Squall.

1-bit gradient allreduce (momentum SGD and other optimizers that take an
averaged gradient)::

    state = squall.ddp.OnebitState(comm=None, warmup_steps=100, codec="onebit")
    ddp_model.register_comm_hook(state, squall.ddp.onebit_hook)

APMSqueeze (the optimizer communicates; DDP only averages during warmup)::

    opt = squall.optim.APMSqueeze(ddp_model.parameters(), ...)
    ddp_model.register_comm_hook(squall.ddp.APMSqueezeState(opt), squall.ddp.apmsqueeze_hook)

Both run synchronously on DDP's reducer thread and return a completed
torch.futures.Future holding the bucket's (averaged) gradient. On a host
communicator CUDA buckets are staged through host memory; on one from NCCL
(squall.init(transport="nccl")) they are reduced on the GPU, on the current
stream (that combination has not run on GPU hardware yet).
"""

import warnings

import torch

from ._comm import Compressor, Traffic, get_default


def _buffer(bucket):
    return bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()


def _done(tensor):
    fut = torch.futures.Future()
    fut.set_result(tensor)
    return fut


def _is_last(bucket):
    return bucket.is_last() if hasattr(bucket, "is_last") else bucket.index() == 0


class OnebitState:
    """State of onebit_hook: the step counter and one Compressor per bucket.
    `traffic.as_dict()` / `stats`: this rank's cumulative bytes sent and received.

    The first `warmup_steps` iterations allreduce in full precision; then each
    bucket goes through an error-compensated compressed allreduce with
    `codec`. Compressors are keyed by bucket index and re-created (residuals
    zeroed) when a bucket's size or dtype changes, e.g. when DDP rebuilds its
    buckets after the first iteration; keep warmup_steps >= 1 so that happens
    before compression starts.
    """

    def __init__(self, comm=None, warmup_steps=100, codec="onebit"):
        if int(warmup_steps) != warmup_steps or warmup_steps < 0:
            raise ValueError(
                f"squall.ddp.OnebitState: warmup_steps must be an int >= 0, not {warmup_steps!r}")
        if warmup_steps == 0:
            warnings.warn(
                "squall.ddp.OnebitState(warmup_steps=0): DDP rebuilds its buckets after the first "
                "iteration, which re-creates the compressors and throws away the residuals "
                "(error feedback) of iteration 1; use warmup_steps >= 1", stacklevel=2)
        self.comm = comm
        self.traffic = Traffic()  # cumulative bytes of this hook's allreduces
        self.warmup_steps = int(warmup_steps)
        self.codec = codec
        self.step = 0  # iterations completed (counted on each iteration's last bucket)
        self.compressors = {}  # bucket index -> (Compressor, dtype)
        self.full_buckets = 0
        self.compressed_buckets = 0

    def _comm(self):
        return self.comm if self.comm is not None else get_default()

    @property
    def stats(self):
        return self.traffic.as_dict()

    def compressor(self, index, tensor):
        entry = self.compressors.get(index)
        if entry is None or entry[0].numel != tensor.numel() or entry[1] != tensor.dtype:
            if entry is not None:
                entry[0].close()
            entry = (Compressor(self._comm(), tensor.numel(), self.codec), tensor.dtype)
            self.compressors[index] = entry
        return entry[0]

    def __getstate__(self):
        raise TypeError("squall.ddp.OnebitState cannot be pickled")


def onebit_hook(state, bucket):
    """DDP comm hook: full-precision average during warmup, then error-compensated
    1-bit average of each gradient bucket (bit-identical on every rank)."""
    buf = _buffer(bucket)
    comm = state._comm()
    with state.traffic.measure(comm):
        if state.step < state.warmup_steps:
            comm.allreduce(buf, "avg")
            state.full_buckets += 1
        else:
            state.compressor(bucket.index(), buf).allreduce(buf, "avg")
            state.compressed_buckets += 1
    if _is_last(bucket):
        state.step += 1
    return _done(buf)


class APMSqueezeState:
    """State of apmsqueeze_hook: the optimizer whose `in_warmup` decides (any
    object with that attribute works), and counters."""

    def __init__(self, optimizer, comm=None):
        self.optimizer = optimizer
        if hasattr(optimizer, "_hooked"):
            optimizer._hooked = True  # the optimizer need not warn about DDP
        self.comm = comm if comm is not None else getattr(optimizer, "comm", None)
        self.traffic = Traffic()  # cumulative bytes of this hook's warmup averages
        self.allreduced_buckets = 0
        self.skipped_buckets = 0

    @property
    def stats(self):
        """This rank's cumulative bytes sent and received by the hook."""
        return self.traffic.as_dict()

    def __getstate__(self):
        raise TypeError("squall.ddp.APMSqueezeState cannot be pickled")


def apmsqueeze_hook(state, bucket):
    """DDP comm hook for squall.optim.APMSqueeze: plain full-precision average
    while the optimizer is in warmup; afterwards no communication at all (the
    local gradient is returned unchanged; the optimizer exchanges compressed
    momentum itself)."""
    buf = _buffer(bucket)
    if state.optimizer.in_warmup:
        comm = state.comm if state.comm is not None else get_default()
        with state.traffic.measure(comm):
            comm.allreduce(buf, "avg")
        state.allreduced_buckets += 1
    else:
        state.skipped_buckets += 1
    return _done(buf)
