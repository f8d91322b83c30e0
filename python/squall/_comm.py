"""Communicators, the full-precision and compressed allreduce, requests.

Host communicators (TCP, UCX, MPI) take CPU and CUDA tensors and numpy
arrays; CUDA tensors are staged through host memory. A communicator from
NCCL (squall.init(transport="nccl")) takes CUDA tensors of its GPU only and
runs on the current torch stream of that GPU, without host staging.
"""

import contextlib
import ctypes
import os
import threading
import weakref

from . import _cuda, _lib, _nccl
from ._buffers import ALL, FLOATS, device_buffer, host_buffer, is_tensor
from ._lib import SquallError, SquallInvalidArgument, SquallInvalidUsage, check, lib
from .codec import codec_string, parse_codec

_OPS = {"sum": _lib.SUM, "avg": _lib.AVG, "mean": _lib.AVG, "min": _lib.MIN, "max": _lib.MAX}
_TRANSPORTS = {None: _lib.TRANSPORT_DEFAULT, "default": _lib.TRANSPORT_DEFAULT,
               "auto": _lib.TRANSPORT_DEFAULT, "ucx": _lib.TRANSPORT_UCX,
               "tcp": _lib.TRANSPORT_TCP}

_default = None
_default_lock = threading.RLock()  # close() from a finaliser may run under it


