"""FSDP2 (``fully_shard``) and FSDP1 with Squall's error-feedback compressed
gradient reduce-scatter::

    from torch.distributed.fsdp import fully_shard
    import squall.fsdp

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    squall.fsdp.compress(model)            # int4 in blocks of 256, after 100 full steps

Every FSDPModule of the model gets a ReduceScatter of its own
(``FSDPModule.set_custom_reduce_scatter``, torch >= 2.9): FSDP hands it a
fresh flat buffer each backward, rank r's shard contiguous, and it keeps the
module's error-feedback residual across those buffers (a Squall compressor
per module, made at its first compressed call). The first `warmup` calls of
each module run torch's own reduce-scatter at full precision; later ones
encode the whole local gradient once with the residual and receive only the
pieces of this rank's shard (7.8x fewer bytes than fp32 at the default
int4:block=256, 21x at onebit:block=64:scale=rms, 31x at onebit). The
outputs differ per rank by design (each rank owns a different shard) and are
the same run to run.

FSDP1 (``FullyShardedDataParallel``, sharded strategies) gets the same as
each unit's communication hook, with a state of its own per unit.

Checkpoints: ``Compressed.state_dict()`` holds this rank's residuals and
call counters (each rank saves its own, beside the model's checkpoint) and
``load_state_dict`` puts them back, so a resumed job neither warms up again
nor drops the error it owed.

Gradient accumulation (``set_requires_gradient_sync(False)``) needs nothing:
FSDP does not reduce-scatter on those micro-batches. Mixed precision: FSDP's
``reduce_dtype`` (fp32, bf16, fp16) is what the compressor reads and writes.
Parameters: ``compress(model, params="int8:block=256")`` quantizes FSDP2's
parameter all-gathers too (:class:`AllGather`; off unless given), and each
module's gather in backward decodes again the bytes its gather in forward
received (``reuse_gathers=True``, the default): the parameters cross the
wire once per step. ``overlap=True`` runs the host gathers on a thread of
their own, each module prefetching the next one's gather in forward, so
that the wire can overlap compute (off by default: no gain where each rank
has one core).

HSDP (shards inside a host, replicas across the slow links): native HSDP
(``fully_shard(mesh=2-D mesh)``) all-reduces across replicas inside FSDP,
before any hook, at full precision. Sharding over the shard dimension alone
(``fully_shard(mesh=mesh["shard"])``) and passing the replica group,
``compress(model, replicas=mesh["replicate"].get_group())``, gives the same
training with that all-reduce compressed: every FSDPModule's
:class:`AllReduce` (``set_all_reduce_hook``) averages its reduce-scatter
output across the replicas with a Squall compressor of its own (error
feedback per module; bit-identical on every replica, so the replicas' shards
stay equal). ``codec=None`` leaves the reduce-scatter inside the shard group
FSDP's own.

CUDA gradients: with ``transport="auto"`` (the default) and a libsquall
built with its GPU path, the reduce-scatter runs on the GPU over an NCCL
communicator of Squall's own per group (``squall.init(transport="nccl")``):
encode, exchange and decode are enqueued on the stream FSDP reduces on, so
the call returns at once and the compressed exchange overlaps the rest of
the backward as FSDP's own reduce-scatter does. ``transport="host"`` stages
CUDA gradients through host memory over a host communicator instead (the
call then waits for the exchange); CPU gradients always take that one.
CUDA parameters' all-gathers (``params``) take the same NCCL communicator and
the C library's quantized all-gather on the GPU (the host path's bits).
"""

import atexit
import ctypes
import functools
import queue
import threading
import weakref

import torch
import torch.distributed as dist

from . import _cuda, _lib
from ._comm import Compressor, Traffic, init
from ._lib import SquallInvalidArgument, check, lib

# What an encoder reads (squallEncode's dtypes), and the decoder's output.
_ENCODABLE = {torch.float32: _lib.FLOAT32, torch.float16: _lib.FLOAT16,
              torch.bfloat16: _lib.BFLOAT16}
_PF = ctypes.POINTER(ctypes.c_float)

