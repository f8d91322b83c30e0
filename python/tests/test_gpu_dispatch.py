"""The GPU path of the binding without a GPU: NCCL bindings, error messages,
and the dispatch of CUDA tensors to the OnStream entry points.

The dispatch tests run in a "fake GPU" world: squall._cuda (the only module
that asks torch about devices and streams) is replaced so that tensors
tagged `_fake_cuda` count as CUDA tensors of cuda:0, NCCL is replaced by a
stand-in whose communicators are Squall TCP communicators, and the OnStream
entry points by their host twins. The tensors stay in host memory, so the
host library computes every result, and the GPU path must give the bits of
the host path. tests/gpu/python_gpu_test.py runs the real thing on a GPU.
"""

import contextlib
import ctypes
import os
import re

import pytest
import torch

import _dist
import squall
from squall import _lib, _nccl

NCCL_H = [os.path.join(d, "include", "nccl.h")
          for d in (os.environ.get("CUDA_HOME", "/usr/local/cuda"), "/usr")]
NCCL_H = next((p for p in NCCL_H if os.path.exists(p)), None)
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible to torch")


def _nccl_loadable():
    try:
        _nccl.load()
        return True
    except squall.SquallError:
        return False


# ---- in-process: feature detection, NCCL bindings, messages -----------------------------


def test_have_gpu_agrees_with_the_library():
    # The stub (no CUDA/NCCL) answers squallUnsupported before checking its
    # arguments; the real entry point rejects the NULL ncclComm_t.
    h = ctypes.c_void_p()
    result = _lib.lib.squallCommInitFromNccl(ctypes.byref(h), None)
    assert result in (squall.SquallUnsupported.code, squall.SquallInvalidArgument.code)
    assert squall.HAVE_GPU == (result == squall.SquallInvalidArgument.code)
    assert (_lib.gpu_unsupported() is None) == squall.HAVE_GPU
    if not squall.HAVE_GPU:
        with pytest.raises(squall.SquallUnsupported, match=r"no GPU path: .*built with CUDA"):
            _lib.require_gpu("the test")


@pytest.mark.skipif(NCCL_H is None, reason="no nccl.h (CUDA_HOME/include, /usr/include)")
def test_nccl_enums_match_nccl_h():
    text = open(NCCL_H).read()

    def value(name):
        return int(re.search(rf"\b{name}\s*=\s*(\d+)", text).group(1))

    assert _nccl.NCCL_UNIQUE_ID_BYTES == int(
        re.search(r"#define NCCL_UNIQUE_ID_BYTES (\d+)", text).group(1))
    names = {_lib.FLOAT32: "ncclFloat32", _lib.FLOAT16: "ncclFloat16",
             _lib.BFLOAT16: "ncclBfloat16", _lib.FLOAT64: "ncclFloat64", _lib.INT32: "ncclInt32",
             _lib.INT64: "ncclInt64"}
    assert _nccl.DTYPES == {k: value(v) for k, v in names.items()}
    ops = {_lib.SUM: "ncclSum", _lib.MAX: "ncclMax", _lib.MIN: "ncclMin", _lib.AVG: "ncclAvg"}
    assert _nccl.OPS == {k: value(v) for k, v in ops.items()}


@pytest.mark.skipif(not _nccl_loadable(), reason="libnccl.so.2 cannot be loaded here")
def test_real_nccl_binding():
    nccl = _nccl.load()
    assert nccl.version >= _nccl.MIN_VERSION
    a, b = nccl.get_unique_id(), nccl.get_unique_id()
    assert len(a) == 128 and a != b
    with pytest.raises(squall.SquallInvalidArgument, match="128 bytes, not 5"):
        nccl.init_rank(1, b"short", 0)
    if not torch.cuda.is_available():  # NCCL's own error, translated
        with pytest.raises(squall.SquallError, match=r"ncclCommInitRank failed: .*\[NCCL 2\."):
            nccl.init_rank(1, a, 0)


def test_nccl_missing(monkeypatch):
    if hasattr(_lib.lib, "ncclCommInitRank"):
        pytest.skip("libsquall links NCCL itself; no soname lookup happens")
    monkeypatch.setattr(_nccl, "SONAMES", ("libnccl-squall-test-missing.so.2",))
    monkeypatch.setattr(_nccl, "_loaded", None)
    with pytest.raises(squall.SquallUnsupported,
                       match=r"cannot load NCCL \(.*libnccl-squall-test-missing.*LD_LIBRARY_PATH"):
        _nccl.load()


