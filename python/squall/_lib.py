"""Loads libsquall and declares the C API for ctypes.

The library is looked up, in order, at:

1. ``$SQUALL_LIBRARY`` (a path to ``libsquall.so``);
2. the copy inside the package (``squall/_libs/libsquall.so``), which a wheel
   and ``pip install ./python`` carry (python/setup.py bundles it);
3. the build tree of a checkout, relative to this package
   (``<repo>/build/src/core/libsquall.so``, also ``libsquall.so.0``);
4. the library directory meson installed next to it (``_config.LIBDIR``);
5. the system loader (``libsquall.so.0``, then ``libsquall.so``).

Every C call goes through :func:`check`, which turns a non-zero result into
the matching :class:`SquallError` subclass carrying ``squallGetLastError()``.
"""

import ctypes
import os

# ---- errors -----------------------------------------------------------------


class SquallError(RuntimeError):
    """A Squall call failed. ``code`` is the squallResult_t value (or None for
    errors detected in Python before any C call)."""

    code = None
    name = "error"

    def __init__(self, message, code=None):
        super().__init__(message)
        if code is not None:
            self.code = code


class SquallInvalidArgument(SquallError, ValueError):
    code, name = 1, "invalid argument"


class SquallInvalidUsage(SquallError, ValueError):
    code, name = 2, "invalid usage"


class SquallUnsupported(SquallError, NotImplementedError):
    code, name = 3, "unsupported"


class SquallOutOfMemory(SquallError, MemoryError):
    code, name = 4, "out of memory"


class SquallCorruptData(SquallError, ValueError):
    code, name = 5, "corrupt data"


class SquallSystemError(SquallError, OSError):
    code, name = 6, "system error"


class SquallRemoteError(SquallError):
    code, name = 7, "remote error"


class SquallTimeout(SquallError, TimeoutError):
    code, name = 8, "timeout"


class SquallInternalError(SquallError):
    code, name = 9, "internal error"


class SquallInProgress(SquallError):
    code, name = 10, "in progress"


_ERRORS = {
    cls.code: cls
    for cls in (SquallInvalidArgument, SquallInvalidUsage, SquallUnsupported, SquallOutOfMemory,
                SquallCorruptData, SquallSystemError, SquallRemoteError, SquallTimeout,
                SquallInternalError, SquallInProgress)
}

# ---- C types ----------------------------------------------------------------

SQUALL_UNIQUE_ID_BYTES = 128
SQUALL_DEFAULT_BLOCK_SIZE = 2048

# squallDataType_t
FLOAT32, FLOAT16, BFLOAT16, FLOAT64, INT32, INT64 = range(6)
# squallRedOp_t
SUM, AVG, MIN, MAX = range(4)
# squallTransport_t
TRANSPORT_DEFAULT, TRANSPORT_UCX, TRANSPORT_TCP, TRANSPORT_MPI = range(4)
# squallCodec_t
CODEC_NONE, CODEC_ONEBIT, CODEC_FP16, CODEC_BF16, CODEC_INT8, CODEC_INT2, CODEC_INT4 = range(7)
# squallScale_t
SCALE_MEAN_ABS, SCALE_RMS = range(2)
# squallOptimMode_t
MODE_APMSQUEEZE, MODE_SYNC, MODE_LOCAL = range(3)
# squallOptimPhase_t
PHASE_WARMUP, PHASE_COMPRESSED = range(2)

c_result = ctypes.c_int
c_enum = ctypes.c_int


class CodecSpec(ctypes.Structure):
    _fields_ = [("codec", c_enum), ("scale", c_enum), ("blockSize", ctypes.c_uint32)]


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * SQUALL_UNIQUE_ID_BYTES)]


class Config(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("transport", c_enum), ("timeoutSeconds", ctypes.c_int)]

    def __init__(self, transport=TRANSPORT_DEFAULT, timeout=0):
        super().__init__(ctypes.sizeof(Config), transport, timeout)


class CommStats(ctypes.Structure):
    _fields_ = [("operations", ctypes.c_uint64), ("bytesSent", ctypes.c_uint64),
                ("bytesReceived", ctypes.c_uint64)]


class CompressorStats(ctypes.Structure):
    _fields_ = [("calls", ctypes.c_uint64), ("skippedCalls", ctypes.c_uint64),
                ("bytesSent", ctypes.c_uint64), ("bytesReceived", ctypes.c_uint64)]


