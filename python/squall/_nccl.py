"""NCCL through ctypes: the few calls that squall.init(transport="nccl") and
the full-precision allreduce of an NCCL-backed communicator need.

The ncclComm_t must come from the NCCL library that libsquall calls, so
:func:`load` looks for it in the order libsquall's own table does
(src/transport/nccl/nccl_table.h): the ``libnccl.so.2`` the process has
already loaded, then ``$SQUALL_NCCL_LIBRARY``, then the soname through the
loader's search. torch is imported first where it is installed: a CUDA
build of torch loads the NCCL of its nvidia-nccl wheel, and that is the copy
both must use.
"""

import ctypes
import os

from . import _lib
from ._lib import (SquallError, SquallInProgress, SquallInvalidArgument, SquallInvalidUsage,
                   SquallRemoteError, SquallSystemError, SquallUnsupported)

SONAMES = ("libnccl.so.2", "libnccl.so")
NCCL_UNIQUE_ID_BYTES = 128
MIN_VERSION = 21000  # 2.10: ncclAvg

# nccl.h: ncclDataType_t and ncclRedOp_t
DTYPES = {_lib.FLOAT32: 7, _lib.FLOAT16: 6, _lib.BFLOAT16: 9, _lib.FLOAT64: 8, _lib.INT32: 2,
          _lib.INT64: 4}
OPS = {_lib.SUM: 0, _lib.MAX: 2, _lib.MIN: 3, _lib.AVG: 4}

# ncclResult_t -> the SquallError subclass that says the same
_ERRORS = {1: SquallSystemError,  # unhandled CUDA error
           2: SquallSystemError, 3: SquallError,  # internal error (of NCCL)
           4: SquallInvalidArgument, 5: SquallInvalidUsage, 6: SquallRemoteError,
           7: SquallInProgress}


class NcclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * NCCL_UNIQUE_ID_BYTES)]


_P = ctypes.c_void_p
_PROTOS = {
    "ncclGetVersion": (ctypes.c_int, [ctypes.POINTER(ctypes.c_int)]),
    "ncclGetErrorString": (ctypes.c_char_p, [ctypes.c_int]),
    "ncclGetUniqueId": (ctypes.c_int, [ctypes.POINTER(NcclUniqueId)]),
    "ncclCommInitRank": (ctypes.c_int, [ctypes.POINTER(_P), ctypes.c_int, NcclUniqueId,
                                        ctypes.c_int]),
    "ncclCommDestroy": (ctypes.c_int, [_P]),
    "ncclCommAbort": (ctypes.c_int, [_P]),
    "ncclAllReduce": (ctypes.c_int, [_P, _P, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, _P,
                                     _P]),
}
_OPTIONAL = {"ncclGetLastError": (ctypes.c_char_p, [_P])}  # NCCL >= 2.13


def version_string(code):
    if code >= 10000:  # 2.9 and later: major * 10000 + minor * 100 + patch
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