@no_gpu
def test_current_device_without_cuda():
    from squall import _cuda

    with pytest.raises(squall.SquallUnsupported, match=r"the test needs a GPU through a CUDA "
                       r"build of torch; .*(built without CUDA|sees no GPU).*host transport"):
        _cuda.current_device("the test")


def test_nccl_transport_only_through_init():
    with pytest.raises(squall.SquallInvalidArgument, match=r"squall.init\(transport='nccl'\)"):
        squall.Communicator.from_unique_id(bytes(128), 1, 0, transport="nccl")


# ---- squall.init(transport="nccl") failures reach every rank -------------------------------


def _init_errors(rank, world):
    from squall import _comm, _cuda

    got = []
    if not torch.cuda.is_available():  # torch without CUDA (or without a GPU)
        with pytest.raises(squall.SquallUnsupported, match="CUDA build of torch"):
            squall.init(transport="nccl")
        got.append("torch")
    fake_device = lambda what: torch.device("cuda", 0)  # noqa: E731
    _cuda.current_device = fake_device
    if not squall.HAVE_GPU:  # libsquall without CUDA and NCCL: its own message
        with pytest.raises(squall.SquallUnsupported,
                           match=r"squall.init\(transport='nccl'\): .*has no GPU path: "
                           "squallCommInitFromNccl needs Squall built with CUDA and NCCL"):
            squall.init(transport="nccl")
        got.append("library")
    # Only rank 1 fails: rank 0 (all set) must raise too, naming rank 1, not hang.
    _lib.require_gpu = lambda what: None
    _nccl.load = lambda: FakeNccl(rank)
    _cuda.device_guard = lambda device: contextlib.nullcontext()
    if rank == 1:
        def broken(what):
            raise squall.SquallUnsupported("no GPU on this rank (test)")
        _cuda.current_device = broken
        with pytest.raises(squall.SquallUnsupported, match=r"^no GPU on this rank \(test\)$"):
            squall.init(transport="nccl")
    else:
        with pytest.raises(squall.SquallUnsupported,
                           match=r"rank 1 of the group failed: SquallUnsupported: no GPU on "
                           r"this rank \(test\)"):
            squall.init(transport="nccl")
    got.append("one rank")
    with pytest.raises(squall.SquallInvalidArgument, match="timeout applies to the host"):
        squall.init(transport="nccl", timeout=5)
    assert _comm._default is None
    return got


def test_nccl_init_errors_reach_every_rank():
    res = _dist.run(_init_errors, world=2)
    assert res[0] == res[1] and res[0][-1] == "one rank", res


# ---- the fake GPU world -------------------------------------------------------------------

FAKE = torch.device("cuda", 0)
STREAM = 0x5EED
# nccl.h values, spelled out independently of squall._nccl
NCCL_DTYPE = {7: _lib.FLOAT32, 6: _lib.FLOAT16, 9: _lib.BFLOAT16, 8: _lib.FLOAT64,
              2: _lib.INT32, 4: _lib.INT64}
NCCL_OP = {0: _lib.SUM, 2: _lib.MAX, 3: _lib.MIN, 4: _lib.AVG}


def cuda(t):
    """Tags a (host) tensor as a CUDA tensor of cuda:0 for the fake world."""
    t._fake_cuda = True
    return t


class FakeNccl(_nccl.Nccl):
    """NCCL whose communicators are Squall TCP communicators (the squall
    unique id travels as the NCCL id). Records every call in `log`."""

    def __init__(self, rank):
        self.where, self.version, self.log, self.hosts = "fake NCCL", 22809, [], {}
        self.rank = rank
        self._f = {"ncclGetErrorString": lambda r: b"fake failure",
                   "ncclGetUniqueId": self._unique_id, "ncclCommInitRank": self._init,
                   "ncclCommDestroy": self._destroy, "ncclAllReduce": self._allreduce,
                   "ncclCommAbort": self._abort}

    def _unique_id(self, out):
        ctypes.memmove(ctypes.addressof(out._obj), squall.get_unique_id(), 128)
        return 0

    def _init(self, out, nranks, uid, rank):
        assert rank == self.rank
        sid = _lib.UniqueId()
        ctypes.memmove(ctypes.addressof(sid), ctypes.addressof(uid), 128)
        h = ctypes.c_void_p()
        cfg = _lib.Config(_lib.TRANSPORT_TCP, 30)
        _lib.check(_lib.lib.squallCommInitRank(ctypes.byref(h), nranks, sid, rank,
                                               ctypes.byref(cfg)))
        key = 0x1000 + len(self.hosts)
        self.hosts[key] = h
        out._obj.value = key
        return 0

    def _destroy(self, comm):
        self.log.append(("ncclCommDestroy", comm.value))
        return 0

    def _abort(self, comm):
        self.log.append(("ncclCommAbort", comm.value))
        return 0

    def _allreduce(self, send, recv, count, dtype, op, comm, stream):
        self.log.append(("ncclAllReduce", send, recv, count, dtype, op, stream))
        return _lib.lib.squallAllReduce(send, recv, count, NCCL_DTYPE[dtype], NCCL_OP[op],
                                        self.hosts[comm.value])


