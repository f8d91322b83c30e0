"""An mpi4py program run under libsquall-preload.so (it does not know Squall).

  mpi4py_job.py LIBSQUALL STEP_COUNTS

Eligible calls (fp32 sums) must equal, bit for bit, Squall's compressed
allreduce that this script runs itself through libsquall's C API (ctypes)
with one compressor per gradient, while the arrays live at different
addresses on every rank and every step; ineligible calls must equal numpy's
exact result; communicators made with Dup and Split must work and agree.
"""
import ctypes
import os
import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
lib = ctypes.CDLL(sys.argv[1])
counts = [int(c) for c in sys.argv[2].split(",")]


def check(ok, what):
    if not ok:
        print(f"rank {rank}: FAILED: {what}", flush=True)
        comm.Abort(1)


def sq(result, what):
    if result != 0:
        lib.squallGetLastError.restype = ctypes.c_char_p
        check(False, f"{what}: {lib.squallGetLastError().decode()}")


class Spec(ctypes.Structure):
    _fields_ = [("codec", ctypes.c_int), ("scale", ctypes.c_int), ("blockSize", ctypes.c_uint32)]


def shifted(n, step):
    """An fp32 array of n elements at an address that differs by rank and step."""
    shift = (rank * 7 + step * 3) % 16
    return np.empty(n + 16, dtype=np.float32)[shift:shift + n]


# The reference: Squall's compressed allreduce over its own communicator.
ref = ctypes.c_void_p()
world = MPI.COMM_WORLD.Dup()
handle = ctypes.c_void_p(MPI._addressof(world))
sq(lib.squallCommInitFromMpi(ctypes.byref(ref), handle, None), "squallCommInitFromMpi")
spec = Spec()
# The interposer's code: SQUALL_PRELOAD_CODEC, or its default.
code = os.environ.get("SQUALL_PRELOAD_CODEC", "int4:block=256").encode()
sq(lib.squallCodecSpecParse(code, ctypes.byref(spec)), "squallCodecSpecParse")
compressors = []
lib.squallCompressorCreateAt.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
                                         ctypes.c_void_p, ctypes.c_void_p]
for t, n in enumerate(counts):
    c = ctypes.c_void_p()
    # The interposer puts each call's codec blocks on the step's.
    phase = sum(counts[:t]) % spec.blockSize if spec.blockSize else 0  # 0: a code without blocks
    sq(lib.squallCompressorCreateAt(ref, ctypes.c_size_t(n), ctypes.c_size_t(phase),
                                    ctypes.byref(spec), ctypes.byref(c)),
       "squallCompressorCreateAt")
    # As the interposer's compressors: the fewest bytes, and int8 for the
    # two-phase all-gather behind int2 and int4 (SQUALL_PRELOAD_GATHER_CODEC=auto).
    lib.squallCompressorSetAlgorithm.argtypes = [ctypes.c_void_p, ctypes.c_int]
    sq(lib.squallCompressorSetAlgorithm(c, 0), "squallCompressorSetAlgorithm")  # Bytes
    if spec.codec in (5, 6):  # squallCodecInt2, squallCodecInt4
        wide = Spec()
        sq(lib.squallCodecSpecParse(b"int8", ctypes.byref(wide)), "squallCodecSpecParse")
        sq(lib.squallCompressorSetGatherCodec(c, ctypes.byref(wide)),
           "squallCompressorSetGatherCodec")
    compressors.append(c)

rng = np.random.default_rng(rank)
for step in range(8):
    for t, n in enumerate(counts):
        x = shifted(n, step)
        x[:] = rng.standard_normal(n).astype(np.float32)
        expect = np.empty(n, dtype=np.float32)
        sq(lib.squallCompressedAllReduce(x.ctypes.data_as(ctypes.c_void_p),
                                         expect.ctypes.data_as(ctypes.c_void_p), 0, 0,
                                         compressors[t], ref), "squallCompressedAllReduce")
        if t % 2 == 0:
            y = shifted(n, step + 1)
            comm.Allreduce(x, y, op=MPI.SUM)
        else:
            y = x
            comm.Allreduce(MPI.IN_PLACE, y, op=MPI.SUM)
        check(np.array_equal(y.view(np.uint32), expect.view(np.uint32)),
              f"step {step} tensor {t}: differs from the compressed reference")
for c in compressors:
    lib.squallCompressorDestroy(c)
lib.squallCommDestroy(ref)
world.Free()

# Ineligible calls: exact.
ints = np.arange(1000, dtype=np.int32) + rank
out = np.empty_like(ints)
comm.Allreduce(ints, out, op=MPI.SUM)
check(np.array_equal(out, sum(np.arange(1000, dtype=np.int32) + r for r in range(size))), "int32 sum")
d = np.arange(30000, dtype=np.float64) * (rank + 1)
dout = np.empty_like(d)
comm.Allreduce(d, dout, op=MPI.SUM)
check(np.array_equal(dout, np.arange(30000, dtype=np.float64) * (size * (size + 1) // 2)), "float64 sum")
f = np.arange(30000, dtype=np.float32) + rank
fout = np.empty_like(f)
comm.Allreduce(f, fout, op=MPI.MAX)
check(np.array_equal(fout, np.arange(30000, dtype=np.float32) + size - 1), "float32 max")
small = np.full(64, rank + 1, dtype=np.float32)
sout = np.empty_like(small)
comm.Allreduce(small, sout, op=MPI.SUM)
check(np.array_equal(sout, np.full(64, size * (size + 1) // 2, dtype=np.float32)), "small float32 sum")
check(comm.allreduce(rank, op=MPI.SUM) == size * (size - 1) // 2, "pickled allreduce")

# Communicators Open MPI makes: each member ends with the same bytes.
for sub in (comm.Dup(), comm.Split(rank % 2, rank)):
    x = np.random.default_rng(100 + rank).standard_normal(20000).astype(np.float32)
    y = np.empty_like(x)
    sub.Allreduce(x, y, op=MPI.SUM)
    first = sub.bcast(y, root=0)
    check(np.array_equal(first.view(np.uint32), y.view(np.uint32)), "ranks disagree on a subcommunicator")
    sub.Free()
if rank == 0:
    print(f"mpi4py_job: ok on {size} ranks", flush=True)