# SQUALL_OPTIM_FREEZE_THRESHOLD / _WINDOW of include/squall/optim.h.
FREEZE_THRESHOLD = 0.2
FREEZE_WINDOW = 8
# squallOptimAlgo_t
OPTIM_ALGOS = {"bytes": 0, "twophase": 1, "allgather": 2, "time": 3}
# the warmup's codec (squallCodec_t) and SQUALL_OPTIM_WARMUP_CODEC
WARMUP_CODECS = {"none": 0, "fp16": 2, "bf16": 3}
WARMUP_CODEC = "bf16"
OPTIM_BLOCK_SIZE = 64  # SQUALL_OPTIM_BLOCK_SIZE


class OptimConfig(ctypes.Structure):
    """squallOptimConfig_t; a fresh instance holds SQUALL_OPTIM_CONFIG_INIT."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("mode", c_enum),
        ("lr", ctypes.c_float),
        ("beta1", ctypes.c_float),
        ("beta2", ctypes.c_float),
        ("eps", ctypes.c_float),
        ("weightDecay", ctypes.c_float),
        ("warmupSteps", ctypes.c_int64),
        ("warmupFraction", ctypes.c_double),
        ("totalSteps", ctypes.c_int64),
        ("codec", CodecSpec),
        ("slowmoTau", ctypes.c_int),
        ("slowmoAlpha", ctypes.c_float),
        ("slowmoBeta", ctypes.c_float),
        ("slowmoCompressed", ctypes.c_int),
        ("guard", ctypes.c_int),
        ("maxUpdate", ctypes.c_float),
        ("freezeThreshold", ctypes.c_double),
        ("freezeWindow", ctypes.c_int64),
        ("compressedAlgo", ctypes.c_int),
        ("warmupCodec", ctypes.c_int),
    ]

    def __init__(self):
        super().__init__(ctypes.sizeof(OptimConfig), MODE_APMSQUEEZE, 1e-3, 0.9, 0.999, 1e-8, 0.0,
                         -1, 0.15, 0, CodecSpec(CODEC_ONEBIT, SCALE_RMS,
                                                OPTIM_BLOCK_SIZE), 0, 1.0, 0.5, 0,
                         1, 0.0, FREEZE_THRESHOLD, FREEZE_WINDOW, OPTIM_ALGOS["bytes"],
                         WARMUP_CODECS[WARMUP_CODEC])


class OptimInfo(ctypes.Structure):
    _fields_ = [("step", ctypes.c_int64), ("phase", c_enum), ("warmupSteps", ctypes.c_int64),
                ("bytesSent", ctypes.c_uint64), ("skippedSteps", ctypes.c_uint64)]


P = ctypes.c_void_p
SZ = ctypes.c_size_t
PSZ = ctypes.POINTER(ctypes.c_size_t)
PF = ctypes.c_void_p  # float* passed as raw addresses
PI = ctypes.POINTER(ctypes.c_int)

# name: (restype, argtypes)
_CORE = {
    "squallGetVersion": (c_result, [PI]),
    "squallGetErrorString": (ctypes.c_char_p, [c_result]),
    "squallGetLastError": (ctypes.c_char_p, []),
    "squallCodecSpecParse": (c_result, [ctypes.c_char_p, ctypes.POINTER(CodecSpec)]),
    "squallResidualCreate": (c_result, [SZ, ctypes.POINTER(P)]),
    "squallResidualDestroy": (c_result, [P]),
    "squallResidualGetCount": (c_result, [P, PSZ]),
    "squallResidualReset": (c_result, [P]),
    "squallResidualRead": (c_result, [P, PF, SZ]),
    "squallResidualWrite": (c_result, [P, PF, SZ]),
    "squallResidualGetSkipped": (c_result, [P, ctypes.POINTER(ctypes.c_uint64)]),
    "squallEncodedSize": (c_result, [ctypes.POINTER(CodecSpec), SZ, PSZ]),
    "squallEncode": (c_result, [ctypes.POINTER(CodecSpec), P, c_enum, SZ, P, P, SZ, PSZ]),
    "squallDecode": (c_result, [P, SZ, PF, SZ]),
    "squallDecodeAccumulate": (c_result, [P, SZ, PF, SZ]),
    "squallEncodedInspect": (c_result, [P, SZ, ctypes.POINTER(CodecSpec), PSZ]),
    "squallCodecImplementation": (ctypes.c_char_p, []),
    "squallGetUniqueId": (c_result, [ctypes.POINTER(UniqueId)]),
    "squallCommInitRank": (c_result, [ctypes.POINTER(P), ctypes.c_int, UniqueId, ctypes.c_int,
                                      ctypes.POINTER(Config)]),
    "squallCommInitFromEnv": (c_result, [ctypes.POINTER(P), ctypes.POINTER(Config)]),
    "squallCommInitFromMpi": (c_result, [ctypes.POINTER(P), P, ctypes.POINTER(Config)]),
    "squallCommSplit": (c_result, [P, ctypes.c_int, ctypes.c_int, ctypes.POINTER(P)]),
    "squallCommDestroy": (c_result, [P]),
    "squallCommRank": (c_result, [P, PI]),
    "squallCommSize": (c_result, [P, PI]),
    "squallCommTransport": (c_result, [P, ctypes.POINTER(ctypes.c_char_p)]),
    "squallAllReduce": (c_result, [P, P, SZ, c_enum, c_enum, P]),
    "squallAllGather": (c_result, [P, P, SZ, c_enum, P]),
    "squallAllToAll": (c_result, [P, P, SZ, c_enum, P]),
    "squallBroadcast": (c_result, [P, SZ, c_enum, ctypes.c_int, P]),
    "squallBarrier": (c_result, [P]),
    "squallCompressorCreate": (c_result, [P, SZ, ctypes.POINTER(CodecSpec), ctypes.POINTER(P)]),
    "squallCompressorCreateAt": (c_result, [P, SZ, SZ, ctypes.POINTER(CodecSpec),
                                             ctypes.POINTER(P)]),
    "squallCompressorDestroy": (c_result, [P]),
    "squallCompressorReset": (c_result, [P]),
    "squallCompressorGetStats": (c_result, [P, ctypes.POINTER(CompressorStats)]),
    "squallCompressedAllReduce": (c_result, [P, P, c_enum, c_enum, P, P]),
    "squallAllReduceAsync": (c_result, [P, P, SZ, c_enum, c_enum, P, ctypes.POINTER(P)]),
    "squallCompressedAllReduceAsync": (c_result, [P, P, c_enum, c_enum, P, P, ctypes.POINTER(P)]),
    "squallTest": (c_result, [P, PI]),
    "squallWait": (c_result, [P]),
}

# include/squall/optim.h: bound only when the loaded library has them.
_OPTIM = {
    "squallOptimizerCreate": (c_result, [P, SZ, ctypes.POINTER(OptimConfig), ctypes.POINTER(P)]),
    "squallOptimizerDestroy": (c_result, [P]),
    "squallOptimizerStep": (c_result, [P, PF, PF, ctypes.c_float]),
    "squallOptimizerGetInfo": (c_result, [P, ctypes.POINTER(OptimInfo)]),
    "squallOptimizerStateSize": (c_result, [P, PSZ]),
    "squallOptimizerSaveState": (c_result, [P, P, SZ, PSZ]),
    "squallOptimizerLoadState": (c_result, [P, P, SZ]),
}

# The GPU entry points (squall.h "GPU (CUDA) buffers", optim.h "Device
# buffers"): bound when the library has them. A build without CUDA and NCCL
# has them too; they return squallUnsupported.
_GPU = {
    "squallCommInitFromNccl": (c_result, [ctypes.POINTER(P), P]),
    "squallCompressedAllReduceOnStream": (c_result, [P, P, c_enum, c_enum, P, P, P]),
    "squallOptimizerStepOnStream": (c_result, [P, PF, PF, ctypes.c_float, P]),
}


def _candidates():
    env = os.environ.get("SQUALL_LIBRARY")
    if env:
        return [env], True
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [os.path.join(here, "_libs", "libsquall.so")]
    for up in (os.path.join(here, "..", ".."), os.path.join(here, "..")):
        for name in ("libsquall.so", "libsquall.so.0"):
            paths.append(os.path.normpath(os.path.join(up, "build", "src", "core", name)))
    try:  # written by meson when it installs the package (-Dpython=true)
        from ._config import LIBDIR
        paths.append(os.path.join(LIBDIR, "libsquall.so.0"))
    except ImportError:
        pass
    return [p for p in paths if os.path.exists(p)] + ["libsquall.so.0", "libsquall.so"], False


def _load():
    paths, explicit = _candidates()
    errors = []
    for path in paths:
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            errors.append(f"{path}: {e}")
            if explicit:
                break
    raise ImportError("squall: cannot load libsquall (" + "; ".join(errors) + "). Build it "
                      "(meson setup build && ninja -C build), install it, or set SQUALL_LIBRARY "
                      "to the path of libsquall.so.")


lib, path = _load()

for _name, (_res, _args) in _CORE.items():
    _f = getattr(lib, _name)
    _f.restype, _f.argtypes = _res, _args

# Newer than some libraries this binding may meet: bound when present.
HAVE_COMM_STATS = hasattr(lib, "squallCommGetStats")
if HAVE_COMM_STATS:
    lib.squallCommGetStats.restype = c_result
    lib.squallCommGetStats.argtypes = [P, ctypes.POINTER(CommStats)]

# The compressed reduce-scatter (squall.h).
_REDUCE_SCATTER = {
    "squallCompressorCreateReduceScatter": (c_result, [P, SZ, ctypes.POINTER(CodecSpec),
                                                       ctypes.POINTER(P)]),
    "squallCompressedReduceScatter": (c_result, [P, P, SZ, c_enum, c_enum, P, P]),
    "squallCompressedReduceScatterAsync": (c_result, [P, P, SZ, c_enum, c_enum, P, P,
                                                      ctypes.POINTER(P)]),
}
HAVE_REDUCE_SCATTER = all(hasattr(lib, n) for n in _REDUCE_SCATTER)
if HAVE_REDUCE_SCATTER:
    for _name, (_res, _args) in _REDUCE_SCATTER.items():
        _f = getattr(lib, _name)
        _f.restype, _f.argtypes = _res, _args
# The quantized all-gather (squall.h), host and device forms.
_ALL_GATHER = {
    "squallCompressorCreateAllGather": (c_result, [P, SZ, ctypes.POINTER(CodecSpec),
                                                   ctypes.POINTER(P)]),
    "squallCompressedAllGather": (c_result, [P, P, SZ, c_enum, P, P]),
    "squallCompressedAllGatherOnStream": (c_result, [P, P, SZ, c_enum, P, P, P]),
}
HAVE_ALL_GATHER = all(hasattr(lib, n) for n in _ALL_GATHER)
if HAVE_ALL_GATHER:
    for _name, (_res, _args) in _ALL_GATHER.items():
        _f = getattr(lib, _name)
        _f.restype, _f.argtypes = _res, _args
# Its device form (communicators from NCCL), newer still.
HAVE_REDUCE_SCATTER_ON_STREAM = hasattr(lib, "squallCompressedReduceScatterOnStream")
if HAVE_REDUCE_SCATTER_ON_STREAM:
    lib.squallCompressedReduceScatterOnStream.restype = c_result
    lib.squallCompressedReduceScatterOnStream.argtypes = [P, P, SZ, c_enum, c_enum, P, P, P]

# Saving and loading a compressor's residuals (squall.h).
_COMPRESSOR_STATE = {
    "squallCompressorStateSize": (c_result, [P, PSZ]),
    "squallCompressorSaveState": (c_result, [P, P, SZ, PSZ]),
    "squallCompressorLoadState": (c_result, [P, P, SZ]),
}
HAVE_COMPRESSOR_STATE = all(hasattr(lib, n) for n in _COMPRESSOR_STATE)
if HAVE_COMPRESSOR_STATE:
    for _name, (_res, _args) in _COMPRESSOR_STATE.items():
        _f = getattr(lib, _name)
        _f.restype, _f.argtypes = _res, _args

# A compressor's algorithm choice (squall.h).
COMPRESSOR_ALGOS = {"bytes": 0, "twophase": 1, "allgather": 2, "time": 3}
HAVE_COMPRESSOR_ALGO = hasattr(lib, "squallCompressorSetAlgorithm")
if HAVE_COMPRESSOR_ALGO:
    lib.squallCompressorSetAlgorithm.restype = c_result
    lib.squallCompressorSetAlgorithm.argtypes = [P, c_enum]
# The two-phase allreduce's second-round code (squallCompressorSetGatherCodec).
HAVE_GATHER_CODEC = hasattr(lib, "squallCompressorSetGatherCodec")
if HAVE_GATHER_CODEC:
    lib.squallCompressorSetGatherCodec.restype = c_result
    lib.squallCompressorSetGatherCodec.argtypes = [P, P]

HAVE_OPTIM = hasattr(lib, "squallOptimizerCreate")
if HAVE_OPTIM:
    for _name, (_res, _args) in _OPTIM.items():
        _f = getattr(lib, _name)
        _f.restype, _f.argtypes = _res, _args

for _name, (_res, _args) in _GPU.items():
    if hasattr(lib, _name):
        _f = getattr(lib, _name)
        _f.restype, _f.argtypes = _res, _args
_HAVE_GPU_SYMBOLS = all(hasattr(lib, n) for n in _GPU
                        if HAVE_OPTIM or n != "squallOptimizerStepOnStream")

# squallCapability_t
CAPABILITY_DEVICE, CAPABILITY_UCX = 1, 2


def capabilities():
    """What the loaded library was built with (squallGetCapabilities), as a
    bitwise OR of the CAPABILITY_* values."""
    if not hasattr(lib, "squallGetCapabilities"):
        # Libraries before the query linked NCCL exactly when they had the GPU
        # path, so NCCL's symbols resolved through their handle.
        return CAPABILITY_DEVICE if hasattr(lib, "ncclCommInitRank") else 0
    query = lib.squallGetCapabilities
    query.restype, query.argtypes = c_result, [ctypes.POINTER(ctypes.c_uint)]
    caps = ctypes.c_uint()
    return caps.value if query(ctypes.byref(caps)) == 0 else 0


HAVE_GPU = _HAVE_GPU_SYMBOLS and bool(capabilities() & CAPABILITY_DEVICE)


def optional_torch():
    """torch, or None where it is not installed.

    Any other failure to import it is raised, not swallowed: a torch whose
    import failed half way stays half-initialised, and every later
    ``import torch`` in the process then fails with a message that hides the
    first one's cause."""
    try:
        import torch
    except ModuleNotFoundError as e:
        if e.name != "torch":
            raise
        return None
    return torch


