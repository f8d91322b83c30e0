"""What torch 2.x changed under the optimizers: they run under -W error
(torch 2.x warns when its deprecated torch.distributed.reduce_op is read),
and squallrun's Adam replacement takes torch 2.x's decoupled_weight_decay."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)

WARNINGS_ARE_ERRORS = r"""
import warnings
import torch
import torch.distributed as dist
kept = dist.reduce_op  # a live object whose __class__ warns when read
warnings.simplefilter("error")
import squall
from squall.optim import APMSqueeze, SlowMo
with squall.Communicator.from_unique_id(squall.get_unique_id(), 1, 0, transport="tcp") as c:
    p = torch.ones(64, requires_grad=True)
    opt = APMSqueeze([p], lr=0.1, warmup=1, comm=c)
    for _ in range(3):
        p.grad = torch.ones(64)
        opt.step()
    q = torch.ones(8, requires_grad=True)
    slow = SlowMo(torch.optim.SGD([q], lr=0.5), tau=2, comm=c)
    q.grad = torch.ones(8)
    slow.step()
print("ok")
"""

DECOUPLED = r"""
import sys
import torch
p = torch.ones(64, requires_grad=True)
if sys.argv[1] == "decoupled":  # torch 2.x spells AdamW this way too
    opt = torch.optim.Adam([p], lr=0.1, weight_decay=0.01, decoupled_weight_decay=True)
else:
    opt = torch.optim.Adam([p], lr=0.1, weight_decay=0.01)
for _ in range(3):
    p.grad = torch.ones(64)
    opt.step()
print(type(opt).__name__, opt.param_groups[0]["weight_decay"])
"""


def _squallrun_one_rank(tmp_path, variant):
    import _dist

    script = tmp_path / "adam.py"
    script.write_text(DECOUPLED)
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_dist.free_port()), **_dist.ENV)
    return subprocess.run([sys.executable, "-m", "squall.run", "--optimizer", "apmsqueeze",
                           "--warmup", "1", "--", sys.executable, str(script), variant],
                          capture_output=True, text=True, timeout=120, env=env)


def test_squallrun_adam_with_decoupled_weight_decay(tmp_path):
    r = _squallrun_one_rank(tmp_path, "decoupled")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == "APMSqueeze 0.01", r.stdout


def test_squallrun_adam_with_l2_decay_is_refused(tmp_path):
    r = _squallrun_one_rank(tmp_path, "l2")
    assert r.returncode != 0 and "adds the decay to the gradient (L2)" in r.stderr, r.stderr


def _run(code, **env):
    full = dict(os.environ, PYTHONPATH=PYTHON_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""),
                **env)
    return subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True,
                          text=True, timeout=120, env=full)


def test_optimizers_under_warnings_as_errors():
    r = _run(WARNINGS_ARE_ERRORS)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
