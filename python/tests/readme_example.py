#!/usr/bin/env python3
"""Runs README.md's Python example as a user would: saved as train.py and
started by torchrun on 2 ranks, with the interpreter running this script.

    readme_example.py [--import-first squall|torch]

With --import-first squall a first line `import squall` makes squall the
first import (squallrun's workers import it first too); the example itself
imports torch first. Exits non-zero, with the ranks' output, when it fails.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import _dist

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def example():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    m = re.search(r"```python\n(.*?)```", text, re.S)
    if m is None:
        raise SystemExit("readme_example: README.md has no Python block")
    return m.group(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--import-first", choices=("squall", "torch"), default="torch")
    args = ap.parse_args()
    code = example()
    if args.import_first == "squall":
        code = "import squall  # before torch\n" + code
    with tempfile.TemporaryDirectory(prefix="squall-readme-") as tmp:
        script = os.path.join(tmp, "train.py")
        with open(script, "w") as f:
            f.write(code)
        env = dict(os.environ, **_dist.ENV)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(_dist.free_port()), script]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=tmp)
        out = r.stdout + r.stderr
        if r.returncode != 0 or out.count("'bytes_sent'") < 2:  # print(opt.stats) on each rank
            print(out)
            raise SystemExit(f"readme_example: torchrun exited {r.returncode} "
                             f"({args.import_first} imported first)")
        print(f"readme_example: 2 ranks finished, {args.import_first} imported first")


if __name__ == "__main__":
    main()