class Nccl:
    """A loaded NCCL library (use :func:`load`)."""

    def __init__(self, handle, where):
        self.where = where
        self._f = {}
        for name, (res, args) in list(_PROTOS.items()) + list(_OPTIONAL.items()):
            try:
                f = handle[name]
            except AttributeError:
                if name in _OPTIONAL:
                    continue
                raise SquallUnsupported(f"squall: {where} has no {name}; it is not a usable "
                                        "NCCL 2 library") from None
            f.restype, f.argtypes = res, args
            self._f[name] = f
        v = ctypes.c_int()
        self._check(self._f["ncclGetVersion"](ctypes.byref(v)), "ncclGetVersion")
        self.version = v.value
        if self.version < MIN_VERSION:
            raise SquallUnsupported(
                f"squall: NCCL {version_string(self.version)} ({where}) is older than the 2.10 "
                "that squall needs (ncclAvg); use the NCCL of a recent CUDA build of torch")

    def _check(self, result, what, comm=None):
        if result == 0:
            return
        s = self._f["ncclGetErrorString"](result) if "ncclGetErrorString" in self._f else None
        msg = s.decode("utf-8", "replace") if s else f"NCCL error {result}"
        last = self._f.get("ncclGetLastError")
        detail = last(comm) if last is not None else None
        if detail:
            msg += f" ({detail.decode('utf-8', 'replace')})"
        ver = version_string(self.version) if hasattr(self, "version") else "?"
        raise _ERRORS.get(result, SquallError)(
            f"squall: {what} failed: {msg} [NCCL {ver}, {self.where}]")

    def get_unique_id(self):
        """ncclGetUniqueId: 128 bytes to hand to every rank."""
        uid = NcclUniqueId()
        self._check(self._f["ncclGetUniqueId"](ctypes.byref(uid)), "ncclGetUniqueId")
        return ctypes.string_at(ctypes.addressof(uid), NCCL_UNIQUE_ID_BYTES)

    def init_rank(self, nranks, unique_id, rank):
        """ncclCommInitRank on the current CUDA device (collective)."""
        unique_id = bytes(unique_id)
        if len(unique_id) != NCCL_UNIQUE_ID_BYTES:
            raise SquallInvalidArgument(
                f"squall: an NCCL unique id has {NCCL_UNIQUE_ID_BYTES} bytes, not "
                f"{len(unique_id)}")
        uid = NcclUniqueId()
        ctypes.memmove(ctypes.addressof(uid), unique_id, NCCL_UNIQUE_ID_BYTES)
        h = ctypes.c_void_p()
        self._check(self._f["ncclCommInitRank"](ctypes.byref(h), int(nranks), uid, int(rank)),
                    "ncclCommInitRank")
        return NcclComm(self, h)


class NcclComm:
    """An ncclComm_t that this object owns: destroy() calls ncclCommDestroy."""

    def __init__(self, nccl, handle):
        self.nccl, self.handle = nccl, handle

    def allreduce(self, ptr, count, dtype, op, stream):
        """In-place ncclAllReduce of `count` elements at device address `ptr`,
        enqueued on `stream` (dtype and op: squall's codes)."""
        if self.handle is None:
            raise SquallInvalidUsage("squall: the NCCL communicator was destroyed")
        if count == 0:
            return
        self.nccl._check(self.nccl._f["ncclAllReduce"](ptr, ptr, count, DTYPES[dtype], OPS[op],
                                                       self.handle, stream),
                         "ncclAllReduce", self.handle)

    def destroy(self, abort=False):
        """ncclCommDestroy; ncclCommAbort (which does not wait for operations in
        flight) with abort=True."""
        h, self.handle = self.handle, None
        if h is not None:
            name = "ncclCommAbort" if abort else "ncclCommDestroy"
            self.nccl._check(self.nccl._f[name](h), name)


_loaded = None


def load():
    """The NCCL library to create communicators with (loaded once)."""
    global _loaded
    if _loaded is None:
        _loaded = _open()
    return _loaded


def _open():
    _lib.optional_torch()
    errors = []
    try:
        return Nccl(ctypes.CDLL(SONAMES[0], mode=os.RTLD_NOLOAD | os.RTLD_NOW),
                    f"{SONAMES[0]}, already loaded in this process")
    except OSError:
        pass  # not loaded yet
    named = os.environ.get("SQUALL_NCCL_LIBRARY", "")
    candidates = [named] if named and named != SONAMES[0] else list(SONAMES)
    for name in candidates:
        try:
            handle = ctypes.CDLL(name)
        except OSError as e:
            errors.append(str(e))
            continue
        return Nccl(handle, name)
    raise SquallUnsupported(
        "squall: cannot load NCCL (" + "; ".join(errors) + "). CUDA builds of torch ship "
        "libnccl.so.2 (the nvidia-nccl-cu13 wheel): install one, put the folder holding "
        "libnccl.so.2 on LD_LIBRARY_PATH, or name the library in SQUALL_NCCL_LIBRARY")
