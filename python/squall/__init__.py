"""Squall: error-compensated 1-bit collectives for slow networks (Python binding).

Pure ctypes over libsquall; see docs/python.md.
"""

from . import codec
from ._comm import (Communicator, Compressor, Request, allreduce, get_default, get_unique_id,
                    init, set_default, shutdown)
from ._lib import (HAVE_GPU, HAVE_OPTIM, SquallCorruptData, SquallError, SquallInProgress,
                   SquallInternalError, SquallInvalidArgument, SquallInvalidUsage,
                   SquallOutOfMemory, SquallRemoteError, SquallSystemError, SquallTimeout,
                   SquallUnsupported, version)
from ._lib import path as library_path

__version__ = "0.1.0"

__all__ = [
    "Communicator", "Compressor", "Request", "allreduce", "codec", "get_default",
    "get_unique_id", "init", "set_default", "shutdown", "version", "library_path", "HAVE_OPTIM",
    "HAVE_GPU", "SquallError", "SquallInvalidArgument", "SquallInvalidUsage", "SquallUnsupported",
    "SquallOutOfMemory", "SquallCorruptData", "SquallSystemError", "SquallRemoteError",
    "SquallTimeout", "SquallInternalError", "SquallInProgress",
]