def last_error():
    msg = lib.squallGetLastError()
    return msg.decode("utf-8", "replace") if msg else ""


def error_for(result, context=None):
    cls = _ERRORS.get(result, SquallError)
    msg = last_error()
    if not msg:
        s = lib.squallGetErrorString(result)
        msg = s.decode() if s else f"squall error {result}"
    if context:
        msg = f"{context}: {msg}"
    return cls(msg, code=result)


def check(result, context=None):
    """Raises the SquallError subclass of a non-zero squallResult_t."""
    if result != 0:
        raise error_for(result, context)


def require_optim():
    if not HAVE_OPTIM:
        raise SquallUnsupported(
            f"the loaded libsquall ({path}) has no optimizer API (squallOptimizerCreate, "
            "include/squall/optim.h); build a newer Squall")


def gpu_unsupported():
    """None when the loaded libsquall has its GPU path, else why not."""
    if HAVE_GPU:
        return None
    if not _HAVE_GPU_SYMBOLS:
        return (f"the loaded libsquall ({path}) predates the GPU entry points "
                "(squallCommInitFromNccl, squallOptimizerStepOnStream); build a newer Squall")
    # Ask the library (it logs its answer as a warning): a build without CUDA
    # or NCCL says what is missing; the real entry point rejects the NULL
    # ncclComm_t instead, which means the path is there after all.
    h = ctypes.c_void_p()
    result = lib.squallCommInitFromNccl(ctypes.byref(h), None)
    if result != SquallUnsupported.code:
        return None
    return f"the loaded libsquall ({path}) has no GPU path: {last_error()}"


def require_gpu(what):
    """Raises SquallUnsupported, saying why, when libsquall has no GPU path."""
    reason = gpu_unsupported()
    if reason is not None:
        raise SquallUnsupported(f"{what}: {reason}")


def version_code():
    """The library's squallGetVersion(): major * 10000 + minor * 100 + patch."""
    v = ctypes.c_int()
    check(lib.squallGetVersion(ctypes.byref(v)))
    return v.value


def version():
    """The loaded library's version as "major.minor.patch", the format of
    squall.__version__ (the binding's own)."""
    v = version_code()
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}"
