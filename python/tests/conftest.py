import os
import sys

# Import the package from this checkout (python/squall) unless told otherwise.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))
sys.path.insert(0, _HERE)

# SQUALL_TEST_IMPORT_FIRST=squall|torch: the order in which this process
# first imports the two, before any test runs. Importing squall must never
# change which NCCL or CUDA runtime torch gets, in either order.
_FIRST = os.environ.get("SQUALL_TEST_IMPORT_FIRST")
if _FIRST == "squall":
    import squall  # noqa: F401,E402
    import torch  # noqa: F401,E402
elif _FIRST == "torch":
    import torch  # noqa: F401,E402
    import squall  # noqa: F401,E402
elif _FIRST:
    raise SystemExit(f"SQUALL_TEST_IMPORT_FIRST={_FIRST}: expected squall or torch")