_SUM, _AVG = dist.ReduceOp.SUM, getattr(dist.ReduceOp, "AVG", None)

#: The code of raw gradients under any optimizer (Adam included): what kept
#: four unmodified jobs within 3% of full precision through the interposer
#: (docs/preload.md, "The default code") and FSDP2 AdamW within 0.1% here
#: (docs/python.md, "Sharded models").
DEFAULT_CODEC = "int4:block=256"
DEFAULT_WARMUP = 100


def _fsdp_modules(model):
    """(FSDP2 modules, FSDP1 units) of the model."""
    try:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    except ImportError as e:  # torch < 2.6
        raise SquallInvalidArgument(
            "squall.fsdp needs FSDP2 (torch.distributed.fsdp.fully_shard, torch >= 2.9 for "
            f"custom reduce-scatters) or FSDP1: {e}") from e
    return ([m for m in model.modules() if isinstance(m, FSDPModule)],
            [m for m in model.modules() if isinstance(m, FullyShardedDataParallel)])


_TRANSPORTS = ("auto", "host", "nccl")


class _GatherWork(dist.Work):
    """What FSDP waits on for a gather the gatherer thread runs: `wait`
    returns once it is done, or raises what it raised."""

    def __init__(self):
        super().__init__()
        self._done = threading.Event()
        self._error = None

    def wait(self, timeout=None):
        self._done.wait()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self):
        return self._done.is_set()


# Gatherers whose thread runs; stopped at exit (_stop_gatherers).
_running = weakref.WeakSet()


