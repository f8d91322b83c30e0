"""squallrun runs an unmodified script (plain_train.py) under torchrun on 4
ranks: the optimizer is replaced or the DDP hook registered, and every rank
ends with the same parameters."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
import torch

import _dist

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
WORLD = 4


def _torchrun():
    exe = shutil.which("torchrun")
    return [exe] if exe else None


def _squallrun(options, kind, steps, tmp):
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, SQUALL_RUN_REPORT=tmp, **_dist.ENV)
    # Debian's torchrun (torch 1.13, Python 3.11) crashes at start without --redirects/--tee.
    cmd = [sys.executable, "-m", "squall.run"] + options + [
        "--", *_torchrun(), "--standalone", "--nproc_per_node", str(WORLD), "--redirects", "2",
        "--tee", "2", os.path.join(HERE, "plain_train.py"), tmp, kind, str(steps)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=150, cwd=tmp)
    if r.returncode != 0 and "Address already in use" in r.stdout + r.stderr:
        # torchrun --standalone picks its store's port by binding and closing
        # it; another socket can take the port before the workers bind it.
        # That race is torchrun's, so the run is retried once.
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=150, cwd=tmp)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    results = [torch.load(os.path.join(tmp, f"rank{k}.pt")) for k in range(WORLD)]
    for k, res in enumerate(results):
        with open(os.path.join(tmp, f"squallrun-rank{k}.json")) as f:
            res["report"] = json.load(f)
    return r.stdout, results


@pytest.mark.skipif(_torchrun() is None, reason="torchrun is not installed")
@pytest.mark.parametrize("options,kind,expected", [
    (["--optimizer", "apmsqueeze", "--warmup", "3"], "adamw", "squall.optim.APMSqueeze"),
    (["--hook", "onebit", "--warmup", "2"], "sgd", "torch.optim.sgd.SGD"),
])
def test_squallrun_unmodified_script(options, kind, expected):
    tmp = tempfile.mkdtemp(prefix="squallrun-")
    try:
        out, results = _squallrun(options, kind, 6, tmp)
        first = [line for line in out.splitlines() if line.startswith("squallrun:")]
        assert len(first) == 1, out
        assert ("APMSqueeze" if kind == "adamw" else "onebit_hook") in first[0]
        for r in results:
            assert r["optimizer"] == expected, r["optimizer"]
            assert all(torch.equal(a, b) for a, b in zip(r["params"], results[0]["params"]))
            if kind == "adamw":
                assert r["report"]["optimizers"] == 1, r["report"]
            else:  # 6 iterations, 2 of warmup: the other 4 compressed every bucket
                assert r["report"]["ddp_hooks"] == 1 and r["report"]["compressed_buckets"] >= 4
                assert r["report"]["bytes_sent"] > 0, r["report"]
                # the script's SGD(momentum=0.9), found by the hook: compressed momentum
                assert r["report"]["hook_momentum"] == [0.9], r["report"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_squallrun_refuses_conflicting_options():
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    r = subprocess.run([sys.executable, "-m", "squall.run", "--optimizer", "apmsqueeze",
                        "--slowmo", "8", "--", "true"], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode != 0 and "exclude each other" in r.stderr


def test_squallrun_preload():
    from squall import run

    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    r = subprocess.run([sys.executable, "-m", "squall.run", "--preload", "--", "env"],
                       capture_output=True, text=True, env=env, timeout=60)
    lib = run._preload_library()
    if lib is None:  # this build has no interposer: said so, nothing run
        assert r.returncode != 0 and "libsquall-preload-nccl.so is not next to" in r.stderr
    else:
        assert r.returncode == 0 and f"LD_PRELOAD={lib}" in r.stdout, r.stderr
        assert r.stdout.startswith("squallrun: LD_PRELOAD=libsquall-preload-nccl.so")


@pytest.mark.parametrize("options,kind", [(["--hook", "onebit", "--warmup", "2"], "sgd"),
                                          (["--slowmo", "4"], "adamw")])
def test_squallrun_patches_ranks_a_script_spawns(options, kind):
    """torch.multiprocessing.spawn makes the ranks: no process has a RANK when
    it starts, and each is patched all the same (the communicator is made
    when each creates its process group, a point they all reach)."""
    tmp = tempfile.mkdtemp(prefix="squallrun-spawn-")
    try:
        train = os.path.join(os.path.dirname(PYTHON_DIR), "tests",
                             "frameworks", "train.py")
        env = dict(os.environ, PYTHONPATH=PYTHON_DIR, SQUALL_RUN_REPORT=tmp, **_dist.ENV)
        env.pop("RANK", None)
        r = subprocess.run([sys.executable, "-m", "squall.run", *options, "--", sys.executable,
                            train, "spawn", kind, "8", tmp, str(_dist.free_port())],
                           capture_output=True, text=True, env=env, timeout=150, cwd=tmp)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        reports = [json.load(open(os.path.join(tmp, f"squallrun-rank{k}.json"))) for k in (0, 1)]
        ranks = [json.load(open(os.path.join(tmp, f"rank{k}.json"))) for k in (0, 1)]
        assert ranks[0]["params"] == ranks[1]["params"]  # 8 steps: SlowMo's tau 4 ends synced
        for rep in reports:
            if kind == "sgd":
                assert rep["ddp_hooks"] == 1 and rep["compressed_buckets"] >= 6, rep
            else:
                assert rep["slowmo_optimizers"] == 1, rep
        assert sorted(os.listdir(tmp)).count("squallrun-rank0.json") == 1  # not the parent's
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_squallrun_slowmo_stream_option():
    from squall import run

    ok = run._parser().parse_args(["--slowmo", "50", "--slowmo-stream", "5:4", "--", "true"])
    config, said = run.plan(ok)
    assert config["slowmo_stream"] == (5, 4)
    assert "SlowMo(tau=50, fragments=5, delay=4)" in said
    for options, why in ((["--slowmo-stream", "5:4"], "give --slowmo"),
                         (["--slowmo", "4", "--slowmo-stream", "5:1"], "FRAGMENTS must"),
                         (["--slowmo", "4", "--slowmo-stream", "2:4"], "FRAGMENTS must"),
                         (["--slowmo", "4", "--slowmo-stream", "2"], "FRAGMENTS:DELAY")):
        with pytest.raises(SystemExit, match=why):
            run.plan(run._parser().parse_args(options + ["--", "true"]))


def test_squallrun_fsdp_gather_options():
    from squall import run

    ok = run._parser().parse_args(["--hook", "onebit", "--fsdp-params", "int4:block=256",
                                   "--", "true"])
    config, said = run.plan(ok)
    assert config["fsdp_params"] == "int4:block=256" and not config["fsdp_no_reuse"]
    assert "parameter all-gathers (int4:block=256)" in said
    again = run._parser().parse_args(["--hook", "onebit", "--fsdp-params", "int8",
                                      "--fsdp-no-reuse", "--", "true"])
    config, said = run.plan(again)
    assert config["fsdp_no_reuse"] and "(int8, gathered again in backward)" in said
    for options, why in ((["--fsdp-params", "int8"], "give both"),
                         (["--hook", "onebit", "--fsdp-no-reuse"], "give --fsdp-params"),
                         (["--hook", "onebit", "--fsdp-params", "int9"], "--fsdp-params int9")):
        with pytest.raises(SystemExit, match=why):
            run.plan(run._parser().parse_args(options + ["--", "true"]))
