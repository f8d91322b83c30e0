"""Codec helpers: encode/decode single buffers (thin over squallEncode/Decode).

    spec = squall.codec.parse_codec("onebit:block=4096")
    r = squall.codec.Residual(x.numel())          # error feedback, optional
    wire = squall.codec.encode(x, "onebit", residual=r)   # bytes
    y = squall.codec.decode(wire)                 # numpy float32 array
"""

import ctypes

from . import _lib
from ._buffers import FLOATS, host_buffer, readonly_bytes
from ._lib import CodecSpec, SquallInvalidArgument, check, lib

try:
    import numpy as np
except ImportError:  # pragma: no cover
    np = None

_NAMES = {_lib.CODEC_NONE: "none", _lib.CODEC_ONEBIT: "onebit", _lib.CODEC_FP16: "fp16",
          _lib.CODEC_BF16: "bf16", _lib.CODEC_INT8: "int8", _lib.CODEC_INT2: "int2",
          _lib.CODEC_INT4: "int4"}
_INTEGER = (_lib.CODEC_INT2, _lib.CODEC_INT4, _lib.CODEC_INT8)


def parse_codec(codec):
    """A CodecSpec from text ("onebit", "onebit:block=4096", "onebit:scale=rms",
    "int2", "int4", "int8:block=256", "fp16", "bf16", "none") or a CodecSpec."""
    if isinstance(codec, CodecSpec):
        return CodecSpec(codec.codec, codec.scale, codec.blockSize)
    if not isinstance(codec, str):
        raise SquallInvalidArgument(f"squall: a codec is a string like 'onebit', not {codec!r}")
    spec = CodecSpec()
    check(lib.squallCodecSpecParse(codec.encode(), ctypes.byref(spec)), f"codec {codec!r}")
    return spec


def codec_string(spec):
    """The canonical text of a CodecSpec (parse_codec(codec_string(s)) == s)."""
    name = _NAMES.get(spec.codec, str(spec.codec))
    if spec.codec == _lib.CODEC_ONEBIT:
        text = f"onebit:block={spec.blockSize}"
        return text + (":scale=rms" if spec.scale == _lib.SCALE_RMS else "")
    if spec.codec in _INTEGER:
        return f"{name}:block={spec.blockSize}"
    return name


def encoded_size(codec, count):
    """Exact size in bytes of `count` elements encoded with `codec`."""
    spec = parse_codec(codec)
    n = ctypes.c_size_t()
    check(lib.squallEncodedSize(ctypes.byref(spec), int(count), ctypes.byref(n)))
    return n.value


class Residual:
    """Error-feedback state of one buffer of `count` elements."""

    def __init__(self, count):
        h = ctypes.c_void_p()
        check(lib.squallResidualCreate(int(count), ctypes.byref(h)), "squallResidualCreate")
        self._h, self.count = h, int(count)

    @property
    def handle(self):
        if self._h is None:
            raise _lib.SquallInvalidUsage("squall: the residual was closed")
        return self._h

    def reset(self):
        check(lib.squallResidualReset(self.handle))

    def read(self):
        """The current values as a numpy float32 array."""
        out = np.empty(self.count, dtype=np.float32)
        check(lib.squallResidualRead(self.handle, out.ctypes.data, self.count))
        return out

    def write(self, values):
        a = np.ascontiguousarray(np.asarray(values, dtype=np.float32).reshape(-1))
        check(lib.squallResidualWrite(self.handle, a.ctypes.data, a.size), "squallResidualWrite")

    @property
    def skipped(self):
        v = ctypes.c_uint64()
        check(lib.squallResidualGetSkipped(self.handle, ctypes.byref(v)))
        return v.value

    def close(self):
        if self._h is not None:
            h, self._h = self._h, None
            lib.squallResidualDestroy(h)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def encode(x, codec="onebit", residual=None):
    """Encodes a tensor/array (fp32, fp16 or bf16) and returns the bytes."""
    spec = parse_codec(codec)
    buf = host_buffer(x, "input", FLOATS, writable=False)
    if residual is not None and residual.count != buf.numel:
        raise SquallInvalidArgument(
            f"squall: the residual holds {residual.count} elements, the input {buf.numel}")
    cap = encoded_size(spec, buf.numel)
    out = ctypes.create_string_buffer(max(cap, 1))
    written = ctypes.c_size_t()
    check(lib.squallEncode(ctypes.byref(spec), buf.ptr, buf.dtype, buf.numel,
                           residual.handle if residual is not None else None, out, cap,
                           ctypes.byref(written)), "squallEncode")
    return out.raw[:written.value]


def inspect(data):
    """(codec text, element count) of an encoded buffer."""
    ptr, size, _keep = readonly_bytes(data)
    spec, count = CodecSpec(), ctypes.c_size_t()
    check(lib.squallEncodedInspect(ptr, size, ctypes.byref(spec), ctypes.byref(count)),
          "squallEncodedInspect")
    return codec_string(spec), count.value


def decode(data, out=None, accumulate=False):
    """Decodes into `out` (an fp32 tensor/array; default: a new numpy array).
    accumulate=True adds the decoded values into `out` instead."""
    ptr, size, _keep = readonly_bytes(data)
    if out is None:
        _, count = inspect(data)
        out = np.zeros(count, dtype=np.float32)
    dst = host_buffer(out, "out", (_lib.FLOAT32,), stage_in=accumulate)
    fn = lib.squallDecodeAccumulate if accumulate else lib.squallDecode
    check(fn(ptr, size, dst.ptr, dst.numel), "squallDecode")
    dst.finish()
    return out


def implementation():
    """The CPU codec implementation in use: 'scalar', 'avx2' or 'avx512'."""
    return lib.squallCodecImplementation().decode()