class _Gatherer:
    """One daemon thread that runs the host all-gathers one after the other,
    in the order FSDP issued them (the same on every rank), each over a
    communicator that nothing else uses; the calling thread gets a Work at
    once and goes on computing."""

    def __init__(self):
        self._queue = queue.SimpleQueue()
        self._thread = None
        self._lock = threading.Lock()

    def submit(self, run):
        work = _GatherWork()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="squall-fsdp-gather",
                                                daemon=True)
                self._thread.start()
                _running.add(self)
        self._queue.put((run, work))
        return work

    def _run(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            run, work = item
            try:
                run()
            except BaseException as e:  # noqa: BLE001 - raised again by work.wait()
                work._error = e
            work._done.set()

    def close(self):
        """Stops the thread once the gathers submitted are done (each ends by
        its communicator's timeout at the latest)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()
        _running.discard(self)


@atexit.register
def _stop_gatherers():
    """Before the interpreter finalises: a thread still inside a torch call
    then aborts the process (as squall.ddp's completion threads would)."""
    for gatherer in list(_running):
        gatherer.close()


def _forward_prefetch_set(module):
    """Whether FSDP already prefetches explicitly in `module`'s forward
    (set_modules_to_forward_prefetch; torch keeps it in the module's state)."""
    state = getattr(module, "_get_fsdp_state", None)
    return bool(getattr(state(), "_states_to_forward_prefetch", None)) if state else False


class _ForwardPrefetch:
    """Has every FSDP2 module prefetch the next one's all-gather in forward,
    so that a gather on the gatherer thread runs while the module before it
    computes. On the CPU FSDP2 issues each module's gather in that module's
    own pre-forward and waits for it there (its implicit prefetch is
    streams, which the CPU has none of); in backward it prefetches the
    previous module already. The order is the one the modules' forwards
    started in during the first step (recorded by a pre-forward hook),
    applied when the first of them starts again; modules whose forward
    prefetch the user set are left as they are."""

    def __init__(self):
        self.order, self._hooks, self.planned = [], [], False

    def add(self, module):
        if not self.planned and hasattr(module, "set_modules_to_forward_prefetch"):
            self._hooks.append(module.register_forward_pre_hook(
                functools.partial(self._started, module)))

    def _started(self, module, _module, _args):
        if self.planned:
            return
        if self.order and module is self.order[0]:
            self._plan()
        elif all(m is not module for m in self.order):
            self.order.append(module)

    def _plan(self):
        self.planned = True
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        for module, following in zip(self.order, self.order[1:]):
            if not _forward_prefetch_set(module):
                module.set_modules_to_forward_prefetch([following])


class _Comms:
    """One Squall communicator per process group FSDP reduce-scatters over
    (and per kind: host, or NCCL for CUDA tensors), made at the group's first
    compressed call (every member makes it: FSDP runs the same modules'
    backward in the same order on every rank, with the same devices)."""

    def __init__(self, timeout, transport="auto"):
        if transport not in _TRANSPORTS:
            raise SquallInvalidArgument(
                f"squall.fsdp: transport is one of {', '.join(_TRANSPORTS)}, not {transport!r}")
        self._by_group, self._timeout, self.transport = {}, timeout, transport
        self.gatherer = _Gatherer()  # the host all-gathers' thread (started at the first)

    def on_device(self, tensor):
        """Whether `tensor`'s collective runs on the GPU (an NCCL
        communicator): a CUDA tensor, with transport 'nccl', or 'auto' and a
        libsquall with the device reduce-scatter."""
        if self.transport == "host" or _cuda.device_of(tensor).type != "cuda":
            return False
        if self.transport == "nccl":
            return True
        return _lib.HAVE_GPU and _lib.HAVE_REDUCE_SCATTER_ON_STREAM

    def get(self, group, nccl=False, own=None):
        """The communicator of `group` (`own`: a name for one of its own, used
        by one thread only, e.g. the gatherer's)."""
        key = (group, nccl, own)
        comm = self._by_group.get(key)
        if comm is None:
            world = group is None or group is dist.group.WORLD or (
                group.size() == dist.get_world_size())
            comm = init(process_group=None if world else group,
                        transport="nccl" if nccl else None,
                        timeout=None if nccl else self._timeout, set_as_default=False)
            self._by_group[key] = comm
        return comm


class _Compressed:
    """What a module's gradient collective with error feedback keeps: its
    call counters, the Squall compressor (the residual; made at the first
    compressed call, again if the input's size changes) and a residual loaded
    before that call. Counters: `calls`, `full_calls`, `compressed_calls`,
    `stats` (bytes of the compressed calls)."""

    kind = "allreduce"  # the compressor's

    def __init__(self, codec, warmup, comms, name=""):
        self.codec, self.warmup, self.name = codec, int(warmup), name
        self._comms = comms
        self._compressor = None
        self._pending = None  # a loaded residual for the compressor not made yet
        self.calls = self.full_calls = self.compressed_calls = 0

    def _full(self):
        """Counts a call; whether it is one of the warmup's full-precision ones."""
        self.calls += 1
        return self.calls <= self.warmup

    def _compressor_for(self, tensor, group):
        comm = self._comms.get(group, nccl=self._comms.on_device(tensor))
        c = self._compressor
        if c is None or c.numel != tensor.numel() or c.comm is not comm:
            if c is not None:
                c.close()  # the module's parameters changed size: start over
            c = self._compressor = Compressor(comm, tensor.numel(), self.codec, kind=self.kind)
            if self._pending is not None:  # from load_state_dict, before the first call
                state, self._pending = self._pending, None
                c.load_state(state)
        return c

    @property
    def stats(self):
        return self._compressor.stats if self._compressor is not None else {
            "bytes_sent": 0, "bytes_received": 0}

    def reset(self):
        """Zeroes the residual (after loading parameters from elsewhere)."""
        self._pending = None
        if self._compressor is not None:
            self._compressor.reset()

    def state_dict(self):
        """The call counters (so a resumed job does not warm up again) and
        this rank's residual (bytes; None before the first compressed call)."""
        residual = self._compressor.save_state() if self._compressor is not None else self._pending
        return {"calls": self.calls, "full_calls": self.full_calls,
                "compressed_calls": self.compressed_calls, "codec": self.codec,
                "residual": residual}

    def load_state_dict(self, state):
        if state.get("codec", self.codec) != self.codec:
            raise SquallInvalidArgument(
                f"squall.fsdp: module {self.name or '(root)'} was saved compressing with "
                f"{state['codec']}, and compresses with {self.codec} now: a residual is owed in "
                "its own code; compress with the saved code, or do not load its state")
        residual = state.get("residual")
        if self._compressor is None:
            self._pending = residual
        elif residual is not None:
            self._compressor.load_state(residual)  # refused as a whole: nothing changed yet
        else:
            self._compressor.reset()  # saved before its first compressed call: nothing owed
        self.calls = int(state["calls"])
        self.full_calls = int(state.get("full_calls", 0))
        self.compressed_calls = int(state.get("compressed_calls", 0))


class ReduceScatter(_Compressed):
    """A module's compressed reduce-scatter (torch's FSDP2 ReduceScatter
    interface: ``allocate`` and ``__call__``)."""

    kind = "reduce_scatter"

    def __init__(self, codec, warmup, comms, name=""):
        super().__init__(codec, warmup, comms, name)
        self.group = None  # FSDP1's process group (FSDP2 passes it to each call)

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        if self._full() or op not in (_SUM, _AVG):
            # Full precision: the warmup, and ops a compressed sum cannot
            # give (PREMUL_SUM: the caller's scale folded into NCCL's sum).
            self.full_calls += 1
            return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group,
                                              async_op=async_op)
        c = self._compressor_for(input_tensor, group)
        c.reduce_scatter(input_tensor, output_tensor, "avg" if op == _AVG else "sum")
        self.compressed_calls += 1
        return None


class AllReduce(_Compressed):
    """A module's gradient average across HSDP's replicas, compressed: the
    hook FSDP2 calls with each reduce-scatter output
    (``FSDPModule.set_all_reduce_hook``) when the model is sharded over the
    shard group alone. The first `warmup` calls average at full precision
    (torch's all-reduce over `group`); later ones through a Squall
    compressor of the module's own, in place, bit-identical on every
    replica."""

    def __init__(self, codec, warmup, comms, group, name=""):
        super().__init__(codec, warmup, comms, name)
        self.group = group

    def __call__(self, reduce_output):
        if self._full():
            self.full_calls += 1
            dist.all_reduce(reduce_output, group=self.group)  # gloo has no AVG: sum, divide
            reduce_output.div_(self.group.size())
            return
        self._compressor_for(reduce_output, self.group).allreduce(reduce_output, "avg")
        self.compressed_calls += 1


class AllGather:
    """A module's parameter all-gather with block-quantized shards (torch's
    FSDP2 AllGather interface): each rank encodes its shard once with
    `codec` (no error feedback: the parameters are not a sum, and the
    sharded fp32 parameters the optimizer updates stay exact), the encodings
    are all-gathered, and every rank decodes all of them, its own included,
    so every rank computes with the same gathered values. Inputs that are
    not one floating-point dtype (FSDP then gathers raw bytes) go at full
    precision. Counters: `calls`, `full_calls`, `compressed_calls` (of
    which `overlapped_calls` ran on the gatherer thread and `reused_calls`
    decoded forward's bytes again), `stats`.

    `overlap` (host communicators): the gather runs on the comms' gatherer
    thread over a communicator of its own and FSDP gets a Work to wait on,
    so a gather FSDP prefetches overlaps the compute before its wait;
    False (the default) runs it in the call.

    `reuse` (host communicators, with `module`: the FSDPModule gathered,
    whose parameter group's state says forward or backward): a gather in
    forward keeps what it received, the encodings of
    every shard (about an eighth of the module's fp32 parameters at int4),
    until the module's gather in backward, which decodes them again instead
    of encoding and sending anything (counted in `reused_calls`). Backward
    then computes with the very values forward did, as FSDP's own
    ``reshard_after_forward=False`` would, at a fraction of its memory.
    Whether a call reuses follows FSDP's schedule alone (the group's
    training state, the same on every rank), so every rank skips the same
    collectives."""

    def __init__(self, codec, comms, name="", overlap=False, reuse=False, module=None):
        from .codec import parse_codec

        self.spec = parse_codec(codec)  # refused here, not at the first forward
        self.codec, self.name, self._comms, self.overlap = codec, name, comms, bool(overlap)
        # A module without parameters has no group (and FSDP never gathers for it).
        groups = module._get_fsdp_state()._fsdp_param_groups if module is not None else []
        self._group = groups[0] if groups else None
        self.reuse = bool(reuse) and self._group is not None
        # forward's gather: (group size, shard elements, received encodings, bytes of each)
        self._kept = None
        self.calls = self.full_calls = self.compressed_calls = self.overlapped_calls = 0
        self.reused_calls = 0
        self.traffic = None
        self._device = {}  # the GPU path's compressors, by input size
        self._count = None  # the encoded size below is for this input size
        self._bytes = 0

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def _buffers(self, n, count):
        """The call's own send and receive buffers (none kept between calls:
        FSDP frees what it gathered after use, and so does this)."""
        if self._count != count:
            size = ctypes.c_size_t()
            check(lib.squallEncodedSize(ctypes.byref(self.spec), count, ctypes.byref(size)))
            self._bytes, self._count = size.value, count
        # An encoding is whole 8-byte words (docs/codecs.md): it travels as int32.
        words = self._bytes // 4
        return torch.empty(words, dtype=torch.int32), torch.empty(n * words, dtype=torch.int32)

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        self.calls += 1
        if input_tensor.dtype not in _ENCODABLE:
            self.full_calls += 1
            return dist.all_gather_into_tensor(output_tensor, input_tensor, group=group,
                                               async_op=async_op)
        if (self._comms.on_device(input_tensor) and output_tensor.dtype == input_tensor.dtype
                and input_tensor.is_contiguous() and output_tensor.is_contiguous()
                and _lib.HAVE_ALL_GATHER):
            return self._on_device(output_tensor, input_tensor, group)
        self.compressed_calls += 1
        keep = False
        if self.reuse:
            kept, self._kept = self._kept, None  # one backward per forward's gather
            phase = self._group._training_state.name
            if (phase == "PRE_BACKWARD" and kept is not None
                    and kept[:2] == (group.size(), input_tensor.numel())):
                self.reused_calls += 1
                self._decode(output_tensor, *kept)
                return None
            # Kept only where FSDP frees the parameters after forward (not
            # the root, nor reshard_after_forward=False: no gather follows).
            keep = phase == "FORWARD" and self._group.post_forward_mesh_info is not None
        if self.overlap:
            # FSDP leaves both tensors alone until it waits on the Work.
            self.overlapped_calls += 1
            comm = self._comms.get(group, own="gather")
            return self._comms.gatherer.submit(
                functools.partial(self._on_host, output_tensor, input_tensor, comm, keep))
        self._on_host(output_tensor, input_tensor, self._comms.get(group), keep)
        return None

    def _on_host(self, output_tensor, input_tensor, comm, keep=False):
        """The quantized all-gather over a host communicator (CPU tensors, or
        CUDA ones staged through host memory); `keep`: what it received is
        kept for the backward's gather."""
        n, count = comm.size, input_tensor.numel()
        src = input_tensor.detach()
        if src.device.type != "cpu" or not src.is_contiguous():
            src = src.to("cpu").contiguous()
        send, gathered = self._buffers(n, count)
        written = ctypes.c_size_t()
        # Encoded before the output is written: FSDP's input is the output's
        # own slice.
        check(lib.squallEncode(ctypes.byref(self.spec), src.data_ptr(), _ENCODABLE[src.dtype],
                               count, None, send.data_ptr(), self._bytes, ctypes.byref(written)),
              "squallEncode")
        if self.traffic is None:
            self.traffic = Traffic()
        with self.traffic.measure(comm):
            comm.allgather(send, gathered)
        self._decode(output_tensor, n, count, gathered, self._bytes)
        if keep:
            self._kept = (n, count, gathered, self._bytes)

    def _decode(self, output_tensor, n, count, gathered, size):
        """Every rank's shard from the gathered encodings into the output."""
        out = output_tensor.view(n, count)
        direct = out.dtype == torch.float32 and out.device.type == "cpu" and out.is_contiguous()
        into = out if direct else torch.empty(n, count, dtype=torch.float32)
        for r in range(n):  # every shard, this rank's too: the same values everywhere
            check(lib.squallDecode(gathered.data_ptr() + r * size, size,
                                   ctypes.cast(into[r].data_ptr(), _PF), count), "squallDecode")
        if not direct:
            out.copy_(into)

    def _on_device(self, output_tensor, input_tensor, group):
        """CUDA parameters: the quantized all-gather on the GPU (an NCCL
        communicator of Squall's, the current stream: FSDP's all-gather
        stream), the C library's encode and decode (the same bits as the
        host path's)."""
        comm = self._comms.get(group, nccl=True)
        count = input_tensor.numel()
        c = self._device.get(count)
        if c is None or c.comm is not comm:
            c = self._device[count] = Compressor(comm, count, self.codec, kind="all_gather")
        if self.traffic is None:
            self.traffic = Traffic()
        before = (c.traffic.bytes_sent, c.traffic.bytes_received)
        c.all_gather(input_tensor, output_tensor)
        self.traffic.add(before, (c.traffic.bytes_sent, c.traffic.bytes_received))
        self.compressed_calls += 1
        return None

    @property
    def stats(self):
        return self.traffic.as_dict() if self.traffic is not None else {
            "bytes_sent": 0, "bytes_received": 0}


class Compressed:
    """What :func:`compress` put on a model: ``reduce_scatters`` (one per
    FSDPModule, in model.modules() order; none with codec=None),
    ``all_gathers`` (with params), ``all_reduces`` (with replicas) and summed
    counters."""

    def __init__(self, reduce_scatters, all_gathers=(), prefetch=None, all_reduces=()):
        self.reduce_scatters = reduce_scatters
        self.all_gathers = list(all_gathers)
        self.all_reduces = list(all_reduces)
        self._prefetch = prefetch

    @property
    def forward_prefetch(self):
        """The FSDP modules in the order their forwards ran in the first step,
        once each prefetches the next one's all-gather (from the second step
        on; empty before, or without overlapped gathers)."""
        p = self._prefetch
        return list(p.order) if p is not None and p.planned else []

    @property
    def stats(self):
        out = _summed(self.reduce_scatters)
        if self.all_gathers:
            out["all_gather"] = _summed(self.all_gathers,
                                        _CALLS + ("overlapped_calls", "reused_calls"))
        if self.all_reduces:
            out["all_reduce"] = _summed(self.all_reduces)
        return out

    def reset(self):
        for rs in self.reduce_scatters + self.all_reduces:
            rs.reset()

    def state_dict(self):
        """This rank's part of the compression state, for the checkpoint:
        every module's counters and residual, by module name. The residuals
        are this rank's own (each rank compresses its own gradient), so each
        rank saves its own, e.g. ``torch.save(c.state_dict(),
        f"squall-{rank}.pt")`` beside the model's checkpoint."""
        state = {"format": 1, "rank": dist.get_rank() if dist.is_initialized() else 0,
                 "modules": {rs.name: rs.state_dict() for rs in self.reduce_scatters}}
        if self.all_reduces:
            state["all_reduce"] = {ar.name: ar.state_dict() for ar in self.all_reduces}
        return state

    def load_state_dict(self, state):
        """Loads what :meth:`state_dict` returned on this rank, before the
        next backward. Every module must be there under the same name."""
        if not isinstance(state, dict) or state.get("format") != 1:
            raise SquallInvalidArgument(
                "squall.fsdp: not a state from Compressed.state_dict (no 'format': 1)")
        rank = dist.get_rank() if dist.is_initialized() else 0
        if state.get("rank", rank) != rank:
            raise SquallInvalidArgument(
                f"squall.fsdp: the state is rank {state['rank']}'s and this is rank {rank}: "
                "each rank loads the state it saved")
        parts = [(self.reduce_scatters, state["modules"], "reduce-scatters"),
                 (self.all_reduces, state.get("all_reduce", {}), "all-reduces across replicas")]
        for objects, saved, what in parts:  # every part checked before any is loaded
            names = [o.name for o in objects]
            missing = [n or "(root)" for n in names if n not in saved]
            extra = [n or "(root)" for n in saved if n not in names]
            if missing or extra:
                raise SquallInvalidArgument(
                    f"squall.fsdp: the saved state's {what} do not match the model's FSDP "
                    f"modules (missing: {', '.join(missing) or 'none'}; not in the model: "
                    f"{', '.join(extra) or 'none'}); shard and compress the model as when it was "
                    "saved")
        for objects, saved, _ in parts:
            for o in objects:
                o.load_state_dict(saved[o.name])


_CALLS = ("calls", "full_calls", "compressed_calls")


def _summed(objects, counters=_CALLS):
    """The objects' call counters and stats bytes, summed."""
    out = dict.fromkeys(counters + ("bytes_sent", "bytes_received"), 0)
    for o in objects:
        for k in counters:
            out[k] += getattr(o, k)
        for k in ("bytes_sent", "bytes_received"):
            out[k] += o.stats.get(k, 0)
    return out


def _fsdp1_hook(rs, padded_unsharded_grad, new_sharded_grad):
    """FSDP1's communication hook for sharded strategies: FSDP leaves the
    average to the hook, so it sums and divides by the group's size."""
    rs(new_sharded_grad, padded_unsharded_grad, rs.group, _SUM)
    new_sharded_grad.div_(rs.group.size() if rs.group is not None else dist.get_world_size())


def attach_fsdp1(unit, codec=DEFAULT_CODEC, warmup=DEFAULT_WARMUP, comms=None, name=""):
    """Puts a compressed reduce-scatter on one FSDP1 unit (a
    FullyShardedDataParallel instance, not its nested units) as its
    communication hook; returns it, or None with the reason when the unit's
    strategy takes no reduce-scatter hook. FSDP1's register_comm_hook gives
    every unit of a root one shared state; each unit here gets its own, so
    each keeps its own residual."""
    strategy = getattr(unit, "sharding_strategy", None)
    kind = getattr(strategy, "name", str(strategy))
    if kind == "NO_SHARD":
        return None, "NO_SHARD allreduces (use DDP and its hook)"
    if "HYBRID" in kind:
        return None, f"FSDP1 takes no communication hook with {kind}"
    if getattr(unit, "_comm_hook", None) is not None:
        return None, "it already has a communication hook"
    rs = ReduceScatter(codec, warmup, comms if comms is not None else _Comms(None), name)
    rs.group = unit.process_group
    unit._comm_hook, unit._comm_hook_state = _fsdp1_hook, rs
    return rs, None


def attach(module, codec=DEFAULT_CODEC, warmup=DEFAULT_WARMUP, comms=None, name=""):
    """Puts a compressed reduce-scatter on one FSDPModule; returns it. `comms`
    (from another attach, or None for a new set) shares the communicators."""
    rs = ReduceScatter(codec, warmup, comms if comms is not None else _Comms(None), name)
    module.set_custom_reduce_scatter(rs)
    return rs


def compress(model, codec=DEFAULT_CODEC, warmup=DEFAULT_WARMUP, timeout=None, params=None,
             transport="auto", overlap=False, replicas=None, replicas_codec=DEFAULT_CODEC,
             reuse_gathers=True):
    """Puts a Squall compressed reduce-scatter on every FSDPModule of `model`
    (after ``fully_shard``; before the first backward; `codec` None leaves
    FSDP's own). `warmup`: the full-precision calls of each module first.
    `replicas`: HSDP's replica process group, for a model sharded over its
    shard group alone (``fully_shard(mesh=mesh["shard"])``; see the module's
    docstring): every FSDPModule then also averages its reduce-scatter output
    across the replicas with `replicas_codec` (FSDP2 only; not with a model
    sharded over a 2-D mesh, whose all-reduce FSDP makes itself). `params`: a code
    for FSDP2's parameter all-gathers too (e.g. "int8:block=256"; None, the
    default, leaves them at full precision; FSDP1 has no all-gather hook).
    `transport`: where CUDA gradients are reduced: "auto" (on the GPU over
    NCCL when libsquall has its GPU path, else staged through host memory),
    "nccl" or "host" (see the module's docstring). `overlap=True` (with
    `params`): the host all-gathers run on a thread of their own, each
    module prefetching the next one's in forward from the second step on,
    so that their wire time can overlap compute (default False: each in
    FSDP's call, no prefetch set; on one core per rank it gained nothing,
    docs/benchmarks.md). `reuse_gathers` (with `params`, host
    communicators; default True): each module's gather in backward decodes
    again what its gather in forward received instead of gathering anew,
    so the parameters cross the wire once per step, not twice, and the
    values are the same either way; the cost is those encodings held from
    forward to backward, about 0.52 bytes per parameter at int4:block=256
    and 1.02 at int8:block=256 (the reduce-scatter's residuals hold 8, 4 in
    bf16). False gathers in backward again, as FSDP does (see
    :class:`AllGather`).
    Returns a :class:`Compressed` with the per-module objects and their
    counters."""
    modules, units = _fsdp_modules(model)
    if replicas is not None:
        _check_replicas(modules, units, replicas)
    elif codec is None:
        raise SquallInvalidArgument(
            "squall.fsdp.compress(codec=None) compresses nothing without replicas=; give a code "
            "for the reduce-scatter, or the replica group whose all-reduce to compress")
    if params is not None and units:
        raise SquallInvalidArgument(
            "squall.fsdp.compress(params=...): FSDP1 takes no custom all-gather, so its "
            "parameters can only be gathered at full precision; leave params=None for FSDP1 "
            "models, or shard the model with FSDP2's fully_shard")
    if not modules and not units:
        raise SquallInvalidArgument(
            "squall.fsdp.compress: the model has no FSDP module; call "
            "torch.distributed.fsdp.fully_shard on it (and its blocks), or wrap it in "
            "FullyShardedDataParallel, first")
    if int(warmup) != warmup or warmup < 0:
        raise SquallInvalidArgument(f"squall.fsdp.compress: warmup must be an int >= 0: {warmup}")
    comms = _Comms(timeout, transport)
    made, gathers, averages = [], [], []
    prefetch = _ForwardPrefetch() if params is not None and overlap else None
    ids2, ids1 = {id(m) for m in modules}, {id(m) for m in units}
    for name, m in model.named_modules():
        if id(m) in ids2:
            if codec is not None:
                made.append(attach(m, codec, warmup, comms, name))
            if replicas is not None:
                averages.append(AllReduce(replicas_codec, warmup, comms, replicas, name))
                m.set_all_reduce_hook(averages[-1])
            if params is not None:
                gathers.append(AllGather(params, comms, name, overlap=overlap,
                                         reuse=reuse_gathers, module=m))
                m.set_custom_all_gather(gathers[-1])
                if prefetch is not None:
                    prefetch.add(m)
        elif id(m) in ids1:
            rs, why = attach_fsdp1(m, codec, warmup, comms, name)
            if rs is None:
                raise SquallInvalidArgument(
                    f"squall.fsdp.compress: FSDP1 unit {name or '(root)'}: {why}")
            made.append(rs)
    return Compressed(made, gathers, prefetch, averages)


def _check_replicas(modules, units, replicas):
    """Refuses what cannot take the cross-replica hook, before any module is
    changed."""
    if units:
        raise SquallInvalidArgument(
            "squall.fsdp.compress(replicas=...): FSDP1 takes no all-reduce hook; shard the model "
            "with FSDP2's fully_shard over the shard group")
    if not isinstance(replicas, dist.ProcessGroup):
        raise SquallInvalidArgument(
            "squall.fsdp.compress(replicas=...) takes the replica process group, e.g. "
            f"mesh['replicate'].get_group(), not {type(replicas).__name__}")
    for m in modules:
        state = m._get_fsdp_state()
        if any(getattr(g, "_is_hsdp", False) for g in state._fsdp_param_groups):
            raise SquallInvalidArgument(
                "squall.fsdp.compress(replicas=...): the model is sharded over a 2-D mesh, so FSDP "
                "all-reduces across replicas itself, at full precision, before any hook; shard it "
                "over the shard dimension alone (fully_shard(module, mesh=mesh['shard'])) and "
                "pass replicas=mesh['replicate'].get_group()")
