"""Every code block of docs/python.md and README.md runs as written.

Python blocks run in order, in one namespace per document, on two ranks (a
torchrun-like environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
after defining the names the prose assumes (`model`, `loss_fn`, `data`, `t`,
`grad`). README's C block is compiled and run against the library. A block
preceded by `<!-- doctest: skip (reason) -->` is skipped, with the reason;
any other block in a language the test cannot run fails it."""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

import pytest
import torch.multiprocessing as mp

import _dist
import squall

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DOCS = {"python.md": os.path.join(ROOT, "docs", "python.md"),
        "README.md": os.path.join(ROOT, "README.md")}
BLOCK = re.compile(r"(?:<!-- doctest: skip \((?P<why>[^)]*)\) -->\n)?```(?P<lang>\w*)\n"
                   r"(?P<code>.*?)```", re.S)

PRELUDE = """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(8, 4)
loss_fn = torch.nn.functional.mse_loss
data = [(torch.randn(5, 8), torch.randn(5, 4)) for _ in range(3)]
t = torch.ones(16)
grad = torch.randn(4096)
"""


def blocks(name):
    with open(DOCS[name]) as f:
        text = f.read()
    out = []
    for m in BLOCK.finditer(text):
        line = text.count("\n", 0, m.start("code"))
        out.append((m.group("lang"), m.group("code"), m.group("why"), line))
    return out


def _rank(rank, world, port, name, tmp, results):
    os.environ.update(_dist.ENV)
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    os.chdir(tmp)
    namespace = {}
    exec(PRELUDE, namespace)
    report = []
    for lang, code, why, line in blocks(name):
        if lang != "python" or why:
            continue
        try:
            exec(compile(code, f"{name}:{line}", "exec"), namespace)
        except Exception:  # noqa: BLE001 - reported below
            report.append(f"{name}:{line}: {traceback.format_exc(limit=3)}")
            break
    with open(os.path.join(tmp, f"{results}{rank}"), "w") as f:
        f.write("\n".join(report) if report else "ok")


@pytest.mark.parametrize("name", sorted(DOCS))
def test_python_blocks_run(name):
    runnable = [b for b in blocks(name) if b[0] == "python" and not b[2]]
    assert runnable, f"{name} has no Python block to run"
    for lang, _, why, line in blocks(name):
        assert lang in ("python", "c") or why, \
            f"{name}:{line}: a {lang or 'plain'} block without a doctest skip reason"
    tmp = tempfile.mkdtemp(prefix="squall-docs-")
    try:
        ctx = mp.start_processes(_rank, args=(2, _dist.free_port(), name, tmp, "result"),
                                 nprocs=2, join=False, start_method="spawn")
        deadline = time.monotonic() + 120
        while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                for p in ctx.processes:
                    p.kill()
                raise AssertionError(f"{name}: the blocks still run after 120 s")
        for r in range(2):
            with open(os.path.join(tmp, f"result{r}")) as f:
                text = f.read()
            assert text == "ok", f"rank {r}: {text}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_readme_c_block_compiles_and_runs():
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    code = [c for lang, c, why, _ in blocks("README.md") if lang == "c" and not why]
    assert len(code) == 1
    includes = [ln for ln in code[0].splitlines() if ln.startswith("#include")]
    body = [ln for ln in code[0].splitlines() if not ln.startswith("#include")]
    program = "\n".join(["#include <stdio.h>", "#include <stdlib.h>"] + includes + [
        "int main(void) {", "  size_t n = 10000;", "  float* grad = calloc(n, sizeof(float));",
        *body, "  free(wire); free(grad); squallResidualDestroy(residual);",
        "  printf(\"ok %zu\\n\", written);", "  return 0;", "}"])
    tmp = tempfile.mkdtemp(prefix="squall-readme-c-")
    try:
        src, exe = os.path.join(tmp, "readme.c"), os.path.join(tmp, "readme")
        with open(src, "w") as f:
            f.write(program)
        libdir = os.path.dirname(squall.library_path)
        r = subprocess.run([cc, "-std=c99", "-Wall", "-Werror", "-o", exe, src,
                            "-I", os.path.join(ROOT, "include"), squall.library_path,
                            f"-Wl,-rpath,{libdir}"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, program + "\n" + r.stderr
        r = subprocess.run([exe], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and r.stdout.startswith("ok "), r.stdout + r.stderr
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