def _fake_gpu_world(rank, nccl):
    """Installs the fakes; returns the list that records the OnStream calls."""
    from squall import _cuda

    calls = []
    _cuda.device_of = lambda t: FAKE if getattr(t, "_fake_cuda", False) else t.device
    _cuda.current_device = lambda what: FAKE

    def current_stream(device):
        assert device == FAKE, device
        return STREAM

    _cuda.current_stream = current_stream
    _cuda.device_guard = lambda device: contextlib.nullcontext()
    _cuda.zeros = lambda n, dtype, device: (
        cuda(torch.zeros(n, dtype=dtype)) if device == FAKE else torch.zeros(n, dtype=dtype))
    _cuda.synchronize = lambda device: calls.append(("synchronize", device))
    _lib.require_gpu = lambda what: None
    _nccl.load = lambda: nccl
    lib = _lib.lib
    real = {n: getattr(lib, n) for n in ("squallCommInitFromNccl", "squallCommDestroy",
                                         "squallCompressedAllReduce", "squallOptimizerStep",
                                         "squallCompressedReduceScatter",
                                         "squallCompressedAllGather")}

    def init_from_nccl(out, comm):
        out._obj.value = nccl.hosts[comm.value].value
        calls.append(("squallCommInitFromNccl", comm.value))
        return 0

    def destroy(comm):
        calls.append(("squallCommDestroy", comm.value))
        nccl.log.append(("squallCommDestroy", comm.value))  # ordered with ncclCommDestroy
        return real["squallCommDestroy"](comm)

    def compressed(send, recv, dtype, op, compressor, comm, stream):
        calls.append(("compressed", send, recv, stream))
        return real["squallCompressedAllReduce"](send, recv, dtype, op, compressor, comm)

    def reduce_scatter(send, recv, recvcount, dtype, op, compressor, comm, stream):
        calls.append(("reduce_scatter", send, recv, recvcount, stream))
        return real["squallCompressedReduceScatter"](send, recv, recvcount, dtype, op, compressor,
                                                     comm)

    def all_gather(send, recv, count, dtype, compressor, comm, stream):
        calls.append(("all_gather", send, recv, count, stream))
        return real["squallCompressedAllGather"](send, recv, count, dtype, compressor, comm)

    def optimizer(opt, params, grads, lr, stream):
        calls.append(("optimizer", params, grads, stream))
        return real["squallOptimizerStep"](opt, params, grads, lr)

    lib.squallCommInitFromNccl = init_from_nccl
    lib.squallCommDestroy = destroy
    lib.squallCompressedAllReduceOnStream = compressed
    lib.squallCompressedReduceScatterOnStream = reduce_scatter
    lib.squallCompressedAllGatherOnStream = all_gather
    lib.squallOptimizerStepOnStream = optimizer
    return calls


