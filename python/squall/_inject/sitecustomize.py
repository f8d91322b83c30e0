"""Installed by squallrun on PYTHONPATH: patches torch (squall/_patch.py) in
every process of the job the moment it imports torch, then runs the
sitecustomize this one hides, if any.

Every process, not only those a launcher gave a rank: Lightning, Accelerate's
notebook_launcher and torch.multiprocessing.spawn start the ranks themselves,
and with Lightning the first rank is the process squallrun started, which
has no RANK when it begins. A process that never imports torch (a launcher's
shell, pip) pays nothing: the patches wait for torch's import."""

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


def _patch_torch():
    from squall import _patch

    _patch.install()


class _AfterTorch:
    """A finder that answers nothing itself: when `torch` is first looked for,
    it asks the other finders, and makes the loader they return run the
    patches once torch's own import has finished."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # once, and no recursion below
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch_torch()

        spec.loader.exec_module = exec_module  # this module's loader only
        return spec


try:
    _chain()
finally:
    if os.environ.get("SQUALL_RUN_CONFIG"):
        if "torch" in sys.modules:  # imported by a chained sitecustomize
            _patch_torch()
        else:
            sys.meta_path.insert(0, _AfterTorch())
