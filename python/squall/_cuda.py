"""The torch.cuda calls of the GPU path, in one place.

Everything that asks torch about devices and streams goes through these
functions, so the dispatch logic can be tested on machines without a GPU
(python/tests/test_gpu_dispatch.py replaces them).
"""

import contextlib

from . import _lib
from ._lib import SquallUnsupported

torch = _lib.optional_torch()


def device_of(t):
    """The torch.device of a tensor."""
    return t.device


def is_cuda(t):
    return device_of(t).type == "cuda"


def current_device(what):
    """The current CUDA device as a torch.device; SquallUnsupported, saying
    what is missing, when torch has no CUDA or sees no GPU."""
    if torch is None:
        raise SquallUnsupported(f"{what} needs torch (a CUDA build)")
    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            why = (f"this torch ({torch.__version__}) was built without CUDA: install a CUDA "
                   "build of torch")
        else:
            why = (f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU: check "
                   "nvidia-smi and CUDA_VISIBLE_DEVICES")
        raise SquallUnsupported(
            f"{what} needs a GPU through a CUDA build of torch; {why}. Without a GPU, use a host "
            "transport (squall.init() without transport='nccl'), which also takes CUDA tensors "
            "(staged through host memory)")
    return torch.device("cuda", torch.cuda.current_device())


def current_stream(device):
    """The raw cudaStream_t (an int; 0 is the legacy default stream) of the
    current torch stream of `device`."""
    return torch.cuda.current_stream(device).cuda_stream


def device_guard(device):
    """A context in which `device` is the current CUDA device (nothing for None)."""
    return torch.cuda.device(device) if device is not None else contextlib.nullcontext()


def zeros(n, dtype, device):
    """n zeros of `dtype` on `device` (None: the host)."""
    return torch.zeros(n, dtype=dtype, device=device)


def synchronize(device):
    """Waits for all work on `device`."""
    torch.cuda.synchronize(device)