def _collectives(rank, world):
    nccl = FakeNccl(rank)
    calls = _fake_gpu_world(rank, nccl)
    host = squall.init(set_as_default=False)
    gpu = squall.init(transport="nccl")
    assert squall.get_default() is gpu and gpu.device == FAKE
    assert (gpu.rank, gpu.size) == (rank, world) and "nccl on cuda:0" in repr(gpu)
    assert calls == [("squallCommInitFromNccl", 0x1000)]

    # full precision: ncclAllReduce in place, NCCL's codes, the current stream
    a = (torch.arange(6) % 4).double()  # rank r holds a + 2r
    cases = [(torch.float32, "sum", 7, 0, 2 * a + 2), (torch.float64, "mean", 8, 4, a + 1),
             (torch.float16, "avg", 6, 4, a + 1), (torch.bfloat16, "sum", 9, 0, 2 * a + 2),
             (torch.int32, "min", 2, 3, a), (torch.int64, "max", 4, 2, a + 2)]
    for dtype, op, nccl_dtype, nccl_op, expect in cases:
        x = cuda((a + 2 * rank).to(dtype))
        assert squall.allreduce(x, op=op) is x
        assert torch.equal(x.double(), expect), (dtype, op, x)
        assert nccl.log[-1] == ("ncclAllReduce", x.data_ptr(), x.data_ptr(), 6, nccl_dtype,
                                nccl_op, STREAM)
    x = cuda(torch.ones(3))
    req = gpu.allreduce(x, "sum", async_op=True)
    assert req.test() and req.wait() is x and (x == world).all()
    n_log = len(nccl.log)
    gpu.allreduce(cuda(torch.zeros(0)))  # nothing to reduce: no NCCL call
    assert len(nccl.log) == n_log

    # only CUDA tensors of its GPU; no host collectives
    import numpy as np
    for bad in (torch.ones(3), np.ones(3, np.float32)):
        with pytest.raises(squall.SquallInvalidUsage,
                           match="reduces CUDA tensors of cuda:0 only.*host communicator"):
            squall.allreduce(bad)
    for what, fn in (("broadcast", lambda: gpu.broadcast(cuda(torch.ones(2)))),
                     ("allgather", lambda: gpu.allgather(cuda(torch.ones(2)),
                                                         cuda(torch.ones(4)))),
                     ("barrier", gpu.barrier), ("split", lambda: gpu.split(0))):
        with pytest.raises(squall.SquallInvalidUsage, match=f"{what} on a communicator from"):
            fn()
    with pytest.raises(squall.SquallInvalidUsage, match="from NCCL on cuda:0"):
        squall.Compressor(gpu, 4).allreduce(torch.ones(4))

    # compressed: the tensor's own memory goes to the OnStream entry point (no
    # staging) and the bits equal a host communicator's
    cg, ch = squall.Compressor(gpu, 5000, "onebit"), squall.Compressor(host, 5000, "onebit")
    for t in range(3):
        x = torch.randn(5000, generator=torch.Generator().manual_seed(10 * t + rank))
        xg, xh = cuda(x.clone()), x.clone()
        del calls[:]
        squall.allreduce(xg, compressor=cg)
        ch.allreduce(xh)
        assert torch.equal(xg, xh), t
        assert calls == [("compressed", xg.data_ptr(), xg.data_ptr(), STREAM)]
    assert cg.stats["calls"] == 3
    out = cuda(torch.empty(5000))
    src = cuda(torch.ones(5000) * (rank + 1))  # constant blocks: exact in onebit
    req = squall.Compressor(gpu, 5000).allreduce(src, op="sum", out=out, async_op=True)
    assert req.test() and req.wait() is out and (out == 3).all()
    assert calls[-1] == ("compressed", src.data_ptr(), out.data_ptr(), STREAM)
    n_calls = len(calls)
    ch.allreduce(torch.ones(5000))  # a host communicator never takes the OnStream path
    host.allreduce(torch.ones(5000))
    assert len(calls) == n_calls

    # the compressed reduce-scatter: the tensors' own memory to its OnStream
    # entry point, the bits of a host communicator's, CUDA tensors only
    n = 1001
    rg = squall.Compressor(gpu, world * n, "int4:block=256", kind="reduce_scatter")
    rh = squall.Compressor(host, world * n, "int4:block=256", kind="reduce_scatter")
    for t in range(3):
        x = torch.randn(world * n, generator=torch.Generator().manual_seed(20 * t + rank))
        xg, og, oh = cuda(x.clone()), cuda(torch.empty(n)), torch.empty(n)
        del calls[:]
        assert rg.reduce_scatter(xg, og, op="avg" if t != 1 else "sum") is og
        rh.reduce_scatter(x, oh, op="avg" if t != 1 else "sum")
        assert torch.equal(og, oh), t
        assert calls == [("reduce_scatter", xg.data_ptr(), og.data_ptr(), n, STREAM)]
    assert rg.stats["calls"] == 3 and rg.traffic.bytes_sent > 0
    req = rg.reduce_scatter(xg, og, async_op=True)
    assert req.test() and req.wait() is og
    with pytest.raises(squall.SquallInvalidUsage, match="from NCCL on cuda:0"):
        rg.reduce_scatter(torch.ones(world * n), og)
    with pytest.raises(squall.SquallInvalidArgument, match="an output of 1001"):
        rg.reduce_scatter(xg, cuda(torch.empty(n + 1)))

    # the quantized all-gather: OnStream with the tensors' memory, the host's bits
    ag, ah = (squall.Compressor(c, n, "int8:block=256", kind="all_gather") for c in (gpu, host))
    x = torch.randn(n, generator=torch.Generator().manual_seed(rank))
    og, oh = cuda(torch.empty(world * n)), torch.empty(world * n)
    del calls[:]
    assert ag.all_gather(cuda(x.clone()), og) is og
    ah.all_gather(x, oh)
    assert torch.equal(og, oh) and calls[0][0] == "all_gather" and calls[0][3:] == (n, STREAM)

    # squall.fsdp: CUDA gradients reduce-scatter on the device path (an NCCL
    # communicator of its own, the OnStream entry point), with the bits of the
    # host path; its checkpoint comes from the device residual
    from squall import fsdp
    avg = torch.distributed.ReduceOp.AVG
    on_gpu, on_host = fsdp._Comms(None, "nccl"), fsdp._Comms(None, "host")
    assert fsdp._Comms(None).on_device(cuda(torch.ones(1))) == (
        _lib.HAVE_GPU and _lib.HAVE_REDUCE_SCATTER_ON_STREAM)
    assert not on_gpu.on_device(torch.ones(1)) and not on_host.on_device(cuda(torch.ones(1)))
    rs_gpu = fsdp.ReduceScatter("int4:block=256", 0, on_gpu, "m")
    rs_host = fsdp.ReduceScatter("int4:block=256", 0, on_host, "m")
    for t in range(2):
        x = torch.randn(world * n, generator=torch.Generator().manual_seed(40 * t + rank))
        og, oh = cuda(torch.empty(n)), torch.empty(n)
        del calls[:]
        rs_gpu(og, cuda(x.clone()), None, avg)
        rs_host(oh, x.clone(), None, avg)
        assert torch.equal(og, oh), t
        assert [c[0] for c in calls] == ["squallCommInitFromNccl", "reduce_scatter"][-len(calls):]
    # and its parameter all-gathers on the device path, with the host path's bits
    ag_gpu = fsdp.AllGather("int8:block=256", on_gpu, "m")
    ag_host = fsdp.AllGather("int8:block=256", on_host, "m", overlap=True)
    x = torch.randn(n, generator=torch.Generator().manual_seed(99 + rank))
    og, oh = cuda(torch.empty(world * n)), torch.empty(world * n)
    del calls[:]
    assert ag_gpu(og, cuda(x.clone()), None) is None  # enqueued on the stream
    ag_host(oh, x.clone(), None).wait()  # on the gatherer thread: FSDP waits on the Work
    assert torch.equal(og, oh) and [c[0] for c in calls] == ["all_gather"], calls
    assert ag_gpu.compressed_calls == 1 and ag_gpu.stats["bytes_sent"] > 0, ag_gpu.stats
    saved = rs_gpu.state_dict()
    assert saved["residual"] == rs_host.state_dict()["residual"]
    rs_gpu.load_state_dict(saved)
    for comm in list(on_gpu._by_group.values()) + list(on_host._by_group.values()):
        comm.close()

    # closing: GPU idle first, compressors before the communicator, the squall
    # communicator before the NCCL one it wraps
    del calls[:]
    h = gpu.handle.value
    gpu.close()
    assert calls == [("synchronize", FAKE), ("squallCommDestroy", h)]
    assert nccl.log[-2:] == [("squallCommDestroy", h), ("ncclCommDestroy", 0x1000)]
    assert cg._h is None
    # a GPU that fails while closing: everything is torn down, NCCL aborted,
    # and the error reported
    from squall import _cuda

    second = 0x1000 + len(nccl.hosts)  # the NCCL handle the fake hands out next
    gpu2 = squall.init(transport="nccl", set_as_default=False)

    def broken(device):
        raise RuntimeError("CUDA error: an illegal memory access (test)")

    _cuda.synchronize = broken
    with pytest.raises(RuntimeError, match="illegal memory access"):
        gpu2.close()
    assert gpu2.closed and nccl.log[-1] == ("ncclCommAbort", second)
    host.close()
    return True


