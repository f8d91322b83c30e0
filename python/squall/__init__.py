"""Squall: error-compensated 1-bit collectives for slow networks (Python binding).

Pure ctypes over libsquall; see docs/python.md. ``squall.optim``,
``squall.ddp`` and ``squall.advise`` need torch and are imported on first
use, so ``import squall`` works without it.
"""

import importlib

from . import codec
from ._comm import (Communicator, Compressor, Request, allreduce, get_default, get_unique_id,
                    init, set_default, shutdown)
from ._lib import (HAVE_GPU, HAVE_OPTIM, SquallCorruptData, SquallError, SquallInProgress,
                   SquallInternalError, SquallInvalidArgument, SquallInvalidUsage,
                   SquallOutOfMemory, SquallRemoteError, SquallSystemError, SquallTimeout,
                   SquallUnsupported, version)
from ._lib import path as library_path

# One version, one format: the binding's, which `squall.version()` (the
# loaded library's) matches when both come from the same release.
__version__ = "0.1.0"

_LAZY = ("optim", "ddp", "advise", "run", "lightning")


def __getattr__(name):
    if name in _LAZY:
        module = importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module 'squall' has no attribute {name!r}")


__all__ = [
    "Communicator", "Compressor", "Request", "allreduce", "codec", "get_default",
    "get_unique_id", "init", "set_default", "shutdown", "version", "library_path", "HAVE_OPTIM",
    "HAVE_GPU", "SquallError", "SquallInvalidArgument", "SquallInvalidUsage", "SquallUnsupported",
    "SquallOutOfMemory", "SquallCorruptData", "SquallSystemError", "SquallRemoteError",
    "SquallTimeout", "SquallInternalError", "SquallInProgress", "optim", "ddp", "advise",
    "lightning",
]
