"""Installed by squallrun on PYTHONPATH: patches torch in worker processes
(squall/_patch.py), then runs the sitecustomize this one hides, if any."""

import importlib.machinery
import importlib.util
import os
import sys


def _chain():
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if os.path.abspath(entry or ".") == here:
            continue
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return


try:
    _chain()
finally:
    if os.environ.get("SQUALL_RUN_CONFIG") and any(
            v in os.environ for v in ("LOCAL_RANK", "RANK", "SLURM_PROCID",
                                      "OMPI_COMM_WORLD_RANK")):
        from squall import _patch

        _patch.install()