def test_fake_gpu_collectives_dispatch_to_onstream():
    assert _dist.run(_collectives, world=2) == [True, True]


# APMSqueeze: flat buffers on the device and squallOptimizerStepOnStream with a
# communicator from NCCL, device buffers staged through the host with a host
# communicator; both must give the CPU optimizer's bits.

HYPER = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)


def _params(on_gpu):
    g = torch.Generator().manual_seed(11)
    ps = [torch.randn(300, generator=g), torch.randn(40, 60, generator=g),
          torch.randn(50, generator=g), torch.randn(9, generator=g)]
    return [cuda(p.requires_grad_()) if on_gpu else p.requires_grad_() for p in ps]


def _groups(ps):
    return [{"params": [ps[0], ps[1], ps[3]]}, {"params": [ps[2]], "lr": 3e-3}]


def _set_grads(ps, rank, step):
    for i, p in enumerate(ps[:3]):
        gen = torch.Generator().manual_seed(100000 * i + 1000 * rank + step)
        grad = torch.randn(p.shape, generator=gen) + 0.1 * p.detach()
        p.grad = cuda(grad) if getattr(p, "_fake_cuda", False) else grad
    ps[3].grad = None


def _optimizer(rank, world):
    from squall.optim import APMSqueeze, SlowMo

    nccl = FakeNccl(rank)
    calls = _fake_gpu_world(rank, nccl)
    host = squall.init(set_as_default=False)
    gpu = squall.init(transport="nccl", set_as_default=False)
    ref_ps, dev_ps, staged_ps = _params(False), _params(True), _params(True)
    ref = APMSqueeze(_groups(ref_ps), warmup=4, comm=host, **HYPER)
    n_log = len(nccl.log)
    dev = APMSqueeze(_groups(dev_ps), warmup=4, comm=gpu, **HYPER)
    # the collective shape check ran on the GPU (int64 max through ncclAllReduce),
    # then the initial broadcast (an fp32 sum per group, zeros from rank 1)
    assert [e[3:6] for e in nccl.log[n_log:]] == [(2, 4, 2)] + [
        (sum(p.numel() for p in g["params"]), 7, 0) for g in dev.param_groups]
    staged = APMSqueeze(_groups(staged_ps), warmup=4, comm=host, **HYPER)
    assert dev._devices == staged._devices == [FAKE, FAKE] and ref._devices == [None, None]
    assert all(getattr(f, "_fake_cuda", False) for o in (dev, staged) for pair in o._flat
               for f in pair), "the flat buffers of a CUDA group live on its GPU"
    assert dev._staging == [None, None] and staged._staging[0] is not None
    snapshot = None
    for s in range(12):
        del calls[:]
        for ps, opt in ((ref_ps, ref), (dev_ps, dev), (staged_ps, staged)):
            _set_grads(ps, rank, s)
            opt.step()
        assert calls == [("optimizer", f[0].data_ptr(), f[1].data_ptr(), STREAM)
                         for f in dev._flat], "only the NCCL optimizer steps on the stream"
        for a, b, c in zip(ref_ps, dev_ps, staged_ps):
            assert torch.equal(a, b) and torch.equal(a, c), s
        if s == 7:
            snapshot = ([p.detach().clone() for p in dev_ps], dev.state_dict())
    assert dev.info(0)["phase"] == "compressed" and dev.info(1)["step"] == 12
    # state_dict round trip of the device path
    again_ps = _params(True)
    with torch.no_grad():
        for p, v in zip(again_ps, snapshot[0]):
            p.copy_(v)
    again = APMSqueeze(_groups(again_ps), warmup=4, comm=gpu, **HYPER)
    again.load_state_dict(snapshot[1])
    for s in range(8, 12):
        _set_grads(again_ps, rank, s)
        again.step()
    assert all(torch.equal(a, b) for a, b in zip(again_ps, dev_ps))

    # a group on two devices, and CPU parameters on a communicator from NCCL
    with pytest.raises(squall.SquallInvalidArgument,
                       match=r"param group 0 has parameters on cpu, cuda:0; .*own param group"):
        APMSqueeze([cuda(torch.zeros(3, requires_grad=True)), torch.zeros(3, requires_grad=True)],
                   warmup=1, comm=host)
    with pytest.raises(squall.SquallInvalidUsage,
                       match=r"param group 0 is on cpu, but the communicator comes from NCCL"):
        APMSqueeze([torch.zeros(3, requires_grad=True)], warmup=1, comm=gpu)
    with pytest.raises(squall.SquallInvalidUsage, match="SlowMo .* needs a host communicator"):
        SlowMo(torch.optim.SGD([cuda(torch.zeros(3, requires_grad=True))], lr=0.1), comm=gpu)
    gpu.close()
    host.close()
    assert dev._opts == [None, None], "closing the communicator closes its optimizers"
    return True


def test_fake_gpu_apmsqueeze_device_path_equals_host():
    assert _dist.run(_optimizer, world=2, timeout=120) == [True, True]
