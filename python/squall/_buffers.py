"""Turning torch tensors and numpy arrays into pointers for the C API.

Only dense, contiguous buffers are accepted: collectives run in place, so a
copy would silently not write back. host_buffer() gives host pointers: CUDA
tensors are staged through host memory (copied to the host, reduced there,
copied back), which is what host communicators do. device_buffer() gives the
device pointer of a CUDA tensor itself, for communicators from NCCL.
"""

import ctypes

from . import _cuda, _lib
from ._lib import SquallInvalidArgument, SquallInvalidUsage

torch = _lib.optional_torch()  # optional: numpy arrays work without it

try:
    import numpy as np
except ImportError:  # pragma: no cover
    np = None

if torch is not None:
    _TORCH_DTYPES = {
        torch.float32: _lib.FLOAT32,
        torch.float16: _lib.FLOAT16,
        torch.bfloat16: _lib.BFLOAT16,
        torch.float64: _lib.FLOAT64,
        torch.int32: _lib.INT32,
        torch.int64: _lib.INT64,
    }
else:  # pragma: no cover
    _TORCH_DTYPES = {}

if np is not None:
    _NUMPY_DTYPES = {
        np.dtype(np.float32): _lib.FLOAT32,
        np.dtype(np.float16): _lib.FLOAT16,
        np.dtype(np.float64): _lib.FLOAT64,
        np.dtype(np.int32): _lib.INT32,
        np.dtype(np.int64): _lib.INT64,
    }
else:  # pragma: no cover
    _NUMPY_DTYPES = {}

DTYPE_NAMES = {_lib.FLOAT32: "float32", _lib.FLOAT16: "float16", _lib.BFLOAT16: "bfloat16",
               _lib.FLOAT64: "float64", _lib.INT32: "int32", _lib.INT64: "int64"}
FLOATS = (_lib.FLOAT32, _lib.FLOAT16, _lib.BFLOAT16)
ALL = tuple(DTYPE_NAMES)


def is_tensor(x):
    return torch is not None and isinstance(x, torch.Tensor)


class HostBuffer:
    """A host view of a tensor or array: ``ptr``, ``numel``, ``dtype`` (a
    squallDataType_t). ``finish()`` copies a staged CUDA buffer back."""

    __slots__ = ("ptr", "numel", "dtype", "_keep", "_target", "_staged")

    def __init__(self, ptr, numel, dtype, keep, target=None, staged=None):
        self.ptr, self.numel, self.dtype = ptr, numel, dtype
        self._keep, self._target, self._staged = keep, target, staged

    def finish(self):
        if self._target is not None:
            self._target.copy_(self._staged)
            self._target = None


def _tensor_dtype(x, name, dtypes):
    """Checks that a tensor is dense, contiguous and of one of `dtypes`;
    returns its squallDataType_t."""
    if x.layout != torch.strided:
        raise SquallInvalidArgument(
            f"squall: {name} is a sparse tensor ({x.layout}); only dense tensors are "
            "supported (call .to_dense() first)")
    if x.dtype not in _TORCH_DTYPES or _TORCH_DTYPES[x.dtype] not in dtypes:
        allowed = ", ".join(DTYPE_NAMES[d] for d in dtypes)
        raise SquallInvalidArgument(
            f"squall: {name} has dtype {x.dtype}; this operation takes {allowed}")
    if not x.is_contiguous():
        raise SquallInvalidArgument(
            f"squall: {name} is not contiguous (shape {tuple(x.shape)}, stride "
            f"{tuple(x.stride())}); squall works in place on contiguous memory: pass "
            "t.contiguous() and copy the result back")
    return _TORCH_DTYPES[x.dtype]


def host_buffer(x, name="tensor", dtypes=ALL, writable=True, stage_in=True):
    """Validates `x` and returns a HostBuffer over its memory.

    `stage_in=False` skips copying a CUDA tensor's values to the host (for an
    output buffer that is fully overwritten)."""
    if is_tensor(x):
        code = _tensor_dtype(x, name, dtypes)
        x = x.detach()
        if x.device.type == "cpu":
            return HostBuffer(x.data_ptr(), x.numel(), code, x)
        if x.device.type == "cuda":
            if stage_in:
                staged = x.to("cpu")
            else:
                staged = torch.empty(x.shape, dtype=x.dtype)
            return HostBuffer(staged.data_ptr(), x.numel(), code, staged,
                              target=x if writable else None, staged=staged)
        raise SquallInvalidArgument(
            f"squall: {name} is on device {x.device}; squall takes CPU or CUDA tensors")
    if np is not None and isinstance(x, np.ndarray):
        if x.dtype not in _NUMPY_DTYPES or _NUMPY_DTYPES[x.dtype] not in dtypes:
            allowed = ", ".join(DTYPE_NAMES[d] for d in dtypes)
            raise SquallInvalidArgument(
                f"squall: {name} has dtype {x.dtype}; this operation takes {allowed}")
        if not x.flags.c_contiguous:
            raise SquallInvalidArgument(
                f"squall: {name} is not C-contiguous; pass np.ascontiguousarray(a) and copy "
                "the result back")
        if writable and not x.flags.writeable:
            raise SquallInvalidArgument(f"squall: {name} is read-only")
        return HostBuffer(x.ctypes.data, x.size, _NUMPY_DTYPES[x.dtype], x)
    raise SquallInvalidArgument(
        f"squall: {name} must be a torch.Tensor or a numpy.ndarray, not {type(x).__name__}")


class DeviceBuffer:
    """A CUDA tensor's own memory: ``ptr`` (a device address), ``numel``,
    ``dtype`` (a squallDataType_t). Nothing is staged."""

    __slots__ = ("ptr", "numel", "dtype", "_keep")

    def __init__(self, ptr, numel, dtype, keep):
        self.ptr, self.numel, self.dtype, self._keep = ptr, numel, dtype, keep


def device_buffer(x, name, dtypes, device):
    """Validates a CUDA tensor on `device` (a communicator from NCCL works on
    the tensors of its own GPU only) and returns a DeviceBuffer over it."""
    if not is_tensor(x) or _cuda.device_of(x) != device:
        where = f"on {_cuda.device_of(x)}" if is_tensor(x) else f"a {type(x).__name__}"
        raise SquallInvalidUsage(
            f"squall: {name} is {where}, but this communicator comes from NCCL on {device} and "
            f"reduces CUDA tensors of {device} only; move the tensor there, or use a host "
            "communicator (squall.init() without transport='nccl') for CPU tensors and arrays")
    code = _tensor_dtype(x, name, dtypes)
    return DeviceBuffer(x.data_ptr(), x.numel(), code, x)


def readonly_bytes(data):
    """(pointer, size, keepalive) of a bytes-like object or uint8 tensor/array."""
    if is_tensor(data):
        t = data.detach().contiguous().cpu()
        return t.data_ptr(), t.numel() * t.element_size(), t
    if np is not None and isinstance(data, np.ndarray):
        a = np.ascontiguousarray(data)
        return a.ctypes.data, a.nbytes, a
    b = bytes(data)
    buf = ctypes.create_string_buffer(b, len(b))
    return ctypes.addressof(buf), len(b), buf