class Traffic:
    """Cumulative bytes one object (compressor, optimizer, hook state) made its
    communicator move: the difference of the communicator's counters around
    each of its calls, so exact while calls on a communicator do not overlap
    (an async call is counted when it is waited for)."""

    def __init__(self):
        self.bytes_sent = 0
        self.bytes_received = 0

    def as_dict(self):
        return {"bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received}

    def add(self, before, after):
        if before is not None and after is not None:
            self.bytes_sent += after[0] - before[0]
            self.bytes_received += after[1] - before[1]

    @contextlib.contextmanager
    def measure(self, comm):
        before = comm._bytes()
        try:
            yield
        finally:
            self.add(before, comm._bytes())


def _op_code(op, allowed=("sum", "avg", "mean", "min", "max")):
    if isinstance(op, str) and op.lower() in allowed:
        return _OPS[op.lower()]
    raise SquallInvalidArgument(
        f"squall: unknown or unsupported reduction {op!r}; use one of {', '.join(allowed)}")


def _config(transport, timeout):
    key = transport.lower() if isinstance(transport, str) else transport
    if key == "nccl":
        raise SquallInvalidArgument(
            "squall: transport 'nccl' is for squall.init(transport='nccl'), which creates the "
            "NCCL communicator through torch.distributed; from_unique_id and from_env run the "
            "host transports ('ucx', 'tcp')")
    if key not in _TRANSPORTS:
        raise SquallInvalidArgument(
            f"squall: unknown transport {transport!r}; use 'ucx', 'tcp' or None (SQUALL_TRANSPORT,"
            " else ucx when built in, else tcp)")
    if timeout is None:
        seconds = 0
    else:
        seconds = int(getattr(timeout, "total_seconds", lambda: timeout)())
        if seconds <= 0:
            raise SquallInvalidArgument(
                f"squall: timeout must be positive seconds, not {timeout!r}")
    return _lib.Config(_TRANSPORTS[key], seconds)


def get_unique_id():
    """128 bytes of rendezvous information (the root's address and a random
    job secret) for :meth:`Communicator.from_unique_id`. Create it on one rank
    and send it to the others."""
    uid = _lib.UniqueId()
    check(lib.squallGetUniqueId(ctypes.byref(uid)), "squallGetUniqueId")
    return ctypes.string_at(ctypes.addressof(uid), _lib.SQUALL_UNIQUE_ID_BYTES)


class Communicator:
    """A Squall communicator. Create it with :func:`squall.init` (through
    torch.distributed), :meth:`from_env` or :meth:`from_unique_id`. Close it
    with :meth:`close` (or let it be garbage collected).

    One made by ``squall.init(transport="nccl")`` wraps an NCCL communicator
    on one GPU (:attr:`device`), which it owns: it runs the full-precision and
    the compressed allreduce of CUDA tensors of that GPU, on the current
    stream, and nothing else."""

    def __init__(self, handle, process_group=None, nccl=None, device=None):
        self._h = handle
        self._nccl = nccl  # the owned _nccl.NcclComm of a communicator from NCCL
        self._device = device
        self.process_group = process_group
        self._children = weakref.WeakSet()  # compressors and optimizers to close first
        self._rank = self._query(lib.squallCommRank)
        self._size = self._query(lib.squallCommSize)

    def _query(self, fn):
        v = ctypes.c_int()
        check(fn(self._h, ctypes.byref(v)))
        return v.value

    # -- creation ----------------------------------------------------------
    @classmethod
    def from_unique_id(cls, unique_id, nranks, rank, transport=None, timeout=None,
                       process_group=None):
        """Collective over `nranks` ranks that all pass the same `unique_id`
        (from :func:`get_unique_id`)."""
        unique_id = bytes(unique_id)
        if len(unique_id) != _lib.SQUALL_UNIQUE_ID_BYTES:
            raise SquallInvalidArgument(
                f"squall: a unique id has {_lib.SQUALL_UNIQUE_ID_BYTES} bytes, "
                f"not {len(unique_id)}")
        uid = _lib.UniqueId()
        ctypes.memmove(ctypes.addressof(uid), unique_id, len(unique_id))
        cfg = _config(transport, timeout)
        h = ctypes.c_void_p()
        check(lib.squallCommInitRank(ctypes.byref(h), int(nranks), uid, int(rank),
                                     ctypes.byref(cfg)), "squallCommInitRank")
        return cls(h, process_group)

    @classmethod
    def from_env(cls, transport=None, timeout=None):
        """From the launcher's variables, no torch needed: torchrun's (MASTER_ADDR,
        MASTER_PORT (+ SQUALL_PORT_OFFSET) or SQUALL_PORT, RANK, WORLD_SIZE),
        srun's (SLURM_PROCID, SLURM_NTASKS, the first host of the node list) or
        mpirun's (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE).

        Only processes presenting the job's secret can join: SQUALL_JOB_SECRET,
        else the launcher's run id (TORCHELASTIC_RUN_ID, the Slurm or Open MPI
        job id). With neither, the secret is public and rank 0 warns once (one line);
        squall.init() after torch.distributed.init_process_group needs no
        secret (rank 0 hands a random one out through the process group)."""
        cfg = _config(transport, timeout)
        h = ctypes.c_void_p()
        check(lib.squallCommInitFromEnv(ctypes.byref(h), ctypes.byref(cfg)),
              "squallCommInitFromEnv")
        return cls(h)

    def split(self, color, key=None):
        """Collective: ranks with the same color form a new communicator, ordered
        by (key, rank). color None or negative: takes part, returns None."""
        self._host_only("split", "create another with squall.init(process_group=subgroup, "
                        "transport='nccl')")
        c = -1 if color is None or color < 0 else int(color)
        k = self.rank if key is None else int(key)
        h = ctypes.c_void_p()
        check(lib.squallCommSplit(self.handle, c, k, ctypes.byref(h)), "squallCommSplit")
        return Communicator(h) if h.value else None

    # -- properties --------------------------------------------------------
    @property
    def handle(self):
        if self._h is None:
            raise SquallInvalidUsage("squall: the communicator was closed")
        return self._h

    @property
    def rank(self):
        return self._rank

    @property
    def size(self):
        return self._size

    @property
    def device(self):
        """The GPU (a torch.device) of a communicator from NCCL; None for host
        communicators."""
        return self._device

    @property
    def transport(self):
        name = ctypes.c_char_p()
        check(lib.squallCommTransport(self.handle, ctypes.byref(name)))
        return name.value.decode()

    @property
    def closed(self):
        return self._h is None

    @property
    def stats(self):
        """Cumulative {'operations', 'bytes_sent', 'bytes_received'} of this rank
        over the communicator's life: every collective's messages, counted by
        the library where it hands them to the transport. A communicator from
        NCCL counts nothing (SquallUnsupported)."""
        if not _lib.HAVE_COMM_STATS:
            raise _lib.SquallUnsupported(
                f"squall: the loaded libsquall ({_lib.path}) has no squallCommGetStats; build a "
                "newer Squall")
        s = _lib.CommStats()
        check(lib.squallCommGetStats(self.handle, ctypes.byref(s)), "squallCommGetStats")
        return {"operations": s.operations, "bytes_sent": s.bytesSent,
                "bytes_received": s.bytesReceived}

    def _bytes(self):
        """(sent, received) so far, or None where the communicator does not count."""
        if self._nccl is not None or not _lib.HAVE_COMM_STATS or self._h is None:
            return None
        s = _lib.CommStats()
        if lib.squallCommGetStats(self._h, ctypes.byref(s)) != 0:
            return None
        return s.bytesSent, s.bytesReceived

    def __repr__(self):
        state = "closed" if self.closed else f"rank {self.rank} of {self.size}"
        if self._nccl is not None:
            state += f", nccl on {self._device}"
        return f"<squall.Communicator {state}>"

    def _host_only(self, what, instead="use torch.distributed for it, or a host communicator "
                   "(squall.init() without transport='nccl')"):
        if self._nccl is not None:
            raise SquallInvalidUsage(
                f"squall: {what} on a communicator from NCCL: it runs the full-precision and the "
                f"compressed allreduce of CUDA tensors only; {instead}")

    # -- collectives -------------------------------------------------------
    def allreduce(self, tensor, op="avg", async_op=False):
        """Full-precision allreduce in place. fp32, fp64, fp16, bf16 (accumulated
        in fp32), int32, int64; op 'sum', 'avg', 'min' or 'max'.

        On a communicator from NCCL: CUDA tensors of its GPU only, reduced by
        ncclAllReduce on the current stream (NCCL's arithmetic: fp16 and bf16
        are reduced in their own precision); the call returns once the work is
        enqueued, and async_op=True returns a Request that is already done
        (later work on the same stream sees the result)."""
        o = _op_code(op)
        if self._nccl is not None:
            _ = self.handle  # raises when closed
            buf = device_buffer(tensor, "tensor", ALL, self._device)
            with _cuda.device_guard(self._device):
                self._nccl.allreduce(buf.ptr, buf.numel, buf.dtype, o,
                                     _cuda.current_stream(self._device))
            return Request(None, tensor, None) if async_op else tensor
        buf = host_buffer(tensor, "tensor", ALL)
        if async_op:
            req = ctypes.c_void_p()
            check(lib.squallAllReduceAsync(buf.ptr, buf.ptr, buf.numel, buf.dtype, o, self.handle,
                                           ctypes.byref(req)), "squallAllReduceAsync")
            return Request(req, tensor, [buf, self])
        check(lib.squallAllReduce(buf.ptr, buf.ptr, buf.numel, buf.dtype, o, self.handle),
              "squallAllReduce")
        buf.finish()
        return tensor

    def broadcast(self, tensor, root=0):
        self._host_only("broadcast")
        buf = host_buffer(tensor, "tensor", ALL, stage_in=(self.rank == root))
        check(lib.squallBroadcast(buf.ptr, buf.numel, buf.dtype, int(root), self.handle),
              "squallBroadcast")
        buf.finish()
        return tensor

    def allgather(self, tensor, out):
        """`out` holds size * tensor.numel() elements of the same dtype, in rank order."""
        self._host_only("allgather")
        src = host_buffer(tensor, "tensor", ALL, writable=False)
        dst = host_buffer(out, "out", ALL, stage_in=False)
        if dst.dtype != src.dtype or dst.numel != src.numel * self.size:
            raise SquallInvalidArgument(
                f"squall: allgather output must hold {self.size} x {src.numel} elements of the "
                f"input's dtype; it holds {dst.numel}")
        check(lib.squallAllGather(src.ptr, dst.ptr, src.numel, src.dtype, self.handle),
              "squallAllGather")
        dst.finish()
        return out

    def barrier(self):
        self._host_only("barrier")
        check(lib.squallBarrier(self.handle), "squallBarrier")

    # -- lifetime ----------------------------------------------------------
    def close(self):
        """Destroys the communicator (and the compressors and optimizers made
        on it). Local: no communication. A communicator from NCCL first waits
        for its GPU, and destroys its NCCL communicator last (aborts it, and
        then raises the error, when waiting for the GPU failed)."""
        global _default
        if self._h is None:
            return
        gpu_error = None
        if self._nccl is not None:
            try:
                _cuda.synchronize(self._device)  # no NCCL work in flight below
            except Exception as e:  # noqa: BLE001 - tear down anyway, then report it
                gpu_error = e
        for child in list(self._children):
            child.close()
        h, self._h = self._h, None
        lib.squallCommDestroy(h)
        if self._nccl is not None:  # after the squall communicator that wraps it
            self._nccl.destroy(abort=gpu_error is not None)
        with _default_lock:
            if _default is self:
                _default = None
        if gpu_error is not None:
            raise gpu_error

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass


class Request:
    """An allreduce (or reduce-scatter) running in the background. The buffer must stay untouched
    until :meth:`wait` has returned."""

    def __init__(self, handle, result, keep, on_done=None, what="allreduce"):
        self._h, self._result, self._keep = handle, result, keep
        self._on_done = on_done
        self._what = what

    def test(self):
        """True when the operation has finished (call wait() to get its result)."""
        if self._h is None:
            return True
        done = ctypes.c_int()
        check(lib.squallTest(self._h, ctypes.byref(done)), "squallTest")
        return bool(done.value)

    def wait(self):
        """Blocks until done; raises the operation's error; returns the tensor."""
        if self._h is not None:
            h, self._h = self._h, None
            check(lib.squallWait(h), self._what)
            if self._on_done is not None:
                self._on_done()
            for k in self._keep:
                if hasattr(k, "finish"):
                    k.finish()
            self._keep = None
        return self._result

    def __del__(self):
        if getattr(self, "_h", None) is not None:  # never free buffers under a running op
            try:
                lib.squallWait(self._h)
            except Exception:
                pass


_KINDS = ("allreduce", "reduce_scatter", "all_gather")


class Compressor:
    """The error-feedback state of one buffer for the compressed allreduce,
    or with kind="reduce_scatter" for the compressed reduce-scatter.

    Create one per buffer you compress (per gradient bucket, per parameter
    group) on every rank, with the same `numel` and codec, and reuse it every
    step: the residuals carry what the compression lost into the next call.
    A compressor runs the collective of its kind only. For the reduce-scatter
    `numel` is the whole input's (a multiple of the group size; each rank's
    output holds numel / size). With kind="all_gather" (the quantized
    all-gather of parameters: no residual) `numel` is each rank's input and
    the output holds size x numel.

    algorithm: how the allreduce picks between its two-phase and all-gather
    forms: "time" (default: the communicator's time model, or
    SQUALL_COMPRESSED_ALGO), "bytes" (whichever sends fewer bytes: two-phase
    from 3 ranks on; for rare or overlapped traffic), "twophase" or
    "allgather". The same on every rank.

    gather_codec: the code of the two-phase allreduce's second round (each
    rank's reduced chunk, re-encoded for the all-gather); None (default) is
    the compressor's own. "int8" behind "int4" keeps the second encoding's
    error small for (n-1)/n x 12.1 bits per element; the "bytes" choice
    counts it. The same on every rank; a communicator from NCCL takes it
    here only (its device buffers are sized for it).
    """

    def __init__(self, comm=None, numel=None, codec="onebit", kind="allreduce",
                 algorithm="time", gather_codec=None):
        comm = comm if comm is not None else get_default()
        if numel is None or int(numel) < 0:
            raise SquallInvalidArgument("squall: Compressor needs numel >= 0")
        if algorithm not in _lib.COMPRESSOR_ALGOS:
            raise SquallInvalidArgument(
                f"squall: Compressor algorithm is one of {', '.join(_lib.COMPRESSOR_ALGOS)}, "
                f"not {algorithm!r}")
        if algorithm != "time" and not _lib.HAVE_COMPRESSOR_ALGO:
            raise _lib.SquallUnsupported(
                f"squall: the loaded libsquall ({_lib.path}) cannot choose a compressor's "
                f"algorithm; build a newer Squall or leave algorithm='time'")
        gather = None if gather_codec is None else parse_codec(gather_codec)
        if gather is not None and not _lib.HAVE_GATHER_CODEC:
            raise _lib.SquallUnsupported(
                f"squall: the loaded libsquall ({_lib.path}) has no second-round code for the "
                f"two-phase allreduce; build a newer Squall or leave gather_codec=None")
        if kind not in _KINDS:
            raise SquallInvalidArgument(
                f"squall: Compressor kind is one of {', '.join(_KINDS)}, not {kind!r}")
        self.comm = comm
        self.numel = int(numel)
        self.kind = kind
        self.spec = parse_codec(codec)
        self.codec = codec_string(self.spec)
        h = ctypes.c_void_p()
        if kind == "all_gather":
            if not _lib.HAVE_ALL_GATHER:
                raise _lib.SquallUnsupported(
                    f"squall: the loaded libsquall ({_lib.path}) has no quantized all-gather; "
                    "build a newer Squall")
            with _cuda.device_guard(comm.device):
                check(lib.squallCompressorCreateAllGather(
                    comm.handle, self.numel, ctypes.byref(self.spec), ctypes.byref(h)),
                    "squallCompressorCreateAllGather")
        elif kind == "reduce_scatter":
            if not _lib.HAVE_REDUCE_SCATTER:
                raise _lib.SquallUnsupported(
                    f"squall: the loaded libsquall ({_lib.path}) has no compressed "
                    "reduce-scatter; build a newer Squall")
            if self.numel % comm.size != 0:
                raise SquallInvalidArgument(
                    f"squall: a reduce-scatter compressor's numel is the whole input, "
                    f"{comm.size} equal shards; {self.numel} is not a multiple of {comm.size} "
                    "(pad the flat buffer to a multiple of the group size)")
            if comm._nccl is not None and not _lib.HAVE_REDUCE_SCATTER_ON_STREAM:
                raise _lib.SquallUnsupported(
                    f"squall: the loaded libsquall ({_lib.path}) has no compressed "
                    "reduce-scatter of device buffers; build a newer Squall, or use a host "
                    "communicator")
            self.recvcount = self.numel // comm.size
            with _cuda.device_guard(comm.device):  # from NCCL: device state on its GPU
                check(lib.squallCompressorCreateReduceScatter(
                    comm.handle, self.recvcount, ctypes.byref(self.spec), ctypes.byref(h)),
                    "squallCompressorCreateReduceScatter")
        else:
            with _cuda.device_guard(comm.device):  # from NCCL: device state on its GPU
                check(lib.squallCompressorCreate(comm.handle, self.numel, ctypes.byref(self.spec),
                                                 ctypes.byref(h)), "squallCompressorCreate")
        self._h = h
        self.traffic = Traffic()
        comm._children.add(self)
        self.algorithm = algorithm
        self.gather_codec = None if gather is None else codec_string(gather)
        try:  # refused for this compressor (a reduce-scatter's, one from NCCL)
            if algorithm != "time":
                check(lib.squallCompressorSetAlgorithm(h, _lib.COMPRESSOR_ALGOS[algorithm]),
                      "squallCompressorSetAlgorithm")
            if gather is not None:
                check(lib.squallCompressorSetGatherCodec(h, ctypes.byref(gather)),
                      "squallCompressorSetGatherCodec")
        except Exception:
            self.close()
            raise

    @property
    def handle(self):
        if self._h is None:
            raise SquallInvalidUsage("squall: the compressor was closed")
        return self._h

    def allreduce(self, tensor, op="avg", out=None, async_op=False):
        """Error-compensated compressed allreduce of `tensor` (fp32, fp16 or bf16,
        numel elements) into `out` (default: in place). Every rank ends with
        bit-identical values. op: 'avg' or 'sum'.

        On a communicator from NCCL: CUDA tensors of its GPU only, through
        squallCompressedAllReduceOnStream on the current stream (no host
        staging; the call returns once the work is enqueued, and async_op=True
        returns a Request that is already done)."""
        self._require_kind("allreduce", "allreduce")
        o = _op_code(op, ("sum", "avg", "mean"))
        comm = self.comm
        if comm._nccl is not None:
            src = device_buffer(tensor, "tensor", FLOATS, comm.device)
            dst = src if out is None else device_buffer(out, "out", FLOATS, comm.device)
            result = tensor if out is None else out
            self._check_buffers(src, dst)
            with _cuda.device_guard(comm.device):
                check(lib.squallCompressedAllReduceOnStream(
                    src.ptr, dst.ptr, src.dtype, o, self.handle, comm.handle,
                    _cuda.current_stream(comm.device)), "squallCompressedAllReduceOnStream")
                self._count_device_call()
            return Request(None, result, None) if async_op else result
        src = host_buffer(tensor, "tensor", FLOATS, writable=out is None)
        if out is None:
            dst, result = src, tensor
        else:
            dst, result = host_buffer(out, "out", FLOATS, stage_in=False), out
        self._check_buffers(src, dst)
        if async_op:
            req = ctypes.c_void_p()
            before = comm._bytes()
            check(lib.squallCompressedAllReduceAsync(src.ptr, dst.ptr, src.dtype, o, self.handle,
                                                     self.comm.handle, ctypes.byref(req)),
                  "squallCompressedAllReduceAsync")
            return Request(req, result, [src, dst, self],
                           on_done=lambda: self.traffic.add(before, comm._bytes()))
        with self.traffic.measure(comm):
            check(lib.squallCompressedAllReduce(src.ptr, dst.ptr, src.dtype, o, self.handle,
                                                self.comm.handle), "squallCompressedAllReduce")
        dst.finish()
        return result

    def reduce_scatter(self, input, output, op="avg", async_op=False):
        """Error-compensated compressed reduce-scatter (a compressor of
        kind="reduce_scatter"): `input` holds numel elements, rank r's shard at
        [r * numel / size, (r + 1) * numel / size); `output` (numel / size
        elements, the input's dtype: fp32, fp16 or bf16) receives the sum over
        the ranks of this rank's shard, divided by size for op 'avg'. Each
        shard is compressed on its own with this compressor's residual and the
        shards are summed in rank order, so the result is the same run to run.
        `output` may be this rank's shard of `input` (a view of it).
        On a host communicator: CPU and CUDA tensors (staged through host
        memory) and numpy arrays. On a communicator from NCCL: CUDA tensors
        of its GPU, through squallCompressedReduceScatterOnStream on the
        current stream (no staging; the call returns once the work is
        enqueued, and async_op=True returns a Request that is already done).
        Returns output (or a Request with async_op=True)."""
        self._require_kind("reduce_scatter", "reduce_scatter")
        o = _op_code(op, ("sum", "avg", "mean"))
        comm = self.comm
        if comm._nccl is not None:
            src = device_buffer(input, "input", FLOATS, comm.device)
            dst = device_buffer(output, "output", FLOATS, comm.device)
            self._check_shards(src, dst)
            with _cuda.device_guard(comm.device):
                check(lib.squallCompressedReduceScatterOnStream(
                    src.ptr, dst.ptr, self.recvcount, src.dtype, o, self.handle, comm.handle,
                    _cuda.current_stream(comm.device)), "squallCompressedReduceScatterOnStream")
                self._count_device_call()
            return Request(None, output, None) if async_op else output
        src = host_buffer(input, "input", FLOATS, writable=False)
        dst = host_buffer(output, "output", FLOATS, stage_in=False)
        self._check_shards(src, dst)
        if async_op:
            req = ctypes.c_void_p()
            before = comm._bytes()
            check(lib.squallCompressedReduceScatterAsync(
                src.ptr, dst.ptr, self.recvcount, src.dtype, o, self.handle, comm.handle,
                ctypes.byref(req)), "squallCompressedReduceScatterAsync")
            return Request(req, output, [src, dst, self],
                           on_done=lambda: self.traffic.add(before, comm._bytes()),
                           what="reduce_scatter")
        with self.traffic.measure(comm):
            check(lib.squallCompressedReduceScatter(src.ptr, dst.ptr, self.recvcount, src.dtype, o,
                                                    self.handle, comm.handle),
                  "squallCompressedReduceScatter")
        dst.finish()
        return output

    def all_gather(self, input, output):
        """Quantized all-gather (a compressor of kind="all_gather"): `input`
        (numel elements: fp32, fp16 or bf16) is encoded once with this
        compressor's code, the encodings are all-gathered, and `output`
        (size x numel elements of the input's dtype, rank r's piece at
        [r * numel, (r + 1) * numel)) receives every rank's decoded piece,
        this rank's own included, so every rank holds the same values.
        `input` may be this rank's piece of `output` (a view of it). On a host
        communicator: CPU and CUDA tensors (staged) and numpy arrays; on one
        from NCCL: CUDA tensors of its GPU, on the current stream. Returns
        output."""
        self._require_kind("all_gather", "all_gather")
        comm = self.comm
        if comm._nccl is not None:
            src = device_buffer(input, "input", FLOATS, comm.device)
            dst = device_buffer(output, "output", FLOATS, comm.device)
            self._check_gather(src, dst)
            with _cuda.device_guard(comm.device):
                check(lib.squallCompressedAllGatherOnStream(
                    src.ptr, dst.ptr, self.numel, src.dtype, self.handle, comm.handle,
                    _cuda.current_stream(comm.device)), "squallCompressedAllGatherOnStream")
                self._count_device_call()
            return output
        dst = host_buffer(output, "output", FLOATS, stage_in=False)
        src = host_buffer(input, "input", FLOATS, writable=False)
        self._check_gather(src, dst)
        with self.traffic.measure(comm):
            check(lib.squallCompressedAllGather(src.ptr, dst.ptr, self.numel, src.dtype,
                                                self.handle, comm.handle),
                  "squallCompressedAllGather")
        dst.finish()
        return output

    def _check_io(self, src, dst, what, out_numel, why):
        """The input has the compressor's numel, the output `out_numel`
        (`why`: how that follows from numel), both one dtype."""
        if dst.dtype != src.dtype:
            raise SquallInvalidArgument("squall: output must have the input's dtype")
        if src.numel != self.numel or dst.numel != out_numel:
            raise SquallInvalidArgument(
                f"squall: {what} takes an input of {self.numel} elements and an output of "
                f"{out_numel} ({why}); got {src.numel} and {dst.numel}")

    def _check_gather(self, src, dst):
        self._check_io(src, dst, "all_gather", self.numel * self.comm.size,
                       f"{self.comm.size} x the compressor's numel")

    def _check_shards(self, src, dst):
        self._check_io(src, dst, "reduce_scatter", self.recvcount,
                       f"the compressor's numel / {self.comm.size}")

    def _count_device_call(self):
        # NCCL counts nothing: add the library's figure for this call.
        st = _lib.CompressorStats()
        if lib.squallCompressorGetStats(self.handle, ctypes.byref(st)) == 0:
            self.traffic.bytes_sent += st.bytesSent
            self.traffic.bytes_received += st.bytesReceived

    def _require_kind(self, kind, what):
        if self.kind != kind:
            raise SquallInvalidUsage(
                f"squall: {what} with a compressor made for the {self.kind.replace('_', '-')}; "
                f"make one with squall.Compressor(comm, numel, codec, kind={kind!r})")

    def _check_buffers(self, src, dst):
        if dst.dtype != src.dtype:
            raise SquallInvalidArgument("squall: out must have the input's dtype")
        for b, what in ((src, "tensor"), (dst, "out")):
            if b.numel != self.numel:
                raise SquallInvalidArgument(
                    f"squall: {what} has {b.numel} elements but the compressor was created for "
                    f"{self.numel}; create one Compressor per buffer")

    def reset(self):
        """Zeroes the residuals (e.g. after loading parameters from elsewhere)."""
        with _cuda.device_guard(self.comm.device):
            check(lib.squallCompressorReset(self.handle), "squallCompressorReset")

    def save_state(self):
        """This rank's residuals (the error still owed) as bytes, for a
        checkpoint: load them with :meth:`load_state` into a compressor made
        the same way on the same rank and group, and the next call sends what
        this one's would have. Call with no async call in flight. On a
        communicator from NCCL it waits for the compressor's last stream."""
        self._require_state("save_state")
        size, written = ctypes.c_size_t(), ctypes.c_size_t()
        check(lib.squallCompressorStateSize(self.handle, ctypes.byref(size)),
              "squallCompressorStateSize")
        buf = ctypes.create_string_buffer(max(size.value, 1))
        check(lib.squallCompressorSaveState(self.handle, buf, size.value, ctypes.byref(written)),
              "squallCompressorSaveState")
        return buf.raw[:written.value]

    def load_state(self, state):
        """Loads what :meth:`save_state` returned (bytes, or a uint8 tensor or
        array). Refused, with the residuals left as they were, when it is
        another rank's, another layout's, count's or code's, or corrupt."""
        self._require_state("load_state")
        if hasattr(state, "numpy"):  # a torch tensor (torch.save keeps bytes as they are)
            state = state.detach().cpu().contiguous().numpy()
        data = bytes(memoryview(state).cast("B")) if not isinstance(state, bytes) else state
        check(lib.squallCompressorLoadState(self.handle, data, len(data)),
              "squallCompressorLoadState")

    def _require_state(self, what):
        if not _lib.HAVE_COMPRESSOR_STATE:
            raise _lib.SquallUnsupported(
                f"squall: Compressor.{what}: the loaded libsquall ({_lib.path}) cannot save "
                "compressor states; build a newer Squall")

    @property
    def stats(self):
        """Running totals: 'calls', 'skipped_calls', and 'bytes_sent' /
        'bytes_received', this rank's bytes over every call as the library
        counted them where it handed them to the transport (on a communicator
        from NCCL, which counts nothing, the sum of each call's own figure).
        'last_bytes_sent' / 'last_bytes_received' are the last call's."""
        s = _lib.CompressorStats()
        with _cuda.device_guard(self.comm.device):
            check(lib.squallCompressorGetStats(self.handle, ctypes.byref(s)))
        return {"calls": s.calls, "skipped_calls": s.skippedCalls,
                "bytes_sent": self.traffic.bytes_sent,
                "bytes_received": self.traffic.bytes_received,
                "last_bytes_sent": s.bytesSent, "last_bytes_received": s.bytesReceived}

    def close(self):
        if self._h is not None:
            h, self._h = self._h, None
            lib.squallCompressorDestroy(h)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        kind = "" if self.kind == "allreduce" else f" kind={self.kind}"
        return f"<squall.Compressor {self.codec} numel={self.numel}{kind}>"


# ---- the default communicator and torch.distributed ----------------------


def get_default():
    """The communicator made by the last :func:`init` (or set_default)."""
    if _default is None or _default.closed:
        raise SquallInvalidUsage(
            "squall: no default communicator; call squall.init() (after "
            "torch.distributed.init_process_group) or pass comm=")
    return _default


def set_default(comm):
    global _default
    with _default_lock:
        old, _default = _default, comm
    # The old default may be freed here and close itself, which takes the
    # lock again: drop our reference only after releasing it.
    del old


def _global_rank(dist, group, group_rank):
    if group is None or group is dist.group.WORLD:
        return group_rank
    if hasattr(dist, "get_global_rank"):  # torch >= 2.0
        return dist.get_global_rank(group, group_rank)
    return dist.distributed_c10d._get_global_rank(group, group_rank)  # torch 1.13


def _launched():
    return any(os.environ.get(v) for v in ("RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"))


def init(process_group=None, transport=None, timeout=None, set_as_default=True):
    """Creates a Communicator over the ranks of a torch.distributed process group
    (default: the world) and makes it the default one.

    Without an initialised torch.distributed (or without torch), and with no
    process_group given, it creates the communicator from the launcher's
    variables instead (Communicator.from_env: torchrun, srun, mpirun).

    torch.distributed must be initialised. The group's first member creates the
    unique id; it reaches the others through the process group's store, where
    every member also announces itself. Collective over the group's members; a
    process outside the group gets None. A member that does not call it makes
    the others raise SquallTimeout naming the missing ranks after the
    communicator's timeout (`timeout`, else SQUALL_TIMEOUT_S, default 300 s).

    transport='nccl' creates an NCCL communicator on the current CUDA device
    (torch.cuda.set_device first) and wraps it (squallCommInitFromNccl); the
    result reduces CUDA tensors on the GPU (see Communicator). It needs a
    CUDA build of torch, libnccl.so.2 and libsquall built with CUDA and NCCL;
    timeout does not apply to it. Its NCCL id and every rank's local checks
    go through one all_gather_object on the group, so a rank that cannot
    take part makes every rank raise.
    """
    try:
        import torch.distributed as dist
    except ImportError:
        dist = None
    if dist is None or not dist.is_available() or not dist.is_initialized():
        if process_group is None and _launched():
            # No torch process group: the launcher's own variables (torchrun,
            # srun, mpirun) give the ranks, as squallCommInitFromEnv reads them.
            comm = Communicator.from_env(transport, timeout)
            if set_as_default:
                set_default(comm)
            return comm
        raise SquallInvalidUsage(
            "squall.init: torch.distributed is not initialised and no launcher variables are "
            "set; call torch.distributed.init_process_group first, or start the job with "
            "torchrun, srun or mpirun (or use squall.Communicator.from_unique_id)")
    group = process_group if process_group is not None else dist.group.WORLD
    rank = dist.get_rank(group)
    if rank < 0:  # not a member of the subgroup
        return None
    size = dist.get_world_size(group)
    if isinstance(transport, str) and transport.lower() == "nccl":
        if timeout is not None:
            raise SquallInvalidArgument(
                "squall.init: timeout applies to the host transports; a communicator from NCCL "
                "has none (leave timeout=None with transport='nccl')")
        comm = _init_nccl(dist, group, process_group, rank, size)
        if set_as_default:
            set_default(comm)
        return comm
    _config(transport, timeout)  # refuse bad arguments before the others wait for this rank
    uid = _rendezvous(dist, group, process_group, rank, size, timeout)
    comm = Communicator.from_unique_id(uid, size, rank, transport, timeout,
                                       process_group=process_group)
    if set_as_default:
        set_default(comm)
    return comm


# How many squall.init calls this process made per group: the n-th call of
# every member meets the n-th call of the others under the same store keys.
_init_calls = {}


def _timeout_seconds(timeout):
    """The communicator's timeout: `timeout`, else SQUALL_TIMEOUT_S, else the
    library's default (300 s, params.def)."""
    if timeout is not None:
        return float(getattr(timeout, "total_seconds", lambda: timeout)())
    try:
        return float(os.environ.get("SQUALL_TIMEOUT_S", "") or 300)
    except ValueError:
        return 300.0


def _store_has(store, key):
    if hasattr(store, "check"):
        return store.check([key])
    import datetime  # torch 1.13's stores have no check(): a wait that ends at once

    try:
        store.wait([key], datetime.timedelta(milliseconds=1))
        return True
    except Exception:  # noqa: BLE001 - its timeout error
        return False


def _rendezvous(dist, group, process_group, rank, size, timeout):
    """Every member of `group` announces itself in the process group's store
    and waits, at most the communicator's timeout, for the others; the
    group's first member publishes the unique id. Returns the unique id.

    The store, unlike a collective on the group, waits for a deadline of
    Squall's own (gloo's and NCCL's default is 30 minutes or more) and says
    which ranks never came, so a rank that skips squall.init makes every rank
    that called it fail with their names instead of hanging."""
    get_store = getattr(dist.distributed_c10d, "_get_default_store", None)
    if get_store is None:  # a torch without it: the collective, on torch's timeout
        obj = [get_unique_id() if rank == 0 else None]
        dist.broadcast_object_list(obj, src=_global_rank(dist, process_group, 0), group=group)
        return obj[0]
    import datetime

    store = get_store()
    members = [_global_rank(dist, process_group, r) for r in range(size)]
    name = "world" if process_group is None else "ranks-" + "-".join(map(str, members))
    _init_calls[name] = _init_calls.get(name, 0) + 1
    prefix = f"squall/init/{name}/{_init_calls[name]}"
    if rank == 0:
        store.set(prefix + "/uid", get_unique_id())
    store.set(f"{prefix}/joined/{rank}", "1")
    keys = [f"{prefix}/joined/{r}" for r in range(size)]
    seconds = _timeout_seconds(timeout)
    try:
        store.wait(keys, datetime.timedelta(seconds=seconds))
    except Exception as e:  # noqa: BLE001 - the store's timeout error differs between versions
        missing = [members[r] for r, k in enumerate(keys) if not _store_has(store, k)]
        if not missing:  # they came as the wait ended
            return store.get(prefix + "/uid")
        which = "rank " if len(missing) == 1 else "ranks "
        raise _lib.SquallTimeout(
            f"squall.init: {which}{', '.join(map(str, missing))} of the "
            f"{'world' if process_group is None else 'group ' + str(members)} did not call "
            f"squall.init within {seconds:g} s (call {_init_calls[name]} on this group; this is "
            f"rank {members[rank]}). Every rank of the group must call it, as often as the "
            "others. Usual causes: only some ranks run the code that calls it (a branch on the "
            "rank, a constructor that only rank 0 runs), a rank crashed or is still busy (see "
            "its log), or a launcher that starts ranks itself (Lightning, "
            "torch.multiprocessing.spawn, Accelerate) without every rank being patched. Raise "
            "timeout= or SQUALL_TIMEOUT_S if they are only slow.") from e
    return store.get(prefix + "/uid")


def _init_nccl(dist, group, process_group, rank, size):
    what = "squall.init(transport='nccl')"
    nccl = device = uid = error = None
    try:
        device = _cuda.current_device(what)
        _lib.require_gpu(what)
        nccl = _nccl.load()
        if rank == 0:
            with _cuda.device_guard(device):
                uid = nccl.get_unique_id()
    except Exception as e:  # noqa: BLE001 - every rank must hear of it, below
        error = e
    # One collective hands out the NCCL id and every rank's local failure, so
    # that all ranks raise together instead of some waiting in ncclCommInitRank.
    mine = (None if error is None else (getattr(error, "code", None),
                                        f"{type(error).__name__}: {error}"), uid)
    everyone = [None] * size
    dist.all_gather_object(everyone, mine, group=group)
    if error is not None:
        raise error
    for r, (err, _) in enumerate(everyone):
        if err is not None:
            cls = _lib._ERRORS.get(err[0], SquallError)
            raise cls(f"{what}: rank {r} of the group failed: {err[1]}")
    with _cuda.device_guard(device):
        nc = nccl.init_rank(size, everyone[0][1], rank)
        h = ctypes.c_void_p()
        try:
            check(lib.squallCommInitFromNccl(ctypes.byref(h), nc.handle),
                  "squallCommInitFromNccl")
            return Communicator(h, process_group, nccl=nc, device=device)
        except BaseException:
            if h.value:
                lib.squallCommDestroy(h)
            nc.destroy()
            raise


def shutdown():
    """Closes the default communicator."""
    if _default is not None:
        _default.close()


def allreduce(tensor, op="avg", codec=None, compressor=None, comm=None, async_op=False):
    """Allreduce `tensor` in place across the ranks of `comm` (default: the
    communicator of the last squall.init()).

    * no codec, no compressor: full precision (fp32/fp64/fp16/bf16/int32/int64;
      'sum', 'avg', 'min', 'max');
    * compressor=squall.Compressor(...): error-compensated compressed allreduce
      (fp32/fp16/bf16; 'sum' or 'avg'), bit-identical on every rank. The
      compressor holds the residuals; reuse it for this buffer every step.
      `codec`, if also given, must match the compressor's.

    Passing a codec without a compressor is an error: compression without its
    residuals is biased, so the state is explicit. Returns the tensor (or a
    Request with async_op=True).
    """
    if compressor is not None:
        if comm is not None and comm is not compressor.comm:
            raise SquallInvalidUsage("squall: the compressor belongs to another communicator")
        if codec is not None and codec_string(parse_codec(codec)) != compressor.codec:
            raise SquallInvalidUsage(
                f"squall: codec {codec!r} differs from the compressor's {compressor.codec!r}")
        return compressor.allreduce(tensor, op, async_op=async_op)
    if codec is not None and codec_string(parse_codec(codec)) != "none":
        n = tensor.numel() if is_tensor(tensor) else getattr(tensor, "size", "n")
        raise SquallInvalidUsage(
            f"squall: a compressed allreduce needs its error-feedback state: create "
            f"c = squall.Compressor(comm, {n}, {codec!r}) once and call "
            "squall.allreduce(t, compressor=c) every step")
    return (comm if comm is not None else get_default()).allreduce(tensor, op, async_op)
