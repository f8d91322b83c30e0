#!/usr/bin/env python3
"""The layering check on small made-up trees: each rule must reject what it forbids."""
import pathlib
import subprocess
import sys
import tempfile

CHECK = pathlib.Path(__file__).with_name("check_layers.py")

CASES = [
    # (file, include, should pass)
    ("src/codec/a.cc", "src/common/status.h", True),
    ("src/codec/a.cc", "src/coll/communicator.h", False),   # upward
    ("src/coll/a.cc", "squall/squall.h", False),            # public header below core
    ("src/core/a.cc", "squall/squall.h", True),
    ("src/core/a.cc", "plugin/nccl/net.h", False),          # src/ never includes plugins
    ("src/common/a.h", "plugin/preload/policy.h", False),
    ("plugin/nccl/a.cc", "src/core/comm.h", True),          # plugins see core and below
    ("plugin/nccl/a.cc", "src/transport/tcp/connection.h", True),
    ("plugin/nccl/a.cc", "plugin/nccl/abi/net_v11.h", True),
    ("plugin/nccl/a.cc", "plugin/preload/policy.h", False),  # no plugin includes another
    ("plugin/preload/a.cc", "plugin/nccl/net.h", False),
    ("plugin/preload/a.cc", "squall/squall.h", True),
    ("src/transport/nccl/a.cc", "nccl.h", True),            # only the NCCL room names NCCL
    ("src/coll/device/a.cu", "nccl.h", False),
    ("src/core/a.cc", "nccl.h", False),
    ("plugin/preload/a.cc", "nccl.h", False),
]


def run(tree: pathlib.Path) -> int:
    return subprocess.run([sys.executable, str(CHECK), str(tree)],
                          capture_output=True, text=True).returncode


def main() -> int:
    failures = 0
    for path, inc, ok in CASES:
        with tempfile.TemporaryDirectory() as d:
            root = pathlib.Path(d)
            (root / "src").mkdir()
            f = root / path
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(f'#include "{inc}"\n')
            got = run(root) == 0
            if got != ok:
                failures += 1
                print(f"FAIL: {path} including {inc}: expected {'ok' if ok else 'rejected'}")
    print(f"{len(CASES) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
