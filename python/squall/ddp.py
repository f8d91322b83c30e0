"""DDP communication hooks over Squall.

1-bit averaging of the momentum of momentum SGD (the state reads the
optimizer's momentum; see OnebitState)::

    opt = torch.optim.SGD(ddp_model.parameters(), lr=0.1, momentum=0.9)
    state = squall.ddp.OnebitState(optimizer=opt)
    ddp_model.register_comm_hook(state, squall.ddp.onebit_hook)

APMSqueeze (the optimizer communicates; DDP only averages during warmup)::

    opt = squall.optim.APMSqueeze(ddp_model.parameters(), ...)
    ddp_model.register_comm_hook(squall.ddp.APMSqueezeState(opt), squall.ddp.apmsqueeze_hook)

The hooks are asynchronous: each starts Squall's asynchronous allreduce of
the bucket (squallAllReduceAsync / squallCompressedAllReduceAsync) and
returns a torch.futures.Future at once; one completion thread per state
waits for the operations in the order they were started (the order the
communicator runs them in) and completes the futures, so a bucket's
communication overlaps the rest of backward and the next buckets' start.
DDP calls the hook in bucket order on every rank, so every rank starts the
same operations in the same order.

On a communicator from NCCL (squall.init(transport="nccl")) CUDA buckets are
reduced on the current stream and the future is complete when returned
(later work on the stream sees the result; that combination has not run on
GPU hardware yet). On a host communicator CUDA buckets are staged through
host memory.
"""

import atexit
import queue
import threading
import warnings
import weakref

import torch

from ._comm import Compressor, Traffic, get_default
from ._lib import SquallInvalidArgument

#: OnebitState's defaults, chosen by `perf/bench.py ddp-quality` (docs/benchmarks.md).
DEFAULT_CODEC = "onebit"
DEFAULT_WARMUP_STEPS = 100
DEFAULT_MIN_COMPRESS_NUMEL = 0


def _buffer(bucket):
    return bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()


def _done(tensor):
    fut = torch.futures.Future()
    fut.set_result(tensor)
    return fut


def _is_last(bucket):
    return bucket.is_last() if hasattr(bucket, "is_last") else bucket.index() == 0


def _bucket_params(bucket):
    if hasattr(bucket, "parameters"):
        return list(bucket.parameters())
    if hasattr(bucket, "get_model_params_for_bucket"):  # torch < 1.10
        return list(bucket.get_model_params_for_bucket())
    return None


# Completers whose thread runs; stopped at exit (_stop_completion_threads).
_running = weakref.WeakSet()


class _Completer:
    """Waits for a state's started operations in start order on one daemon
    thread and completes their futures; keeps the state's byte counters.

    Bytes are the communicator's counters across each busy period (from the
    first operation started while none was in flight to the last one's end):
    exact as long as nothing else uses the communicator while a backward pass
    has hook operations in flight (DDP's optimizer step comes after them)."""

    def __init__(self, traffic, lock):
        self._queue = queue.Queue()
        self._traffic = traffic
        self._lock = lock
        self._thread = None
        self._in_flight = 0
        self._base = None
        self._comm = None

    def begin(self, comm):
        """Before starting a bucket's operations: opens a busy period if none is
        open (reads the counters before the first operation moves a byte)."""
        with self._lock:
            if self._in_flight == 0:
                self._comm, self._base = comm, comm._bytes()
            self._in_flight += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="squall-ddp-hook",
                                                daemon=True)
                self._thread.start()
                _running.add(self)

    def submit(self, fut, finish):
        """After begin() and starting the operations: `finish()` waits for them
        and returns the future's value; called on the completion thread, in
        submit order. A start that raised must still submit (finish re-raises)."""
        self._queue.put((fut, finish))

    def busy_bytes(self):
        """The counters of the busy period in progress (under the lock)."""
        if self._in_flight and self._comm is not None:
            now = self._comm._bytes()
            if now is not None and self._base is not None:
                return now[0] - self._base[0], now[1] - self._base[1]
        return 0, 0

    def _run(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            fut, finish = item
            try:
                value, error = finish(), None
            except BaseException as e:  # noqa: BLE001 - handed to whoever waits on fut
                value, error = None, e
            with self._lock:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._traffic.add(self._base, self._comm._bytes())
                    self._comm = self._base = None
            if error is None:
                fut.set_result(value)
            else:
                fut.set_exception(error)

    def close(self):
        """Stops the thread once it has completed what was submitted (each
        operation ends by its communicator's timeout at the latest)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        _running.discard(self)


@atexit.register
def _stop_completion_threads():
    """Before the interpreter finalises: a completion thread still running
    then would be ended wherever it next takes the GIL, which is often inside
    a torch call (copy_, set_result) that takes it back in a noexcept
    destructor, and the process aborts ("terminate called without an active
    exception"). A script that ends right after its last backward pass has
    the last bucket's completion still in flight."""
    for completer in list(_running):
        completer.close()


class _Layout:
    """Which elements of one bucket go through the compressed allreduce (all
    of them, or with keep_1d_full those of parameters that are not
    1-dimensional: biases and norm scales stay at full precision), and in
    which order: the compressed elements are taken parameter by parameter in
    `canon` order (each parameter's index in the order the hook first saw
    them, which is DDP's first iteration's), so that the residual and the
    shared momentum keep their meaning when DDP reorders a bucket's
    parameters (it rebuilds its buckets after the first iteration, in the
    order the gradients arrived) and a resumed job, whose first iteration
    has the first layout again, finds them where it left them.
    `key` says which state fits: the parameters' canonical indices and the
    dtype (the size and the dtype where the parameters are not known)."""

    def __init__(self, buf, params, keep_1d_full, canon=None):
        n = buf.numel()
        self.numel, self.dtype = n, buf.dtype
        comp, full = [(0, n)], []
        if params is not None and sum(p.numel() for p in params) == n:
            at, off = {}, 0
            for p in params:
                at[id(p)] = (off, off + p.numel())
                off += p.numel()
            order = sorted(params, key=lambda p: canon[id(p)]) if canon is not None else params
            comp = [at[id(p)] for p in order if not keep_1d_full or p.dim() > 1]
            full = [at[id(p)] for p in order if keep_1d_full and p.dim() <= 1]
            self.key = (tuple(sorted(canon[id(p)] for p in params)) if canon is not None
                        else n, str(buf.dtype))
        else:  # parameters unknown, or an unexpected layout: compress all of it
            self.key = (n, str(buf.dtype))
        self.comp, self.full = _merge(comp), _merge(full)
        self.comp_numel = sum(b - a for a, b in self.comp)
        self.full_numel = n - self.comp_numel
        self.whole = self.comp == [(0, n)]  # the compressed elements are the buffer as it is
        self.ids = None if params is None else tuple(id(p) for p in params)

    def fits(self, buf, params):
        """Whether this is the layout of `buf` holding `params` in this order."""
        return (buf.numel() == self.numel and buf.dtype == self.dtype and
                self.ids == (None if params is None else tuple(id(p) for p in params)))


def _merge(ranges):
    out = []
    for a, b in ranges:
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        elif b > a:
            out.append((a, b))
    return out


def _gather(buf, ranges, out):
    off = 0
    for a, b in ranges:
        out[off:off + b - a].copy_(buf[a:b])
        off += b - a


def _scatter(src, ranges, buf):
    off = 0
    for a, b in ranges:
        buf[a:b].copy_(src[off:off + b - a])
        off += b - a


class _Bucket:
    """Per-bucket state: the layout, the compressor (the residuals) and, for
    compressed momentum, the shared momentum and the work buffers."""

    def __init__(self, comm, layout, buf, state):
        self.layout = layout
        n = layout.comp_numel
        self.compressor = Compressor(comm, n, state.codec) if n else None
        self.comp_buf = None if (layout.whole and state.momentum_of() == 0) else torch.empty(
            n, dtype=buf.dtype, device=buf.device)
        self.full_buf = None if (layout.full_numel == 0 or n == 0) else torch.empty(
            layout.full_numel, dtype=buf.dtype, device=buf.device)
        self.mbar = None  # the averaged momentum of the compressed elements (every rank's)
        self.device = buf.device

    def close(self):
        if self.compressor is not None:
            self.compressor.close()


class OnebitState:
    """State of onebit_hook.

    The first `warmup_steps` iterations average in full precision; then each
    bucket goes through Squall's error-compensated compressed allreduce with
    `codec` ("onebit", "onebit:block=256", "int8", ...).

    optimizer: the torch.optim.SGD (or any optimizer whose param_groups hold
    'momentum' and 'dampening') that consumes the averaged gradients; the
    hook reads its momentum at every call (set state.optimizer later if the
    optimizer is built after the state, but before the first backward).
    momentum: the same number given directly, when there is no optimizer
    object (0 and no optimizer: compress the gradient, with error feedback on
    the gradient; it warns once). With a momentum the hook compresses the
    momentum instead: each rank forms m_i = momentum * m + g_i from the
    shared momentum m, the compressed allreduce (with error feedback on m_i)
    gives the new m, and the hook returns m_new - momentum * m_old, so that
    SGD's own momentum buffer becomes exactly the compressed average m. The
    momentum must be the optimizer's (dampening 0; nesterov and weight decay
    are fine), which `optimizer` guarantees.

    min_compress_numel: buckets with fewer elements are averaged in full
    precision. keep_1d_full: 1-dimensional parameters (biases, norm scales)
    are averaged in full precision inside compressed buckets.

    warmup_backend: "torch" averages the warmup buckets with the process
    group's own asynchronous allreduce (DDP's default path; needs
    torch.distributed), "squall" with Squall's asynchronous full-precision
    allreduce. Default: "torch" when torch.distributed is initialised.

    counters() returns every counter at once. Per-bucket state is keyed by
    bucket index, over the bucket's compressed elements in the order the
    hook first saw their parameters (_Layout): when DDP rebuilds its buckets
    after the first iteration and reorders a bucket's parameters the state
    follows them; a bucket whose parameters change is re-created (residuals
    zeroed), so keep warmup_steps >= 1 so that happens before compression
    starts.

    Checkpoints: state_dict() holds this rank's residuals, the shared
    momentum and the iteration count; load_state_dict() in the resumed job
    (before its first backward) puts them back, each bucket's when DDP makes
    a bucket of that index, size and dtype.
    """

    def __init__(self, comm=None, warmup_steps=DEFAULT_WARMUP_STEPS, codec=DEFAULT_CODEC,
                 momentum=0.0, min_compress_numel=DEFAULT_MIN_COMPRESS_NUMEL,
                 keep_1d_full=False, warmup_backend=None, process_group=None, optimizer=None):
        if int(warmup_steps) != warmup_steps or warmup_steps < 0:
            raise ValueError(
                f"squall.ddp.OnebitState: warmup_steps must be an int >= 0, not {warmup_steps!r}")
        if warmup_steps == 0:
            warnings.warn(
                "squall.ddp.OnebitState(warmup_steps=0): DDP rebuilds its buckets after the first "
                "iteration, which re-creates the compressors and throws away the residuals "
                "(error feedback) of iteration 1; use warmup_steps >= 1", stacklevel=2)
        if not 0.0 <= float(momentum) < 1.0:
            raise ValueError(
                f"squall.ddp.OnebitState: momentum must be in [0, 1), the SGD optimizer's, not "
                f"{momentum!r}")
        if warmup_backend not in (None, "torch", "squall"):
            raise ValueError(
                f"squall.ddp.OnebitState: warmup_backend is 'torch', 'squall' or None, not "
                f"{warmup_backend!r}")
        self.comm = comm
        self.warmup_steps = int(warmup_steps)
        self.codec = codec
        self.momentum = float(momentum)
        self.optimizer = optimizer
        self._said_momentum = False
        self.min_compress_numel = int(min_compress_numel)
        self.keep_1d_full = bool(keep_1d_full)
        self.warmup_backend = warmup_backend
        self.process_group = process_group
        self.step = 0  # iterations completed (counted on each iteration's last bucket)
        self.buckets = {}  # bucket index -> _Bucket
        self.full_buckets = 0
        self.compressed_buckets = 0
        self._lock = threading.Lock()
        self.traffic = Traffic()  # cumulative bytes of this hook's Squall allreduces
        self.torch_bytes = 0  # payload bytes handed to torch.distributed in warmup
        self._completer = _Completer(self.traffic, self._lock)
        self._pending = {}  # bucket index -> loaded state not yet matched by a bucket
        self._canon = {}  # id(parameter) -> the order the hook first saw it in (_Layout)
        self._loaded_at = None  # the step load_state_dict set

    def _comm(self):
        return self.comm if self.comm is not None else get_default()

    def momentum_of(self):
        """The momentum the hook compresses with: the optimizer's, else `momentum`."""
        opt = self.optimizer
        if opt is None:
            if not self.momentum and not self._said_momentum:
                self._said_momentum = True
                warnings.warn(
                    "squall.ddp.OnebitState: no optimizer= or momentum= given, so the hook "
                    "compresses gradients; with momentum SGD pass optimizer=opt (compressed "
                    "momentum keeps fp32's loss, gradient compression trails it: see "
                    "docs/benchmarks.md)", stacklevel=3)
            return self.momentum
        values = {(g.get("momentum", 0.0), g.get("dampening", 0.0)) for g in opt.param_groups}
        if len(values) != 1:
            raise ValueError(
                "squall.ddp.OnebitState: the optimizer's parameter groups have different "
                f"momentum or dampening ({sorted(values)}); the hook needs one momentum")
        beta, damp = values.pop()
        if damp:
            raise ValueError(
                f"squall.ddp.OnebitState: the optimizer has dampening={damp}; compressed "
                "momentum needs dampening 0")
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"squall.ddp.OnebitState: optimizer momentum {beta} not in [0, 1)")
        return float(beta)

    def _use_torch(self):
        if self.warmup_backend == "squall":
            return False
        dist = torch.distributed
        ok = dist.is_available() and dist.is_initialized()
        if self.warmup_backend == "torch" and not ok:
            raise RuntimeError("squall.ddp.OnebitState(warmup_backend='torch') needs an "
                               "initialised torch.distributed; use warmup_backend='squall'")
        return ok

    def counters(self):
        """All counters at once: 'steps' (iterations), 'warmup_steps' (of them at
        full precision), 'calls' (buckets), 'full_calls', 'compressed_calls',
        'bytes_sent' / 'bytes_received' (this rank, Squall's allreduces as the
        library counted them, including the operations in flight) and
        'torch_bytes' (bucket bytes handed to torch.distributed's allreduce in
        warmup, which Squall does not see on the wire)."""
        with self._lock:
            s, r = self._completer.busy_bytes()
            return {"steps": self.step, "warmup_steps": min(self.step, self.warmup_steps),
                    "calls": self.full_buckets + self.compressed_buckets,
                    "full_calls": self.full_buckets,
                    "compressed_calls": self.compressed_buckets,
                    "bytes_sent": self.traffic.bytes_sent + s,
                    "bytes_received": self.traffic.bytes_received + r,
                    "torch_bytes": self.torch_bytes}

    @property
    def stats(self):
        return self.counters()

    def bucket(self, index, buf, params):
        b = self.buckets.get(index)
        if b is not None and b.layout.fits(buf, params):
            return b  # every call but the first and those after DDP rebuilt its buckets
        self._see(params)
        layout = _Layout(buf, params, self.keep_1d_full, self._canon if params else None)
        if b is not None and b.layout.key == layout.key:
            if b.layout.comp != layout.comp or b.layout.full != layout.full:
                if b.comp_buf is None and not layout.whole:
                    b.comp_buf = torch.empty(layout.comp_numel, dtype=buf.dtype,
                                             device=buf.device)
                b.layout = layout  # the same parameters reordered: their state stays
            return b
        if b is not None:
            b.close()  # other parameters: start over
        b = _Bucket(self._comm(), layout, buf, self)
        self.buckets[index] = b
        self._restore(index, b)
        return b

    def _see(self, params):
        """Numbers the parameters in the order the hook first meets them."""
        if params is not None:
            for p in params:
                if id(p) not in self._canon:
                    self._canon[id(p)] = len(self._canon)

    def state_dict(self):
        """This rank's part of the hook's state, for the checkpoint: the
        iteration count (so a resumed job does not warm up again), the
        counters and, per DDP bucket index, the bucket's size and dtype, this
        rank's residual and, with compressed momentum, the shared averaged
        momentum. Take it between iterations (DDP has waited for the hook's
        work by the end of backward); each rank saves its own, beside the
        model's and the optimizer's state."""
        with self._lock:
            buckets = dict(self._pending)  # loaded, and not matched by a bucket yet
            for index, b in self.buckets.items():
                buckets[index] = {
                    "key": b.layout.key,
                    "residual": b.compressor.save_state() if b.compressor is not None else None,
                    "momentum": b.mbar.detach().to("cpu", copy=True) if b.mbar is not None
                    else None}
            return {"format": 1, "rank": _rank(), "codec": self.codec, "step": self.step,
                    "full_buckets": self.full_buckets,
                    "compressed_buckets": self.compressed_buckets, "buckets": buckets}

    def load_state_dict(self, state):
        """Loads what state_dict() returned on this rank, before the resumed
        job's first backward. A bucket's residual and momentum come back when
        DDP makes the bucket of that index with the saved size and dtype (the
        same model, bucket sizes and world give the same buckets); any still
        unmatched two iterations later are dropped with a warning (that
        bucket starts from zero residual and momentum, as at a first step)."""
        if not isinstance(state, dict) or state.get("format") != 1:
            raise SquallInvalidArgument(
                "squall.ddp.OnebitState: not a state from OnebitState.state_dict (no 'format': 1)")
        if state.get("rank", _rank()) != _rank():
            raise SquallInvalidArgument(
                f"squall.ddp.OnebitState: the state is rank {state['rank']}'s and this is rank "
                f"{_rank()}: each rank loads the state it saved")
        if state.get("codec", self.codec) != self.codec:
            raise SquallInvalidArgument(
                f"squall.ddp.OnebitState: the state was saved compressing with {state['codec']} "
                f"and this state compresses with {self.codec}: a residual is owed in its own "
                "code; make the state with the saved code, or do not load it")
        with self._lock:
            self.step = int(state["step"])
            self.full_buckets = int(state.get("full_buckets", 0))
            self.compressed_buckets = int(state.get("compressed_buckets", 0))
            self._pending = {int(i): e for i, e in state["buckets"].items()}
            self._loaded_at = self.step
        for index, b in list(self.buckets.items()):
            self._restore(index, b)

    def _restore(self, index, b):
        """Puts a loaded bucket state into bucket `index` if it is the one saved."""
        entry = self._pending.get(index)
        if entry is None or _key(entry["key"]) != b.layout.key:
            return
        if entry["residual"] is not None and b.compressor is not None:
            b.compressor.load_state(entry["residual"])  # refused as a whole: nothing changed
        elif b.compressor is not None:
            b.compressor.reset()
        m = entry["momentum"]
        b.mbar = None if m is None else m.to(b.device, copy=True)
        del self._pending[index]

    def _drop_unmatched(self):
        """Once two iterations have run after a load (DDP rebuilds its
        buckets after the first), bucket states no bucket took are dropped,
        saying so."""
        if self._pending and self._loaded_at is not None and self.step >= self._loaded_at + 2:
            warnings.warn(
                "squall.ddp.OnebitState: the loaded state of DDP bucket(s) "
                f"{sorted(self._pending)} matched no bucket of this job (another model, bucket "
                "size or world?); those buckets started from zero residual and momentum",
                stacklevel=3)
            self._pending = {}

    def close(self):
        """Stops the completion thread (after the operations in flight) and frees
        the compressors."""
        self._completer.close()
        for b in self.buckets.values():
            b.close()
        self.buckets.clear()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __getstate__(self):
        raise TypeError("squall.ddp.OnebitState cannot be pickled")


def _key(saved):
    """A layout key as saved (torch.save keeps tuples; other savers may make lists)."""
    first, dtype = saved
    return (tuple(first) if isinstance(first, (list, tuple)) else first, dtype)


def _rank():
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _torch_average(state, buf):
    import torch.distributed as dist

    group = state.process_group
    world = dist.get_world_size(group)
    fut = dist.all_reduce(buf, group=group, async_op=True).get_future()
    with state._lock:
        state.torch_bytes += buf.numel() * buf.element_size()
    return fut.then(lambda f: f.value()[0].div_(world))


def _full_average(state, comm, buf, keep_momentum=None):
    fut = torch.futures.Future()
    if comm._nccl is None:
        state._completer.begin(comm)
    try:
        req = comm.allreduce(buf, "avg", async_op=True)
    except BaseException as e:  # noqa: BLE001 - through the future, after the busy period
        return _failed(state, comm, fut, e)

    def finish():
        req.wait()
        if keep_momentum is not None:
            keep_momentum(buf)
        return buf

    if comm._nccl is not None:  # the GPU stream orders the work: complete when returned
        return _done(finish())
    state._completer.submit(fut, finish)
    return fut


def _failed(state, comm, fut, error):
    if comm._nccl is not None:
        raise error

    def finish():
        raise error

    state._completer.submit(fut, finish)
    return fut


def onebit_hook(state, bucket):
    """DDP comm hook: full-precision average during warmup, then the
    error-compensated compressed average of each bucket (bit-identical on
    every rank). Returns at once; the future completes when the allreduce has."""
    buf = _buffer(bucket)
    comm = state._comm()
    warm = state.step < state.warmup_steps
    small = buf.numel() < state.min_compress_numel
    params = _bucket_params(bucket)
    state._see(params)  # from the first iteration on: DDP's first layout orders the state
    state._drop_unmatched()
    if _is_last(bucket):
        state.step += 1  # the futures of this iteration are waited for before the next
    beta = state.momentum_of()
    b = None
    if beta and not small:
        b = state.bucket(bucket.index(), buf, params)
    if warm or small:
        with state._lock:
            state.full_buckets += 1
        track = None
        if b is not None:
            track = _momentum_tracker(b, beta)
        if warm and state._use_torch():
            fut = _torch_average(state, buf)
            if track is not None:
                def tracked(f):
                    t = f.value()
                    track(t)
                    return t
                fut = fut.then(tracked)
            return fut
        return _full_average(state, comm, buf, track)
    with state._lock:
        state.compressed_buckets += 1
    if b is None:
        b = state.bucket(bucket.index(), buf, params)
    return _compressed_average(state, comm, b, buf, beta)


def _momentum_tracker(b, beta):
    """During full-precision steps: the shared momentum follows SGD's buffer
    (m = momentum * m + averaged gradient) so the compressed steps start from it."""
    lay = b.layout

    def track(avg):
        if b.mbar is None:
            b.mbar = torch.zeros(lay.comp_numel, dtype=avg.dtype, device=avg.device)
        g = avg if lay.whole else _ranges_copy(avg, lay.comp, b.comp_buf)
        b.mbar.mul_(beta).add_(g)

    return track


def _ranges_copy(buf, ranges, out):
    _gather(buf, ranges, out)
    return out


def _compressed_average(state, comm, b, buf, beta):
    lay = b.layout
    if beta and b.comp_buf is None:  # momentum switched on after the bucket was made
        b.comp_buf = torch.empty(lay.comp_numel, dtype=buf.dtype, device=buf.device)
    fut = torch.futures.Future()
    reqs = []
    if lay.comp_numel:
        src = buf if b.comp_buf is None else b.comp_buf
        if not lay.whole:
            _gather(buf, lay.comp, src)
        elif src is not buf:
            src.copy_(buf)
        if beta:
            if b.mbar is None:  # no warmup: start from zero momentum
                b.mbar = torch.zeros_like(src)
            src.add_(b.mbar, alpha=beta)  # m_i = beta * m + g_i
    if lay.full_numel:
        _gather(buf, lay.full, b.full_buf)
    if comm._nccl is None:
        state._completer.begin(comm)
    try:
        if lay.full_numel:
            reqs.append(comm.allreduce(b.full_buf, "avg", async_op=True))
        if lay.comp_numel:
            reqs.append(b.compressor.allreduce(src, "avg", async_op=True))
    except BaseException as e:  # noqa: BLE001 - wait for what started, then report
        started = list(reqs)

        def finish_failed():
            for r in started:
                r.wait()
            raise e

        if comm._nccl is not None:
            raise
        state._completer.submit(fut, finish_failed)
        return fut

    def finish():
        for r in reqs:
            r.wait()
        if lay.full_numel:
            _scatter(b.full_buf, lay.full, buf)
        if lay.comp_numel:
            src = buf if b.comp_buf is None else b.comp_buf
            if beta:
                # src is the new averaged momentum; SGD gets m_new - beta * m_old
                # and so ends with exactly m_new in its buffer.
                b.mbar.mul_(-beta).add_(src)
                b.mbar, delta = src, b.mbar
                b.comp_buf = delta  # the old buffer becomes next step's work buffer
                src = delta
            if src is not buf:
                if not lay.whole:
                    _scatter(src, lay.comp, buf)
                else:
                    buf.copy_(src)
        return buf

    if comm._nccl is not None:  # the GPU stream orders the work: complete when returned
        return _done(finish())
    state._completer.submit(fut, finish)
    return fut


class APMSqueezeState:
    """State of apmsqueeze_hook: the optimizer whose `in_warmup` decides (any
    object with that attribute works), and counters (counters())."""

    def __init__(self, optimizer, comm=None):
        self.optimizer = optimizer
        if hasattr(optimizer, "_hooked"):
            optimizer._hooked = True  # the optimizer need not warn about DDP
        self.comm = comm if comm is not None else getattr(optimizer, "comm", None)
        self._lock = threading.Lock()
        self.traffic = Traffic()  # cumulative bytes of this hook's warmup averages
        self._completer = _Completer(self.traffic, self._lock)
        self.allreduced_buckets = 0
        self.skipped_buckets = 0

    def counters(self):
        """'calls', 'allreduced_calls', 'skipped_calls', 'bytes_sent',
        'bytes_received' (this rank, including operations in flight)."""
        with self._lock:
            s, r = self._completer.busy_bytes()
            return {"calls": self.allreduced_buckets + self.skipped_buckets,
                    "allreduced_calls": self.allreduced_buckets,
                    "skipped_calls": self.skipped_buckets,
                    "bytes_sent": self.traffic.bytes_sent + s,
                    "bytes_received": self.traffic.bytes_received + r}

    @property
    def stats(self):
        return self.counters()

    def close(self):
        self._completer.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __getstate__(self):
        raise TypeError("squall.ddp.APMSqueezeState cannot be pickled")


def apmsqueeze_hook(state, bucket):
    """DDP comm hook for squall.optim.APMSqueeze: asynchronous full-precision
    average while the optimizer is in warmup; afterwards no communication at
    all (the local gradient is returned unchanged; the optimizer exchanges
    compressed momentum itself)."""
    buf = _buffer(bucket)
    if not state.optimizer.in_warmup:
        with state._lock:
            state.skipped_buckets += 1
        return _done(buf)
    comm = state.comm if state.comm is not None else get_default()
    with state._lock:
        state.allreduced_buckets += 1
    if comm._nccl is not None:
        comm.allreduce(buf, "avg")
        return _done(buf)
    return _full_average(state, comm, buf)


def local_hook(state, bucket):
    """DDP comm hook that leaves each rank's gradients as they are: for
    squall.optim.SlowMo, which averages the parameters itself every tau
    steps (state is unused)."""
    return _done(_buffer(bucket))


def _unwrap(optimizer):
    """The torch optimizer inside a framework's wrapper (Accelerate's
    AcceleratedOptimizer, Lightning's LightningOptimizer)."""
    for attr in ("optimizer", "_optimizer"):
        inner = getattr(optimizer, attr, None)
        if isinstance(inner, torch.optim.Optimizer):
            return _unwrap(inner)
    return optimizer


class _Deferred:
    """An optimizer given as a function, called when the hook first needs it:
    frameworks such as Lightning wrap the model in DDP (where the hook goes
    on) before they build the optimizer."""

    def __init__(self, get):
        self._get, self._optimizer = get, None

    def resolve(self):
        if self._optimizer is None:
            opt = self._get()
            if opt is None:
                raise ValueError("squall.ddp.register: the optimizer function returned None; "
                                 "it must return the model's optimizer once it exists")
            self._optimizer = _unwrap(opt)
            if hasattr(self._optimizer, "_hooked"):
                self._optimizer._hooked = True
        return self._optimizer

    param_groups = property(lambda self: self.resolve().param_groups)
    in_warmup = property(lambda self: self.resolve().in_warmup)


def register(model, hook="onebit", optimizer=None, warmup_steps=DEFAULT_WARMUP_STEPS,
             codec=DEFAULT_CODEC, comm=None):
    """Puts a Squall comm hook on a DistributedDataParallel `model` and
    returns its state. For code that builds DDP itself or through a framework
    (Accelerate's ``accelerator.prepare``, Lightning: see squall.lightning).

    hook:
      'onebit'     onebit_hook: `warmup_steps` full-precision steps, then
                   `codec`; compressed momentum when the optimizer is momentum
                   SGD, compressed gradients otherwise;
      'apmsqueeze' apmsqueeze_hook: the optimizer is a squall.optim.APMSqueeze,
                   which communicates itself after its warmup;
      'local'      local_hook: no averaging, for squall.optim.SlowMo.
    optimizer: the model's optimizer (a framework's wrapper of it is fine), or
    a function returning it, called at the first bucket, when the framework
    builds the optimizer after wrapping the model. Needs a Squall communicator
    (`comm`, else squall.init()'s) by the first backward pass.
    """
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        raise TypeError(f"squall.ddp.register: needs a DistributedDataParallel model, not "
                        f"{type(model).__name__} (accelerator.prepare and Lightning's DDP "
                        "strategy make one)")
    if callable(optimizer) and not isinstance(optimizer, torch.optim.Optimizer) and not hasattr(
            optimizer, "param_groups"):
        optimizer = _Deferred(optimizer)
    elif optimizer is not None:
        optimizer = _unwrap(optimizer)
    if hook == "onebit":
        state = OnebitState(comm=comm, warmup_steps=warmup_steps, codec=codec,
                            optimizer=optimizer)
        model.register_comm_hook(state, onebit_hook)
    elif hook == "apmsqueeze":
        if optimizer is None:
            raise ValueError("squall.ddp.register(hook='apmsqueeze') needs optimizer= (the "
                             "squall.optim.APMSqueeze, or a function returning it)")
        state = APMSqueezeState(optimizer, comm=comm)
        model.register_comm_hook(state, apmsqueeze_hook)
    elif hook == "local":
        state = None
        model._squall_local_hook = True  # squall.optim.SlowMo need not refuse this DDP
        model.register_comm_hook(state, local_hook)
    else:
        raise ValueError(f"squall.ddp.register: hook is 'onebit', 'apmsqueeze' or 'local', not "
                         f"{hook!r}")
    return state
